"""The human experiments as a participant does them: `vlm-decade human serve` on a hand-written
experiment folder of each kind (tests/unit/human_folder.py: two trials and an attention check per
participant), walked in a real headless Chromium through the instructions and the example, typing
descriptions, clicking choices and moving sliders, reloaded mid-way (it goes on at the next trial,
not from the start) to the completion code. Then data/<participant>.json holds exactly the trials
done, once each, with what was typed, clicked and set, and the importer reads the clicks back as
the votes. The same page on a plain static host posts nothing and ends with jsPsych's own local
save of the data, the participant's JSON file in the browser's downloads. And the whole way with no
hand-written file: `human design` on a study, two participants clicking in the browser, `human
import`, and the study's gold standard is the most-clicked description of each image.

Chromium and chromedriver come from the system, as for the view's browser tests.
"""

from __future__ import annotations

import csv
import functools
import json
import threading
import time
from collections import Counter
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from vlm_decade.core.errors import Problems
from vlm_decade.studies import load_study
from vlm_decade.studies.decade.data import load_study_data
from vlm_decade.studies.decade.human.experiment import build_experiment
from vlm_decade.studies.decade.human.importing import Exclusions, read_design, read_sources, sessions, tables

from ..unit.human_folder import COLOURS, TEXTS, write_folder
from ..unit.test_human_import import IMAGES, study_dir  # noqa: F401 (study_dir: the fixture)
from .conftest import vlm_decade
from .test_view_browser import Server, browser, screenshot, wait_for  # noqa: F401 (browser: the fixture)

pytestmark = pytest.mark.e2e

# What the imported study needs to run offline and quickly: a local encoder, few resamples.
RUN_SECTIONS = """encoders:
  - {name: SBERT-SI, backend: sentence-transformers, model_id: sentence-transformers/all-MiniLM-L6-v2}
statistics: {n_resamples: 200, seed: 7}
runtime: {num_cpus: 1}
"""


class Served(Server):
    """`vlm-decade human serve FOLDER --port 0` in a subprocess; `url` (the page) from the line it prints."""

    def __init__(self, folder: Path):
        super().__init__(folder, ("human", "serve"))
        self.url += "/"


@pytest.fixture
def served(tmp_path):
    servers = []

    def serve(experiment: str) -> tuple[Path, Served]:
        folder = write_folder(tmp_path / experiment, experiment)
        servers.append(Served(folder))
        return folder, servers[-1]

    yield serve
    for server in servers:
        server.stop()


def _css(driver, selector: str):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


def _click(driver, selector: str) -> None:
    wait_for(driver, lambda d: _css(d, selector) and _css(d, selector)[0].is_enabled(), selector)
    _css(driver, selector)[0].click()


def _instructions(driver, pages: int = 3) -> None:
    for _ in range(pages):
        _click(driver, "#jspsych-instructions-next")


def _records(folder: Path, participant: str) -> list[dict]:
    path = folder / "data" / f"{participant}.json"
    return json.loads(path.read_text()) if path.is_file() else []


def _wait_saved(folder: Path, participant: str, kind: str, count: int) -> list[dict]:
    """The participant's records once the server holds `count` of `kind`."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        records = _records(folder, participant)
        if sum(r.get("vd_kind") == kind for r in records) >= count:
            return records
        time.sleep(0.1)
    raise AssertionError(f"the server holds no {count} '{kind}' records: {_records(folder, participant)}")


def _design_trials(records: list[dict]) -> dict[int, dict]:
    trials = [r for r in records if r["vd_kind"] in ("describe", "rank", "rate", "attention")]
    assert len({r["vd_trial"] for r in trials}) == len(trials)  # each trial once
    return {r["vd_trial"]: r for r in trials}


def _finished(driver, folder: Path, participant: str) -> list[dict]:
    code = wait_for(driver, lambda d: _css(d, "#vd-completion-code"), "the completion code")[0].text
    assert code == "VD-TEST1234"
    records = _wait_saved(folder, participant, "end", 1)
    assert [r["completion_code"] for r in records if r["vd_kind"] == "end"] == ["VD-TEST1234"]
    assert {r["vd_participant"] for r in records} == {participant}
    assert {r["vd_experiment"] for r in records} == {
        json.loads((folder / "experiment.json").read_text())["experiment_id"]
    }
    return records


class _Logged(SimpleHTTPRequestHandler):
    """A plain static host that notes every request's method and path."""

    seen: list[str] = []

    def log_message(self, format, *args):
        self.seen.append(self.requestline)


def _walk_rate(driver, moves: dict[int, int], shot: Path | None = None) -> None:
    """The instructions, the example and the trials, each slider moved `moves[step]` steps right."""
    from selenium.webdriver.common.keys import Keys

    _instructions(driver)
    for step in range(len(moves)):
        if step == 1:
            _click(driver, "#jspsych-html-button-response-btngroup button")
        slider = wait_for(driver, lambda d: _css(d, "#jspsych-html-slider-response-response"), "the slider")[0]
        # To the right and back when it stays at the minimum: the slider counts only once moved.
        keys = [Keys.ARROW_RIGHT] * moves[step] or [Keys.ARROW_RIGHT, Keys.ARROW_LEFT]
        for key in keys:
            slider.send_keys(key)
        if step == 1 and shot is not None:
            screenshot(driver, shot)
        _click(driver, "#jspsych-html-slider-response-next")


def test_rank_clicked_choices_saved_once_across_a_reload(browser, served, tmp_path):  # noqa: F811
    folder, server = served("rank")
    browser.get(server.url + "?PROLIFIC_PID=alice&p=p002")
    _instructions(browser)
    screenshot(browser, tmp_path / "rank-example.png")
    _click(browser, ".vd-option")  # the example
    _click(browser, "#jspsych-html-button-response-btngroup button")  # Start
    clicks = {}
    # Trial 1 (dog): the second option as shown, whatever it is; then reload.
    shown = [b.get_attribute("data-option") for b in _css(browser, ".vd-option")]
    assert shown == ["dog-2", "boat-1", "dog-1"]
    assert [b.text for b in _css(browser, ".vd-option")] == [TEXTS[o] for o in shown]
    _css(browser, ".vd-option")[1].click()
    clicks[1] = "boat-1"
    _wait_saved(folder, "alice", "rank", 1)
    browser.refresh()
    # Back at trial 2, not at the instructions.
    wait_for(browser, lambda d: _css(d, ".vd-option"), "trial 2 after the reload")
    assert not _css(browser, "#jspsych-instructions-next")
    assert [b.get_attribute("data-option") for b in _css(browser, ".vd-option")] == ["kite-1", "dog-1", "kite-2"]
    _css(browser, ".vd-option")[2].click()
    clicks[2] = "kite-2"
    wait_for(browser, lambda d: "check-2" in [b.get_attribute("data-option") for b in _css(d, ".vd-option")], "3")
    [check] = [b for b in _css(browser, ".vd-option") if b.get_attribute("data-option") == "check-2"]
    check.click()
    clicks[3] = "check-2"
    records = _finished(browser, folder, "alice")
    trials = _design_trials(records)
    assert {t: r["chosen"] for t, r in trials.items()} == clicks
    assert {r["vd_design_participant"] for r in records} == {"p002"}
    assert trials[3]["attention_passed"] is True and trials[3]["vd_kind"] == "attention"
    assert trials[1]["options"] == ["dog-2", "boat-1", "dog-1"] and trials[1]["image_id"] == "dog"
    assert sum(r["vd_kind"] == "example" for r in records) == 1
    # What the importer makes of the saved file: alice's votes are the clicks, as shown.
    problems = Problems()
    ident, design = read_design(folder, problems)
    found = sessions(read_sources(folder / "data" / "alice.json", problems), ident, problems)
    lenient = Exclusions(distractor_rate=1.0, median_rt_ms=0)  # one distractor of two clicked, at test speed
    kind, votes, people = tables(found, design, set(COLOURS), lenient, problems)
    assert not problems and kind == "rank" and [p["kept"] for p in people] == ["yes"]
    assert {int(v["trial"]): (v["shown"], v["chosen"]) for v in votes} == {
        1: ("dog-2;boat-1;dog-1", "boat-1"),
        2: ("kite-1;dog-1;kite-2", "kite-2"),
    }


def test_describe_typed_texts_saved(browser, served, tmp_path):  # noqa: F811
    folder, server = served("describe")
    browser.get(server.url + "?participant=bob&p=p001")
    _instructions(browser)
    typed = {0: "An example.", 1: "A red square on white.", 2: "I see a lantern and grass.", 3: "Green, half covered."}
    for step in range(4):
        if step == 1:
            _click(browser, "#jspsych-html-button-response-btngroup button")  # Start, after the example
        wait_for(browser, lambda d: _css(d, "#input-0"), f"the text box of step {step}")
        if step == 2:
            assert "lantern" in browser.find_element("css selector", ".vd-check").text
            screenshot(browser, tmp_path / "describe-attention.png")
        _css(browser, "#input-0")[0].send_keys(typed[step])
        _click(browser, "#jspsych-survey-text-next")
    trials = _design_trials(_finished(browser, folder, "bob"))
    assert {t: r["text"] for t, r in trials.items()} == {1: typed[1], 2: typed[2], 3: typed[3]}
    assert trials[3]["condition"] == "mask-1" and trials[2]["attention_passed"] is True


def test_rate_slider_values_saved(browser, served, tmp_path):  # noqa: F811
    folder, server = served("rate")
    browser.get(server.url + "?workerId=carol")
    _walk_rate(browser, {0: 1, 1: 3, 2: 1, 3: 2}, shot=tmp_path / "rate.png")  # steps right of the minimum, 1
    records = _finished(browser, folder, "carol")
    trials = _design_trials(records)
    assert {t: r["rating"] for t, r in trials.items()} == {1: 4, 2: 2, 3: 3}
    assert trials[1]["subject"] == "m1" and trials[3]["attention_passed"] is False  # asked for 5, set 3
    # No p= in the address: the server gave carol the first design participant.
    assert {r["vd_design_participant"] for r in records} == {"p001"}


def test_on_a_static_host_jspsych_saves_the_data_locally(browser, tmp_path):  # noqa: F811
    folder = write_folder(tmp_path / "rate", "rate")
    build_experiment(folder)
    host = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Logged, directory=str(folder)))
    threading.Thread(target=host.serve_forever, daemon=True).start()
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    browser.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    try:
        browser.get(f"http://127.0.0.1:{host.server_address[1]}/index.html?participant=dana&p=p002")
        _walk_rate(browser, {0: 1, 1: 4, 2: 0, 3: 4})
        code = wait_for(browser, lambda d: _css(d, "#vd-completion-code"), "the completion code")[0].text
    finally:
        host.shutdown()
        host.server_close()
    assert code == "VD-TEST1234"
    saved = downloads / "vd-dana.json"
    wait_for(browser, lambda d: saved.is_file(), "jsPsych's local save")
    records = json.loads(saved.read_text())
    trials = _design_trials(records)
    assert {t: r["rating"] for t, r in trials.items()} == {1: 5, 2: 1, 3: 5}
    assert trials[3]["attention_passed"] is True
    assert {r["vd_design_participant"] for r in records if "vd_design_participant" in r} == {"p002"}
    assert [r["completion_code"] for r in records if r.get("vd_kind") == "end"] == ["VD-TEST1234"]
    assert not [line for line in _Logged.seen if not line.startswith("GET ")]  # nothing posted


def _shown(driver) -> frozenset:
    """The option ids on screen (empty between trials, and while the page is being replaced)."""
    from selenium.common.exceptions import StaleElementReferenceException

    try:
        return frozenset(b.get_attribute("data-option") for b in _css(driver, ".vd-option"))
    except StaleElementReferenceException:
        return frozenset()


def _rank_session(driver, url: str, design: dict[frozenset, dict]) -> Counter:
    """One participant through a served ranking experiment: in each trial the option ending in
    "-1" when it is one of the image's own, else its own option that sorts last; the clicks' tally."""
    driver.get(url)
    _instructions(driver)
    _click(driver, ".vd-option")  # the example
    _click(driver, "#jspsych-html-button-response-btngroup button")
    clicks, before = Counter(), frozenset()
    for step in range(len(design)):
        wait_for(driver, lambda d, before=before: _shown(d) and _shown(d) != before, f"trial {step + 1}")
        buttons = {b.get_attribute("data-option"): b for b in _css(driver, ".vd-option")}
        before = frozenset(buttons)
        row = design[before]
        own = sorted(o for o in buttons if o not in row["distractors"].split(";"))
        chosen = next((o for o in own if o.endswith("-1")), own[-1])
        buttons[chosen].click()
        clicks[chosen] += 1
    wait_for(driver, lambda d: _css(d, "#vd-completion-code"), "the completion code")
    return clicks


def test_designed_served_clicked_imported_gold_is_the_tally(browser, study_dir, tmp_path):  # noqa: F811
    """The whole way with no hand-written file: `human design` on a study, two participants in the
    browser, `human import`; the study's gold standard is the most-clicked description of each image."""
    study_file, folder = study_dir / "study.yaml", tmp_path / "rank"
    args = ("--shown", "2", "--distractors", "1", "--participants", "2", "--attention", "0", "--out", str(folder))
    made = vlm_decade("human", "design", str(study_file), "rank", *args)
    assert made.returncode == 0, made.stderr
    with open(folder / "design.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    server = Served(folder)
    try:
        tally = Counter()
        for participant in ("p001", "p002"):
            design = {frozenset(r["options"].split(";")): r for r in rows if r["participant"] == participant}
            tally += _rank_session(browser, f"{server.url}?PROLIFIC_PID=w-{participant}&p={participant}", design)
            _wait_saved(folder, f"w-{participant}", "end", 1)  # saved before the browser leaves the page
    finally:
        server.stop()
    imported = vlm_decade(
        "human", "import", str(study_file), "rank", "--experiment", str(folder), "--min-median-rt", "0"
    )
    assert imported.returncode == 0, imported.stderr
    with open(folder / "votes.csv", newline="") as fh:
        votes = list(csv.DictReader(fh))
    assert Counter(v["chosen"] for v in votes) == tally and len(votes) == len(rows)
    study = load_study(study_file)
    data = load_study_data(study.data.model_copy(update={"votes": folder / "votes.csv"}), study.ranking, study.masks)
    gold = {r["image_id"]: r["description_id"] for r in data.references.to_pylist() if r["role"] == "gold"}
    for image in IMAGES:
        mine = {d: n for d, n in tally.items() if d.startswith(f"{image}-")}
        assert mine[gold[image]] == max(mine.values()), (image, gold[image], mine)
    # And Study A runs on them: the run's gold standard is the one the imported votes gave.
    voted = study_dir / "voted.yaml"
    voted.write_text(
        study_file.read_text().replace(
            "descriptions: descriptions.csv}", f"descriptions: descriptions.csv, votes: {folder / 'votes.csv'}}}"
        )
        + RUN_SECTIONS
    )
    ran = vlm_decade("run", str(voted), "--out", str(tmp_path / "run"))
    assert ran.returncode == 0, ran.stderr[-3000:]
    references = pq.read_table(tmp_path / "run" / "references.parquet").to_pylist()
    assert {r["image_id"]: r["description_id"] for r in references if r["role"] == "gold"} == gold
