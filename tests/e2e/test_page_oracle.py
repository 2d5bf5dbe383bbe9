"""The page oracle: every number that the viewer's pages (the gallery, image pages, model pages,
Study B's confusions) and the report's tables print equals the value this test queries itself
from the run's Parquet tables (DuckDB, not the view's queries), at the precision the page prints.

It reads both demo runs and a grouped run of each study: the demo's run folder again with
`analysis.group_by` over a metadata column (and, for Study B, accepted names on some labels), so
only the stages those change run again. Pages are fetched through Starlette's test client and
parsed with the stdlib's html parser; a number on a viewer page (a report table) that no check
read fails the test, so a new number on a page needs its check here. Pages: the gallery, every
model page, the report, five image pages per run, and Study B's confusions (all models and each).
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml
from starlette.testclient import TestClient

from vlm_decade.view.app import create_app
from vlm_decade.view.runs import open_run

from . import oracle_decade, oracle_openworld
from .conftest import vlm_decade
from .oracle import Element, Page, Tables, Tally, unread

pytestmark = pytest.mark.e2e

SAMPLE = 5  # image pages per run


def fetch(app: TestClient, url: str) -> Element:
    answer = app.get(url)
    assert answer.status_code == 200, (url, answer.text[:500])
    return Page(answer.text).root.one("main")


def sample(ids: list[str]) -> list[str]:
    """A fixed sample of SAMPLE ids spread over `ids` (the first and the last among them)."""
    if len(ids) <= SAMPLE:
        return ids
    return [ids[round(k * (len(ids) - 1) / (SAMPLE - 1))] for k in range(SAMPLE)]


def check_run(run: Path, tally: Tally) -> None:
    """Every page the oracle reads of the run folder `run`, Study A's or B's."""
    config = json.loads((run / "manifest.json").read_text())["config"]
    study = oracle_openworld if config.get("study") == "openworld" else oracle_decade
    t = Tables(run)
    app = TestClient(create_app(open_run(run)), base_url="http://127.0.0.1:8765", raise_server_exceptions=True)
    pages = [("gallery", "/", lambda main: study.gallery(main, t, tally, config))]
    for image_id in sample(t.values("SELECT image_id FROM images ORDER BY image_id")):
        url = f"/image/{quote(image_id, safe='')}"
        pages.append(("image", url, lambda main, i=image_id: study.image(main, t, tally, i, config)))
    for model in config["models"]:
        url = f"/model/{quote(model['name'], safe='')}"
        pages.append(("model", url, lambda main, m=model["name"]: study.model(main, t, tally, m, config)))
    pages += study.more_pages(t, tally, config)
    for kind, url, check in pages:
        main = fetch(app, url)
        check(main)
        left = unread(main, study.LITERAL[kind])
        assert not left, f"{url}: numbers no check read: {left}"
        tally.page(kind)
    body = Page((run / "report.html").read_text()).root.one("body")
    study.report(body, t, tally, config)
    tally.page("report")


def grouped_run(demo: Path, out: Path, table: str, edit, n_resamples: int | None = None) -> Path:
    """The demo's run folder `demo` copied to `out/run` and run again with `analysis.group_by:
    [category]`: its inputs table `table` rewritten by `edit(rows)` (adding the column), every other
    input where the demo's run has it, so the stages these leave unchanged are skipped;
    `n_resamples`, when given, instead of the demo's."""
    run = out / "run"
    shutil.copytree(demo, run, ignore=shutil.ignore_patterns(".view"))
    inputs = demo / "inputs"
    study = yaml.safe_load((inputs / "study.yaml").read_text())
    data = study["data"]
    for key, value in data.items():
        if isinstance(value, str) and (inputs / value).exists():
            data[key] = str(inputs / value)
    with open(data[table], newline="", encoding="utf-8") as f:
        rows = edit(list(csv.DictReader(f)))
    data[table] = str(out / f"{table}.csv")
    with open(data[table], "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    for model in study["models"]:
        file = (model.get("options") or {}).get("file")
        if file:
            model["options"]["file"] = str(inputs / file)
    study["analysis"] = {"group_by": ["category"]}
    if n_resamples is not None:
        study["statistics"]["n_resamples"] = n_resamples
    (out / "study.yaml").write_text(yaml.safe_dump(study, sort_keys=False))
    result = vlm_decade("run", str(out / "study.yaml"), "--out", str(run))
    assert result.returncode == 0, result.stderr[-4000:]
    assert "skip responses" in result.stderr  # the models did not run again: the run costs its statistics
    return run


def categories(rows: list[dict]) -> list[dict]:
    """Study A's images in two categories, alternately by id."""
    for k, row in enumerate(sorted(rows, key=lambda r: r["image_id"])):
        row["category"] = "even" if k % 2 == 0 else "odd"
    return rows


# Study B's grouped run: accepted names that its two models' answers hit (the COCO detector says
# "dog", "chair", "bird", "car"), and a category per label.
ACCEPTED = {
    "Bullmastiff": "dog|mastiff",
    "folding chair": "chair",
    "goose": "bird",
    "bald eagle": "bird|eagle",
    "jeep": "car",
    "cat": "Egyptian Mau",
}
ANIMALS = {"cat", "dog", "horse", "frog", "Bullmastiff", "goose", "bald eagle", "spoonbill", "Dalmatian"}


def labelled(rows: list[dict]) -> list[dict]:
    for row in rows:
        row["category"] = "animal" if row["label"] in ANIMALS else "other"
        row["accepted"] = ACCEPTED.get(row["label"], "")
    return rows


def check_and_say(run: Path, name: str, capsys) -> None:
    """`check_run`, then how many numbers it compared per kind of page, in the test's output."""
    tally = Tally()
    check_run(run, tally)
    with capsys.disabled():
        print()
        for line in tally.lines():
            print(f"page oracle, {name}: {line}")


@pytest.mark.parametrize("study", ["decade", "openworld"])
def test_the_demo_pages_print_the_tables_numbers(demo_run, study, capsys):
    check_and_say(demo_run[0] / study, f"demo {study}", capsys)


def test_a_grouped_study_a_run_shows_all_images_and_each_group(demo_run, tmp_path, capsys):
    run = grouped_run(demo_run[0] / "decade", tmp_path, "images", categories)
    check_and_say(run, "grouped decade", capsys)


def test_a_grouped_study_b_run_with_accepted_names(demo_run, tmp_path, capsys):
    # Fewer resamples than the demo's: only the stats stage reads them in Study B.
    run = grouped_run(demo_run[0] / "openworld", tmp_path, "labels", labelled, n_resamples=2000)
    t = Tables(run)
    assert t.values("SELECT DISTINCT group_by FROM stats WHERE group_by IS NOT NULL") == ["category"]
    assert t.values("SELECT count(*) FROM stats WHERE metric = 'TI_accepted'")[0] > 0
    check_and_say(run, "grouped openworld", capsys)
