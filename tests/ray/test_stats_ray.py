"""The bootstrap as Ray tasks gives bit-identical results to the in-process run (uses the session Ray)."""

import time

import numpy as np
import pyarrow as pa
import pytest

from vlm_decade.stats import BootstrapOptions, _engine, bootstrap_study

pytestmark = pytest.mark.ray

ERAS = {"A": "pre-mllm", "B": "mllm", "human:top": "human", "human:bottom": "human"}


def _study(n=60):
    rng = np.random.default_rng(0)
    rows = [
        (s, f"{d}{i}", d, "full", "si", float(rng.normal(0.6, 0.1)))
        for d in ("coco", "csb")
        for s in ERAS
        for i in range(n)
    ]
    return pa.table(list(map(list, zip(*rows))), names=["subject", "image_id", "dataset", "variant", "metric", "value"])


def test_ray_tasks_match_in_process_whatever_the_number_of_tasks(ray_session):
    assert ray_session.is_initialized()
    t = _study()
    local = bootstrap_study(t, ERAS, BootstrapOptions(2300, 7, use_ray=False))
    for k in (2, 5):
        remote = bootstrap_study(t, ERAS, BootstrapOptions(2300, 7, use_ray=True, n_tasks=k))
        assert remote.stats.equals(local.stats)
        assert remote.comparisons.equals(local.comparisons)
    assert local.comparisons.num_rows > 0


def test_poisson_shards_as_ray_tasks_match_in_process(ray_session):
    rng = np.random.default_rng(1)
    v = rng.random((2, 3000))
    m = np.ones_like(v)
    local = _engine.poisson_partial_sums_many({"big": (v, m)}, 700, 3, shard_size=1000, use_ray=False)["big"]
    remote = _engine.poisson_partial_sums_many({"big": (v, m)}, 700, 3, shard_size=1000, use_ray=True)["big"]
    np.testing.assert_array_equal(local[0], remote[0])
    np.testing.assert_array_equal(local[1], remote[1])


def test_workers_started_ahead_take_the_bootstraps_tasks_and_change_no_result(ray_session):
    """`warm_workers` (begun beside Study A's scores stage) starts one worker per CPU by a block of one
    resample; the bootstrap that follows gives what it gives in-process."""
    import ray

    assert _engine.warm_workers(ray_session) == []  # tasks, not actors: nothing for a stage to let go
    t = _study()
    remote = bootstrap_study(t, ERAS, BootstrapOptions(2300, 7, use_ray=True))
    local = bootstrap_study(t, ERAS, BootstrapOptions(2300, 7, use_ray=False))
    assert remote.stats.equals(local.stats) and remote.comparisons.equals(local.comparisons)
    # The warm blocks are not awaited, so one may still be queued or running as the bootstrap
    # ends, and the free CPUs are reported late; they must all come back, not at once.
    deadline = time.monotonic() + 60
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources()["CPU"]:
        assert time.monotonic() < deadline, "the warm blocks still hold CPUs a minute on"
        time.sleep(0.2)


def test_study_as_stats_stage_keeps_its_poisson_shards_and_ends_as_a_fresh_run(ray_session, tmp_path, monkeypatch):
    """Study A's stats stage in Poisson mode (here from any size up): images added at the end of a
    finished run's scores reuse the sums of the shards they leave as they were (kept in
    `.cache/stats-shards.parquet`), and the tables are a fresh run's to the bit."""
    import vlm_decade.stats.analysis as analysis
    from vlm_decade.core.progress import Reporter
    from vlm_decade.core.runfolder import RunFolder
    from vlm_decade.core.runner import StudyRun, given
    from vlm_decade.core.runtime import LazyRay
    from vlm_decade.stats.shard_sums import keep_shard_sums, kept_shard_sums, shard_sums_file
    from vlm_decade.studies import study_from_dict
    from vlm_decade.studies.decade.statistics import stage

    monkeypatch.setattr(analysis, "POISSON_AUTO_IMAGES", 0)
    models = [
        {"name": s, "backend": "imported", "model_id": s, "era": ERAS[s], "options": {"file": "m.csv"}} for s in "AB"
    ]
    data = {"images": "x.csv", "image_dir": str(tmp_path), "descriptions": "d.csv"}
    study = study_from_dict({"name": "shards", "data": data, "models": models, "statistics": {"n_resamples": 100}})
    rng = np.random.default_rng(4)
    n_all = _engine.POISSON_SHARD + 1500
    values = {s: rng.random(n_all) for s in ERAS}

    def scores(n):
        ids = [f"img{i:06d}" for i in range(n)]
        return pa.table(
            {
                "subject": [s for s in ERAS for _ in ids],
                "image_id": ids * len(ERAS),
                "dataset": ["coco"] * (n * len(ERAS)),
                "variant": ["full"] * (n * len(ERAS)),
                "metric": ["si"] * (n * len(ERAS)),
                "value": np.concatenate([values[s][:n] for s in ERAS]),
            }
        )

    def run(folder, n):
        study_run = StudyRun(RunFolder(folder), Reporter(quiet=True), LazyRay(study.runtime))
        study_run.run_stage(given("scores", scores(n)))
        study_run.run_stage(stage(study))
        return {t: study_run.folder.read(t) for t in ("stats", "comparisons")}

    run(tmp_path / "run", _engine.POISSON_SHARD + 500)
    first = kept_shard_sums(tmp_path / "run", "stats").known
    assert len(first) == 2  # the full shard and the 500 images after it
    grown = run(tmp_path / "run", n_all)
    now = kept_shard_sums(tmp_path / "run", "stats").known
    assert len(now) == 2 and len(set(first) & set(now)) == 1  # the full shard's sums kept, the other new
    fresh = run(tmp_path / "fresh", n_all)
    assert grown["stats"].equals(fresh["stats"]) and grown["comparisons"].equals(fresh["comparisons"])
    assert grown["stats"].column("method").to_pylist()[0] == "poisson-percentile"

    # What was kept is what is used: sums tampered with show in the next run's estimates' intervals.
    kept = kept_shard_sums(tmp_path / "run", "stats")
    kept.used = {k: (s * 2, t) for k, (s, t) in kept.known.items()}
    keep_shard_sums(tmp_path / "run", "stats", kept)
    (tmp_path / "run" / "stats.parquet").unlink()  # the stage's table gone: it runs again
    assert shard_sums_file(tmp_path / "run", "stats").is_file()
    again = run(tmp_path / "run", n_all)
    assert not again["stats"].equals(fresh["stats"])


def test_the_error_stats_stage_keeps_its_poisson_shards_in_the_run_folder(ray_session, tmp_path, monkeypatch):
    """The taxonomy's error_stats stage, in Poisson mode: its record is written beside the run's
    tables, a run of the stage again finds every shard in it, and a record that is not the stage's
    own (tampered with) shows in the tables: what is kept is what is used."""
    import vlm_decade.stats.analysis as analysis
    from tests.unit.test_taxonomy_analysis import IMPACT_ERRORS, IMPACT_SIMILARITY, errors_of, similarity_scores
    from vlm_decade.core.progress import Reporter
    from vlm_decade.core.runfolder import RunFolder
    from vlm_decade.core.runner import StudyRun, given
    from vlm_decade.core.runtime import LazyRay
    from vlm_decade.stats.shard_sums import keep_shard_sums, kept_shard_sums
    from vlm_decade.studies import study_from_dict
    from vlm_decade.studies.decade.taxonomy.stages import stages

    monkeypatch.setattr(analysis, "POISSON_AUTO_IMAGES", 0)
    models = [
        {"name": "a", "backend": "openai", "model_id": "gpt-4o-mini", "era": "mllm"},
        {"name": "b", "backend": "openai", "model_id": "gpt-4o", "era": "pre-mllm"},
    ]
    data = {"images": "i.csv", "image_dir": "img", "descriptions": "d.csv"}
    study = study_from_dict(
        {"name": "s", "data": data, "models": models, "taxonomy": {}, "statistics": {"n_resamples": 500}}
    )
    [stage] = [s for s in stages(study, None) if s.name == "error_stats"]
    tables = ("error_stats", "error_comparisons", "impact_stats", "impact_comparisons")

    def run(folder):
        study_run = StudyRun(RunFolder(folder), Reporter(quiet=True), LazyRay(study.runtime))
        study_run.run_stage(given("errors", errors_of(IMPACT_ERRORS)))
        study_run.run_stage(given("scores", similarity_scores(IMPACT_SIMILARITY)))
        study_run.run_stage(stage)
        return {t: study_run.folder.read(t) for t in tables}

    first = run(tmp_path / "run")
    kept = kept_shard_sums(tmp_path / "run", "error_stats")
    assert len(kept.known) >= 3  # the error rates' datasets and the impact's
    assert first["error_stats"].column("method").to_pylist()[0] == "poisson-percentile"

    kept.used = {key: (sums * 2, totals) for key, (sums, totals) in kept.known.items()}
    keep_shard_sums(tmp_path / "run", "error_stats", kept)
    (tmp_path / "run" / "error_stats.parquet").unlink()  # the stage's table gone: it runs again
    assert not run(tmp_path / "run")["error_stats"].equals(first["error_stats"])
