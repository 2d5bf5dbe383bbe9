"""The stage runner skips unchanged stages, reruns changed ones, and writes atomically."""

import pyarrow as pa
import pytest

from vlm_decade.core.config import RuntimeConfig
from vlm_decade.core.fingerprints import table_fingerprint
from vlm_decade.core.progress import Reporter
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.core.runner import Stage, StudyRun
from vlm_decade.core.runtime import LazyRay


def _runner(folder):
    """Runs one stage at a time; returns whether it ran."""
    return StudyRun(folder, Reporter(quiet=True), LazyRay(RuntimeConfig())).run_stage


def _counting_stage(name, inputs, settings, calls, value):
    def compute(run):
        calls.append(name)
        return {name: pa.table({"x": [value]})}

    return Stage(name, inputs, settings, compute)


def test_unchanged_stage_is_skipped_and_changes_flow_downstream(tmp_path):
    run = RunFolder(tmp_path)
    runner = _runner(run)
    calls = []
    assert runner(_counting_stage("a", (), {"k": 1}, calls, 1))
    assert runner(_counting_stage("b", ("a",), {}, calls, 2))
    assert not runner(_counting_stage("a", (), {"k": 1}, calls, 1))
    assert not runner(_counting_stage("b", ("a",), {}, calls, 2))
    assert calls == ["a", "b"]
    # New settings for `a` that change its output: `a` reruns, and so must `b`, whose input changed.
    assert runner(_counting_stage("a", (), {"k": 2}, calls, 5))
    assert runner(_counting_stage("b", ("a",), {}, calls, 2))
    assert calls == ["a", "b", "a", "b"]
    # New settings for `a` with the same output: `b` stays current.
    assert runner(_counting_stage("a", (), {"k": 3}, calls, 5))
    assert not runner(_counting_stage("b", ("a",), {}, calls, 2))
    assert run.read("a").column("x").to_pylist() == [5]


def test_a_stage_that_failed_midway_reruns_and_keeps_the_old_table(tmp_path):
    run = RunFolder(tmp_path)
    runner = _runner(run)
    runner(_counting_stage("a", (), 1, [], 1))

    def boom(run):
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        runner(Stage("a", (), 2, boom))
    assert run.manifest()["stages"]["a"]["state"] == "running"
    assert run.read("a").column("x").to_pylist() == [1]  # never half-written
    assert runner(_counting_stage("a", (), 2, [], 3))
    assert run.manifest()["stages"]["a"]["state"] == "done"


def test_parts_survive_and_are_folded_in(tmp_path):
    run = RunFolder(tmp_path)
    schema = pa.schema([("x", pa.int64())])
    run.append_part("t", pa.table({"x": [1, 2]}))
    run.append_part("t", pa.table({"x": [3]}))
    assert sorted(run.read_parts("t", schema).column("x").to_pylist()) == [1, 2, 3]
    runner = _runner(run)
    runner(Stage("t", (), {}, lambda r: {"t": run.read_parts("t", schema)}))
    assert run.read_parts("t", schema).num_rows == 0
    assert not list(tmp_path.glob(".parts/t/*"))
    assert not list(tmp_path.glob("*.tmp"))


def test_fingerprint_is_content_not_chunking():
    a = pa.table({"x": [1, 2, 3]})
    b = pa.concat_tables([pa.table({"x": [1]}), pa.table({"x": [2, 3]})])
    assert table_fingerprint(a) == table_fingerprint(b)
    assert table_fingerprint(a) != table_fingerprint(pa.table({"x": [1, 2, 4]}))


def test_a_stage_with_unfinished_rows_runs_again_until_they_are_done(tmp_path):
    run = RunFolder(tmp_path)
    runner = _runner(run)
    attempts = []

    def compute(r):
        attempts.append(1)
        status = ["ok", "error", "skipped"] if len(attempts) == 1 else ["ok", "ok", "ok"]
        return {"t": pa.table({"status": status})}

    assert runner(Stage("t", (), {}, compute))
    record = run.manifest()["stages"]["t"]
    assert record["state"] == "incomplete" and record["unfinished"] == {"t": {"error": 1, "skipped": 1}}
    assert runner(Stage("t", (), {}, compute))  # same settings and inputs, yet it runs again
    assert run.manifest()["stages"]["t"]["state"] == "done" and "unfinished" not in run.manifest()["stages"]["t"]
    assert not runner(Stage("t", (), {}, compute))
    assert len(attempts) == 2


def test_the_driver_lets_go_of_each_table_once_its_stage_is_over(tmp_path):
    """A given table is held until written (or found written), a table a stage reads until that
    stage ends: what Arrow holds after each stage is what the caller still holds, not the run's
    tables; and a later stage reads the same rows from the run folder."""
    from vlm_decade.core.runner import given, release_memory

    def big(value: int) -> pa.Table:
        return pa.table({"x": pa.array([value] * 500_000, pa.int64())})  # 4 MB

    seen = []

    def reader(run):
        seen.append(run.table("given").column("x")[0].as_py())
        assert run.table("given") is run.table("given")  # read once within the stage
        return {"sum": pa.table({"x": [len(seen)]})}

    for attempt in range(2):  # a fresh run, then one that finds the given stage current
        release_memory()
        before = pa.total_allocated_bytes()
        folder = RunFolder(tmp_path)
        with StudyRun(folder, Reporter(quiet=True), LazyRay(RuntimeConfig())) as run:
            assert run.run_stage(given("given", big(7))) is (attempt == 0)
            assert pa.total_allocated_bytes() - before < 1_000_000
            assert run.run_stage(Stage("sum", ("given",), attempt, reader))
            assert pa.total_allocated_bytes() - before < 1_000_000
    assert seen == [7, 7]
    assert folder.read("given").equals(big(7))


class _Actors:
    """Stands in for `LazyRay` where a stage's actors are started ahead: records what was started
    and killed (`start_soon` hands `then` this object as the `ray` module)."""

    def __init__(self):
        self.events, self.killed = [], []

    def __call__(self):
        return self

    def start_soon(self, then):
        from concurrent.futures import Future

        future = Future()
        future.set_result(then(self))
        return future

    def kill(self, actor):
        self.killed.append(actor)

    def close_soon(self):  # as `LazyRay.close_soon`: once
        if "close_soon" not in self.events:
            self.events.append("close_soon")


def _warm_pipeline(calls, ray, settings, middle_frees_cluster=True, first_frees_cluster=False):
    """first -> middle -> second, whose actors are started ahead; `settings`: first's and middle's."""

    def warm(run):
        ray.events.append("warm")
        return run.ray.start_soon(lambda module: ["actor-1", "actor-2"])

    def same_table(name):
        def compute(run):
            ray.events.append(name)
            return {name: pa.table({"x": [1]})}

        return compute

    def second(run):
        calls.append(run.warmed())
        return {"second": pa.table({"x": [1]})}

    return [
        Stage("first", (), settings[0], same_table("first"), frees_cluster=first_frees_cluster),
        Stage("middle", ("first",), settings[1], same_table("middle"), frees_cluster=middle_frees_cluster),
        Stage("second", ("middle",), {}, second, warm=warm),
    ]


def test_actors_are_started_ahead_as_the_stage_before_runs_and_let_go_when_not_taken(tmp_path):
    """`Stage.warm` begins as the stage before it begins (before that stage's own work), and its
    stage takes the actors (`run.warmed`); a run that does not reach the stage before starts none,
    and actors started for a stage then found current are killed."""

    def run(settings):
        ray = _Actors()
        StudyRun(RunFolder(tmp_path), Reporter(quiet=True), ray)(*_warm_pipeline(calls, ray, settings))
        return ray

    calls = []
    ray = run((1, 1))
    assert ray.events == ["first", "warm", "middle"] and calls == [["actor-1", "actor-2"]] and ray.killed == []
    assert run((1, 1)).events == [] and len(calls) == 1  # nothing to run: nothing started
    # `first` runs again (new settings, the same table): `middle` is current, nothing is started.
    ray = run((2, 1))
    assert ray.events == ["first"] and len(calls) == 1
    # `middle` runs again, writing the same table: `second` is current, its actors are killed.
    ray = run((2, 2))
    assert ray.events == ["warm", "middle"] and len(calls) == 1 and ray.killed == ["actor-1", "actor-2"]


def test_no_actors_are_started_ahead_unless_the_stage_before_leaves_the_cluster_free(tmp_path):
    """A stage not said to free the cluster (it may run actors of its own: local models) runs before
    `second`: `second`'s actors are not started beside it (they could take the CPUs its actors wait
    for); `second` starts its own."""
    ray, calls = _Actors(), []
    StudyRun(RunFolder(tmp_path), Reporter(quiet=True), ray)(
        *_warm_pipeline(calls, ray, (1, 1), middle_frees_cluster=False)
    )
    assert ray.events == ["first", "middle"] and calls == [[]] and ray.killed == []


@pytest.mark.parametrize("middle_frees_cluster", [True, False])
def test_actors_are_started_ahead_past_every_stage_between_that_leaves_the_cluster_free(tmp_path, middle_frees_cluster):
    """Where `first` and `middle` both leave the cluster free, `second`'s actors start as `first`
    begins, and once only; where `middle` may run actors of its own, not before it (nor beside it)."""
    ray, calls = _Actors(), []
    StudyRun(RunFolder(tmp_path), Reporter(quiet=True), ray)(
        *_warm_pipeline(calls, ray, (1, 1), middle_frees_cluster=middle_frees_cluster, first_frees_cluster=True)
    )
    if middle_frees_cluster:
        assert ray.events == ["warm", "first", "middle"] and calls == [["actor-1", "actor-2"]]
    else:
        assert ray.events == ["first", "middle"] and calls == [[]]
    assert ray.killed == []


def test_a_stage_that_frees_the_cluster_partway_has_the_next_stages_actors_started_then(tmp_path):
    """A stage whose actors hold the cluster (the embed stage) says once they are done
    (`run.cluster_freed`): the next stage's actors start then, beside the rest of its work (writing
    its table), not as the stage begins, nor after it."""
    ray, calls = _Actors(), []
    first, middle, second = _warm_pipeline(calls, ray, (1, 1), middle_frees_cluster=False)

    def middle_compute(run):
        ray.events.append("middle actors")
        run.cluster_freed()
        ray.events.append("middle writes")
        return {"middle": pa.table({"x": [1]})}

    middle = Stage(middle.name, middle.inputs, middle.settings, middle_compute)
    StudyRun(RunFolder(tmp_path), Reporter(quiet=True), ray)(first, middle, second)
    assert ray.events == ["first", "middle actors", "warm", "middle writes"]
    assert calls == [["actor-1", "actor-2"]] and ray.killed == []


def test_study_as_statistics_workers_start_beside_its_scores_which_leave_the_cluster_free(tmp_path):
    """The scores are computed in the driver alone; the bootstrap's workers are started beside them
    (`stats.warm_workers`, tests/ray/test_stats_ray.py)."""
    from vlm_decade.demo import decade_demo
    from vlm_decade.studies.decade import score, statistics

    study = decade_demo(tmp_path)
    assert score.stage(study).frees_cluster and statistics.stage(study).warm is not None


def test_ray_is_shut_down_beside_the_stages_after_the_last_that_needs_it(tmp_path):
    """Once no stage left may call for Ray (the report, tables given to the run), it is shut down as
    they begin, not after them (`LazyRay.close_soon`); where the last stage needs Ray, the run's
    end shuts it down."""

    def pipeline(ray, *stages):
        def stage(name, needs_ray):
            def compute(run):
                ray.events.append(name)
                return {name: pa.table({"x": [1]})}

            return Stage(name, (), name, compute, needs_ray=needs_ray)

        return [stage(name, needs) for name, needs in stages]

    ray = _Actors()
    StudyRun(RunFolder(tmp_path / "a"), Reporter(quiet=True), ray)(
        *pipeline(ray, ("stats", True), ("report", False), ("export", False))
    )
    assert ray.events == ["stats", "close_soon", "report", "export"]
    ray = _Actors()
    StudyRun(RunFolder(tmp_path / "b"), Reporter(quiet=True), ray)(*pipeline(ray, ("report", False), ("stats", True)))
    assert ray.events == ["report", "stats"]


def test_the_demo_responses_stage_keeps_the_cluster_and_one_of_imported_captions_frees_it(tmp_path):
    """Study A's demo runs a local captioner on actors (its embeddings' actors then wait for the
    stage to end); without it, the stage reads imported captions in the driver."""
    from vlm_decade.demo import decade_demo
    from vlm_decade.stages import describe
    from vlm_decade.studies.decade.pipeline import plan

    study = decade_demo(tmp_path)
    assert not describe.stage(study, plan(study)).frees_cluster
    models = tuple(m for m in study.models if m.backend == "imported")
    assert len(models) == 1
    study = study.model_copy(update={"models": models})
    assert describe.stage(study, plan(study)).frees_cluster
