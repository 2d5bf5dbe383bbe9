"""The detections stage: the taxonomy's detector on every full image, into the `detections` table.

The detector stands in for a local model's visual front end (the paper read the pre-MLLMs' own
Faster R-CNN boxes): which objects were there to be seen. It runs in one Ray actor that loads it
once; loader tasks decode the images, as in the describe stage. One row per image, its boxes as a
list, so an image with no detections is told apart from one that failed.
"""

from __future__ import annotations

import pyarrow as pa

from vlm_decade.core.dispatch import batches, bounded
from vlm_decade.core.errors import error_text
from vlm_decade.core.runner import StudyRun
from vlm_decade.models.backends import backend_class
from vlm_decade.models.backends.detection import Detection
from vlm_decade.stages.describe.plan import Job, check_actor_fit, load_stimuli
from vlm_decade.studies.decade.config import DetectorConfig

DETECTION_TYPE = pa.struct(
    [
        ("label", pa.string()),
        ("score", pa.float64()),
        ("x0", pa.float64()),
        ("y0", pa.float64()),
        ("x1", pa.float64()),
        ("y1", pa.float64()),
    ]
)
DETECTIONS_SCHEMA = pa.schema(
    [
        ("image_id", pa.string()),
        ("status", pa.string()),
        ("error", pa.string()),
        ("detections", pa.list_(DETECTION_TYPE)),
    ]
)
IN_FLIGHT = 2


class DetectActor:
    def __init__(self, cfg: DetectorConfig):
        self.backend = backend_class(cfg.backend)(cfg.as_model())

    def detect(self, jobs: list[Job], stimuli) -> list[dict]:
        ready = [s for s in stimuli if not isinstance(s, str)]
        try:
            found = iter(self.backend.detect([s.image for s in ready]))
            failure = ""
        except Exception as exc:  # noqa: BLE001 - a failing batch is recorded per image
            found, failure = iter(()), error_text(exc)
        rows = []
        for job, stim in zip(jobs, stimuli):
            if isinstance(stim, str) or failure:
                rows.append(
                    {
                        "image_id": job.image_id,
                        "status": "error",
                        "error": stim if isinstance(stim, str) else failure,
                        "detections": [],
                    }
                )
            else:
                rows.append(
                    {
                        "image_id": job.image_id,
                        "status": "ok",
                        "error": "",
                        "detections": [detection_row(d) for d in next(found)],
                    }
                )
        return rows


def detection_row(d: Detection) -> dict:
    x0, y0, x1, y1 = d.box
    return {"label": d.label, "score": d.score, "x0": x0, "y0": y0, "x1": x1, "y1": y1}


def detections_of(table: pa.Table) -> dict[str, list[Detection] | None]:
    """image_id -> its detections, or None where the detector failed on that image."""
    out: dict[str, list[Detection] | None] = {}
    for row in table.to_pylist():
        out[row["image_id"]] = (
            [Detection(d["label"], d["score"], (d["x0"], d["y0"], d["x1"], d["y1"])) for d in row["detections"]]
            if row["status"] == "ok"
            else None
        )
    return out


def image_rows(study, run: StudyRun, cfg, actor_class: type, subject: str, track: str, submit) -> list[dict]:
    """One row per full image of the study, sorted by image id, from one Ray actor `actor_class(cfg)` that
    loads its model once: `submit(actor, batch, stimuli)` sends a batch of jobs with the loader task
    that decodes their images. The actor is killed however the loop ends."""
    rt = study.runtime
    ray = run.ray()
    check_actor_fit(study, ray)
    images = run.table("images").select(["image_id", "path"]).to_pylist()
    jobs = [Job(subject, r["image_id"], "full", "", "", r["path"], None, "") for r in images]
    actor = ray.remote(actor_class).options(num_cpus=rt.cpus_per_actor, num_gpus=rt.gpus_per_actor).remote(cfg)
    loader = ray.remote(load_stimuli).options(num_cpus=0)
    rows: list[dict] = []
    try:
        with run.reporter.track(track, len(jobs)) as advance:
            for done in bounded(
                ray,
                batches(jobs, cfg.batch_size),
                lambda batch, _: submit(actor, batch, loader.remote(batch)),
                IN_FLIGHT,
            ):
                if done.error is not None:
                    raise done.error
                rows += done.value
                advance(len(done.work))
    finally:
        ray.kill(actor)
    return sorted(rows, key=lambda r: r["image_id"])


def run_detections(study, run: StudyRun) -> pa.Table:
    cfg = study.taxonomy.detector
    rows = image_rows(
        study,
        run,
        cfg,
        DetectActor,
        "detector",
        "detect",
        lambda actor, batch, stimuli: actor.detect.remote(batch, stimuli),
    )
    return pa.Table.from_pylist(rows, schema=DETECTIONS_SCHEMA)
