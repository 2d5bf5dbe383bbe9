"""One local Ray for the whole test session (starting one costs seconds)."""

import pytest


@pytest.fixture(scope="session", autouse=True)
def ray_session():
    from vlm_decade.core.runtime import start_ray

    ray = start_ray(num_cpus=2)
    yield ray
    ray.shutdown()


def describe_stage(study, images, out):
    """The describe stage alone, as a run would run it: the images stage first, then `responses`
    (the table it wrote)."""
    from vlm_decade.core.progress import Reporter
    from vlm_decade.core.runfolder import RunFolder
    from vlm_decade.core.runner import StudyRun, given
    from vlm_decade.core.runtime import LazyRay
    from vlm_decade.stages.describe import run_describe
    from vlm_decade.studies import pipeline_of

    run = StudyRun(RunFolder(out), Reporter(quiet=True), LazyRay(study.runtime))
    run.run_stage(given("images", images))
    run_describe(study, pipeline_of(study).plan(study), run)
    return run.folder.read("responses")


@pytest.fixture(scope="session")
def served(tmp_path_factory):
    """One `transformers serve` for the session, with a tiny LLaVA answering in one word and a judge that answers "1"
    loaded: the base URL and the models' folders, which are also the ids it serves them under."""
    from tests.hf_tiny import save_brief_vlm, save_verdict_lm
    from tests.serving import Served, TransformersServe

    root = tmp_path_factory.mktemp("served")
    with TransformersServe(root) as server:  # starting while the models are saved
        vlm, judge = save_brief_vlm(root / "vlm"), save_verdict_lm(root / "judge")
        yield Served(server.url, server.load(vlm), server.load(judge))
