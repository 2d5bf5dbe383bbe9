"""The demo end to end (Study A into OUT/decade, Study B into OUT/openworld): reports from the
runs' tables, no repeated work, resume after SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.figures import AREA, assert_drawn, colour_pixels
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.report.figures import COLOURS

from .conftest import BIN, cli_env, vlm_decade

pytestmark = pytest.mark.e2e

STAGES = (
    "images",
    "references",
    "responses",
    "embeddings",
    "scores",
    "stats",
    "metric_validation",
    "stsb",
    "detections",
    "errors",
    "error_stats",
    "report",
)
TABLES = (
    "images",
    "references",
    "responses",
    "embeddings",
    "scores",
    "stats",
    "comparisons",
    "metric_validation",
    "stsb",
    "detections",
    "errors",
    "spatial",
    "error_stats",
    "error_comparisons",
    "impact_stats",
)
OPENWORLD_STAGES = ("images", "labels", "responses", "scores", "stats", "report")
OPENWORLD_TABLES = ("images", "labels", "responses", "scores", "predictions", "stats")
# Wall-clock columns differ between runs by nature; everything else must be identical.
VOLATILE = {"responses": ["latency_s"]}


def _table(run, name):
    table = RunFolder(run).read(name)
    drop = [c for c in VOLATILE.get(name, []) if c in table.column_names]
    table = table.drop_columns(drop)
    if name == "images":  # absolute paths differ between two run folders
        table = table.drop_columns(["path"])
    return table


def _files(run, name):
    """The files of table `name`: its one file, or its segments (the embeddings)."""
    folder = RunFolder(run)
    return folder.segments(name) if folder.segmented(name) else [folder.table_path(name)]


def _written(run, name):
    """When each file of table `name` was last written."""
    return [(p.name, p.stat().st_mtime_ns) for p in _files(run, name)]


def test_demo_writes_report_and_tables(demo_run):
    root, result = demo_run
    out = root / "decade"
    html = (out / "report.html").read_text()
    manifest = json.loads((out / "manifest.json").read_text())
    assert "Demo data" in html and "not findings" in html
    for name in TABLES:
        assert RunFolder(out).has(name), name
    assert all(manifest["stages"][s]["state"] == "done" for s in STAGES)
    assert manifest["ranking_method"] == {"everyday": "votes", "specialist": "votes"}
    assert "api_key" not in json.dumps(manifest).lower()
    images = pq.read_table(out / "images.parquet")
    assert images.num_rows == 16 and all(len(h) == 64 for h in images.column("sha256").to_pylist())
    # The figure and the report's numbers come from this run's stats table.
    stats = pq.read_table(out / "stats.parquet").to_pylist()
    similarity = out / "figures" / "similarity_SBERT-SI.png"
    assert similarity.stat().st_size > 10_000
    assert "figures/similarity_SBERT-SI.png" in html
    # Both datasets' points (everyday, then specialist: each in its colour) are drawn.
    assert_drawn(similarity)
    assert colour_pixels(similarity, COLOURS[0]) > 100 and colour_pixels(similarity, COLOURS[1]) > 100
    subjects = {r["subject"] for r in stats}
    assert {"ssd-template", "demo-imported", "human:top", "human:bottom"} <= subjects
    for r in stats:
        assert r["ci_low"] <= r["estimate"] <= r["ci_high"]
        assert f"{r['estimate']:.3f}" in html
    responses = pq.read_table(out / "responses.parquet")
    assert responses.num_rows == 2 * 16 * 4  # two models x 16 images x (full + 3 masks)
    assert pc.all(pc.equal(responses.column("status"), "ok")).as_py() and "128 responses, 0 failed." in html
    assert {r["metric"] for r in stats} == {"SBERT-SI", "BERTScore"}
    # The metrics against (simulated) raters, and against STS-B's real human ratings.
    validation = pq.read_table(out / "metric_validation.parquet").to_pylist()
    assert {r["metric"] for r in validation if r["role"] == "metric"} == {"SBERT-SI", "BERTScore"}
    assert (out / "figures" / "metric_validation.png").exists() and "simulated for the demo" in html
    assert_drawn(out / "figures" / "metric_validation.png")
    assert colour_pixels(out / "figures" / "metric_validation.png", COLOURS[0]) > 100  # the metrics' points
    assert "No judge metric is shown: the study configures none" in html  # offline: no API model to judge
    stsb = {(r["metric"], r["subset"]): r for r in pq.read_table(out / "stsb.parquet").to_pylist()}
    assert stsb[("SBERT-SI", "test")]["spearman"] == pytest.approx(0.8203, abs=0.01)
    assert stsb[("SBERT-SI", "test")]["n_pairs"] == 1379 and stsb[("BERTScore", "test_images")]["n_pairs"] == 250


def test_demo_report_shows_the_human_datas_reliability(demo_run):
    # The demo's 12 ranking participants and its raters: the report's numbers are the reliability
    # table's, and the table's stability is the bootstrap's over the votes file read here.
    from vlm_decade.studies.decade.human.reliability import gold_stability, ratings_alpha, vote_matrices
    from vlm_decade.studies.decade.human.stage import N_RESAMPLES, read_votes
    from vlm_decade.studies.decade.metric_validation import load_ratings

    out = demo_run[0] / "decade"
    html = (out / "report.html").read_text()
    config = json.loads((out / "manifest.json").read_text())["config"]
    rows = {(r["dataset"], r["measure"]): r for r in pq.read_table(out / "reliability.parquet").to_pylist()}
    datasets = ("everyday", "specialist", "all")
    measures = ("gold stability", "Krippendorff alpha (interval)")
    assert set(rows) == {(d, m) for d in datasets for m in measures}
    stability, alpha = rows[("all", measures[0])], rows[("all", measures[1])]
    assert stability["participants"] == 12 and stability["items"] == 16 and stability["n_resamples"] == N_RESAMPLES
    full = [r for r in RunFolder(out).read("references").to_pylist() if r["condition"] == "full"]
    own = {}
    for r in full:
        own.setdefault(r["image_id"], []).append(r["description_id"])
    shares = gold_stability(
        vote_matrices(read_votes(config["data"]["votes"]), own),
        N_RESAMPLES,
        config["statistics"]["seed"],
        config["ranking"]["seed"],
    )
    assert stability["value"] == pytest.approx(sum(shares.values()) / len(shares))
    ratings = load_ratings(config["data"]["ratings"], [m["name"] for m in config["models"]], own)
    assert alpha["value"] == pytest.approx(ratings_alpha(ratings.to_pylist()))
    assert "How far the human data can be trusted" in html and "<code>vlm-decade human plan</code>" in html
    assert (
        f"Gold stability {stability['value']:.3f} (16 voted images, 12 participants); the raters' Krippendorff's "
        f"alpha {alpha['value']:.3f} ({alpha['participants']} raters, {alpha['items']} rated pairs)." in html
    )
    for r in rows.values():
        assert f"<td>{r['value']:.3f}</td>" in html, r


def test_demo_error_taxonomy(demo_run):
    """Study A's error analysis: a label with evidence per model, image and error type, rates with
    CIs, the impact figure, heat maps of the masked regions, and the evidence page."""
    out = demo_run[0] / "decade"
    html = (out / "report.html").read_text()
    errors = pq.read_table(out / "errors.parquet").to_pylist()
    assert len(errors) == 2 * 16 * 5  # two models x 16 images x five error types
    assert {r["method"] for r in errors} == {"detector", "masks", "hand"}
    # The demo's hand labels override the automatic ones, and their agreement is reported.
    import csv

    from vlm_decade.demo import DATA_DIR

    with (DATA_DIR / "hand_labels.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    hand = {(r["subject"], r["image_id"], r["error_type"]): r["present"] == "yes" for r in rows}
    notes = {(r["subject"], r["image_id"], r["error_type"]): r["note"] for r in rows}
    assert {
        (r["subject"], r["image_id"], r["error_type"]): r["present"] for r in errors if r["method"] == "hand"
    } == hand
    assert {
        (r["subject"], r["image_id"], r["error_type"]): json.loads(r["evidence"])["hand"]
        for r in errors
        if r["method"] == "hand"
    } == notes
    agreement = pq.read_table(out / "hand_agreement.parquet").to_pylist()
    assert {r["error_type"] for r in agreement} == {t for _, _, t in hand} and "Cohen's kappa" in html
    for r in errors:
        evidence = json.loads(r["evidence"])
        if r["method"] == "detector":
            assert {"relevant", "mentioned", "findings"} <= set(evidence)
            assert bool(evidence["findings"]) == r["present"]
    # The template captioner names every object its detector finds, so it never leaves a detected
    # object out: no scene-understanding errors, by construction.
    assert not any(
        r["present"] for r in errors if r["subject"] == "ssd-template" and r["error_type"] == "scene_understanding"
    )
    rates = {
        (r["subject"], r["dataset"], r["metric"]): r for r in pq.read_table(out / "error_stats.parquet").to_pylist()
    }
    dataset_of = {i["image_id"]: i["dataset"] for i in pq.read_table(out / "images.parquet").to_pylist()}
    for (subject, dataset, error_type), r in rates.items():
        labels = [
            e["present"]
            for e in errors
            if (e["subject"], e["error_type"]) == (subject, error_type)
            and e["present"] is not None
            and dataset_of[e["image_id"]] == dataset
        ]
        assert r["estimate"] == pytest.approx(sum(labels) / len(labels))
        assert r["ci_low"] <= r["estimate"] <= r["ci_high"]
    spatial = pq.read_table(out / "spatial.parquet").to_pylist()
    decided = {r["image_id"] for r in spatial if r["sde"] is not None}
    assert decided and all((out / "figures" / "heatmaps" / f"{i}.png").exists() for i in decided)
    for i in decided:
        assert_drawn(out / "figures" / "heatmaps" / f"{i}.png", min_colours=1000)  # a photo under its tint
    figure = out / "figures" / "error_rates.png"
    assert figure.stat().st_size > 10_000 and "figures/error_rates.png" in html
    assert_drawn(figure)
    # A dataset with a rate of a quarter or more has bars of its colour, not only a legend's patch.
    for colour, dataset in zip(COLOURS, sorted(set(dataset_of.values()))):
        if max((r["estimate"] or 0) for (_, d, _), r in rates.items() if d == dataset) >= 0.25:
            assert colour_pixels(figure, colour) > AREA, dataset
    assert (out / "figures" / "impact.png").exists() and "Error impact" in html
    assert_drawn(out / "figures" / "impact.png")
    evidence_page = (out / "errors.html").read_text()
    assert "errors.html" in html and evidence_page.count("<tr class=") == len(errors)
    # Impact over model-image pairs; a group on fewer than 5 images is shown but never tested.
    impact = pq.read_table(out / "impact_stats.parquet").to_pylist()
    assert impact and all(r["n_pairs"] >= r["n_images"] for r in impact)
    if any(r["subject"].startswith("error:") and (r["estimate"] or 0) > 0.1 for r in impact):
        assert colour_pixels(out / "figures" / "impact.png", "#7f7f7f") > AREA  # the error types' bars
    comparisons = pq.read_table(out / "impact_comparisons.parquet").to_pylist()
    assert comparisons and all((c["p"] is None) == (min(c["n_a"], c["n_b"]) < 5) for c in comparisons)
    assert "Spatial dependence: decided and undecided images" in html and "role cuts" in html


def test_demo_runs_study_b(demo_run):
    """Study B on the 40 labelled photos: the main table from real offline inputs, LI skipped with a note."""
    root, result = demo_run
    out = root / "openworld"
    manifest = json.loads((out / "manifest.json").read_text())
    assert all(manifest["stages"][s]["state"] == "done" for s in OPENWORLD_STAGES)
    predictions = pq.read_table(out / "predictions.parquet").to_pylist()
    assert len(predictions) == 2 * 40 and all(p["LI"] is None and p["outcome"] == "unjudged" for p in predictions)
    stats = {(r["subject"], r["dataset"], r["metric"]): r for r in pq.read_table(out / "stats.parquet").to_pylist()}
    # The ImageNet classifier names 17 of the 20 ImageNet photos exactly (docs/models.md), so its
    # text inclusion on the fine-grained group is at least 17/20.
    assert stats[("efficientnet-lite3-imagenet", "fine-grained", "TI")]["estimate"] >= 0.85
    assert {m for _, _, m in stats} == {"TI", "SS", "CS", "ss@0.5", "ss@0.6", "ss@0.7", "ss@0.8", "ss@0.9", "ss@avg"}
    # each dataset's own rows beside the groups' means of dataset means
    assert {d for _, d, _ in stats} == {"cifar10", "imagenet", "prototypical", "fine-grained", "all"}
    html = (out / "report.html").read_text()
    assert "Per dataset" in html and "SS at thresholds" in html and "Model against model" in html
    for figure in ("openworld_metrics", "openworld_ss_thresholds", "openworld_outcomes"):
        assert_drawn(out / "figures" / f"{figure}.png")
    # Each model's curve of SS shares, in its colour.
    ss = out / "figures" / "openworld_ss_thresholds.png"
    assert colour_pixels(ss, COLOURS[0]) > 100 and colour_pixels(ss, COLOURS[1]) > 100
    assert "Main table" in html and "LI was not computed" in html and "no judge model is configured" in html
    assert "LI skipped" in " ".join(result.stderr.split())


def test_export_of_both_demo_runs_holds_every_response_with_its_scores_labels_and_outcome(demo_run, tmp_path):
    """The tidy export of the real runs: a row per response, each cell the one its table holds."""
    root, _ = demo_run
    for study in ("decade", "openworld"):
        done = vlm_decade("export", str(root / study), "--out", str(tmp_path / f"{study}.parquet"))
        assert done.returncode == 0, done.stderr[-3000:]
    rows = pq.read_table(tmp_path / "decade.parquet").to_pylist()
    assert len(rows) == pq.read_table(root / "decade" / "responses.parquet").num_rows
    by_row = {(r["model"], r["image_id"], r["variant"]): r for r in rows}
    for s in pq.read_table(root / "decade" / "scores.parquet").to_pylist():
        if not s["subject"].startswith("human:"):
            assert by_row[(s["subject"], s["image_id"], s["variant"])][s["metric"]] == s["value"]
    labels = pq.read_table(root / "decade" / "errors.parquet").to_pylist()
    assert labels and all(
        by_row[(e["subject"], e["image_id"], "full")][f"error:{e['error_type']}"] == e["present"] for e in labels
    )
    outcomes = {
        (r["model"], r["image_id"], r["prompt_id"]): r["outcome"]
        for r in pq.read_table(tmp_path / "openworld.parquet").to_pylist()
    }
    predictions = pq.read_table(root / "openworld" / "predictions.parquet").to_pylist()
    assert len(outcomes) == len(predictions) == 2 * 40
    assert all(outcomes[(p["subject"], p["image_id"], p["prompt_id"])] == p["outcome"] for p in predictions)


def test_second_run_does_no_work_and_says_so(demo_run):
    root, _ = demo_run
    studies = ((root / "decade", TABLES), (root / "openworld", OPENWORLD_TABLES))
    before = [{n: _written(out, n) for n in tables} for out, tables in studies]
    again = vlm_decade("demo", "--out", str(root))
    assert again.returncode == 0, again.stderr[-3000:]
    said = " ".join(again.stderr.split())
    for stage in set(STAGES) | set(OPENWORLD_STAGES):
        assert f"skip {stage}" in said, again.stderr
    assert "run " not in again.stderr
    assert before == [{n: _written(out, n) for n in tables} for out, tables in studies]


def test_sigkill_midway_then_rerun_gives_the_same_tables(demo_run_in_place, tmp_path):
    """Study A's responses gone from the shared demo run, the demo run again and killed right after
    the first saved part of them (the run pauses there for the kill: VLM_DECADE_PAUSE_AFTER_PART),
    then run again: both studies' tables equal the uninterrupted run's."""
    root = demo_run_in_place
    clean = {
        (s, n): _table(root / s, n) for s, names in (("decade", TABLES), ("openworld", OPENWORLD_TABLES)) for n in names
    }
    out = root / "decade"
    (out / "responses.parquet").unlink()
    paused = tmp_path / "paused"
    proc = subprocess.Popen(
        [str(BIN / "vlm-decade"), "demo", "--out", str(root)],
        env={**cli_env(), "VLM_DECADE_PAUSE_AFTER_PART": f"responses:{paused}"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 600
    while not paused.exists():
        assert proc.poll() is None, "the demo ended without saving a part of its responses"
        assert time.monotonic() < deadline, "no part of the responses within 10 minutes"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and the local Ray it started
    proc.wait(timeout=30)
    parts = list((out / ".parts" / "responses").glob("part-*.parquet"))
    done = sum(pq.read_metadata(p).num_rows for p in parts)
    total = clean[("decade", "responses")].num_rows
    assert not (out / "responses.parquet").exists() and 0 < done < total  # some, not all, of the work

    resumed = vlm_decade("demo", "--out", str(root))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{done} of {total} already done, kept" in resumed.stderr
    for (study, name), table in clean.items():
        assert _table(root / study, name).equals(table), (study, name)


def test_report_redraws_the_same_page(demo_run, tmp_path):
    import shutil

    run = tmp_path / "decade"
    shutil.copytree(demo_run[0] / "decade", run)
    before = (run / "report.html").read_text()
    (run / "report.html").unlink()
    shutil.rmtree(run / "figures")
    done = vlm_decade("report", str(run))
    assert done.returncode == 0, done.stderr[-2000:]
    assert (run / "report.html").read_text() == before
    assert sorted(p.name for p in (run / "figures").rglob("*.png")) == sorted(
        p.name for p in (demo_run[0] / "decade" / "figures").rglob("*.png")
    )


def test_a_fully_done_rerun_never_starts_ray(demo_run, monkeypatch):
    """In the same run folder (its images' paths are part of what every stage depends on)."""
    from vlm_decade.core import runtime
    from vlm_decade.core.progress import Reporter
    from vlm_decade.demo import demo_studies
    from vlm_decade.studies import pipeline_of

    studies = demo_studies(demo_run[0])

    def no_ray(*args, **kwargs):
        raise AssertionError("a stage asked for Ray on a run with nothing left to do")

    monkeypatch.setattr(runtime, "start_ray", no_ray)
    monkeypatch.setattr(runtime.LazyRay, "start_soon", no_ray)  # nor started ahead, on a thread
    for study in studies:
        pipeline_of(study).run(study, Reporter(quiet=True))


def _damage(path, kind: int) -> None:
    """Four kinds of damage: cut in half, emptied, one value edited (a valid Parquet file), one byte flipped."""
    data = path.read_bytes()
    if kind == 0:
        path.write_bytes(data[: len(data) // 2])
    elif kind == 1:
        path.write_bytes(b"")
    elif kind == 2:
        table = pq.read_table(path)
        column = table.column(0)
        edited = column.to_pylist()
        edited[0] = edited[-1] if len(set(edited)) > 1 else edited[0]
        if edited == column.to_pylist():  # a one-valued column: drop a row instead
            table = table.slice(1)
        else:
            table = table.set_column(0, table.schema.field(0), [edited])
        pq.write_table(table, path)
    else:
        flipped = bytearray(data)
        flipped[len(data) // 3] ^= 0xFF
        path.write_bytes(bytes(flipped))


def test_damaged_tables_parts_and_manifests_are_found_and_redone(demo_run_in_place):
    """Every table of both studies damaged, a damaged part beside them; then the manifests cut short:
    each time the rerun says what it found and ends with the tables of the clean run (the shared
    demo run's folder, damaged in place)."""
    tmp_path = demo_run_in_place
    studies = {"decade": TABLES, "openworld": OPENWORLD_TABLES}
    clean = {(s, n): _table(tmp_path / s, n) for s, names in studies.items() for n in names}

    k = 0
    for study, names in studies.items():
        for name in names:
            _damage(_files(tmp_path / study, name)[0], k % 4)
            k += 1
    bad_part = tmp_path / "decade" / ".parts" / "responses" / f"part-{0:020d}-{'0' * 16}.parquet"
    bad_part.parent.mkdir(parents=True)
    bad_part.write_bytes(b"half a part")
    again = vlm_decade("demo", "--out", str(tmp_path))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "does not match the hash recorded" in again.stderr and "is damaged; discarded" in again.stderr
    for (study, name), table in clean.items():
        assert _table(tmp_path / study, name).equals(table), (study, name)

    for study in studies:
        manifest = tmp_path / study / "manifest.json"
        manifest.write_text(manifest.read_text()[:100])
    rebuilt = vlm_decade("demo", "--out", str(tmp_path))
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    assert rebuilt.stderr.count("could not be read") == 2
    for study in studies:
        assert len(list((tmp_path / study).glob("manifest.json.unreadable-*"))) == 1
    for (study, name), table in clean.items():
        assert _table(tmp_path / study, name).equals(table), (study, name)
