"""The detections stage: the taxonomy's detector on every full image, into the `detections` table.

The detector stands in for a local model's visual front end (the paper read the pre-MLLMs' own
Faster R-CNN boxes): which objects were there to be seen. It runs in one Ray actor that loads it
once; loader tasks decode the images, as in the describe stage. One row per image, its boxes as a
list, so an image with no detections is told apart from one that failed. A run with images added
detects only those (and any that failed): each row keeps the hash of its image and settings.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.dispatch import batches, bounded
from vlm_decade.core.errors import error_text
from vlm_decade.core.reuse import INPUTS, reuse, unit_inputs
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
        (INPUTS, pa.string()),
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


def per_image(run: StudyRun, name: str, schema: pa.Schema, settings, rows_of, *inputs: list) -> pa.Table:
    """Table `name`, one row per image of the study: each image's row kept from the last table while
    its file (sha256), the `settings` and its own `inputs` (a value per image, in the images table's
    order) are unchanged and it finished; `rows_of(images)` makes the others' rows (`core.reuse`)."""
    images = run.table("images")
    wanted = pa.table(
        {"image_id": images.column("image_id"), INPUTS: unit_inputs(settings, images.column("sha256"), *inputs)}
    )

    def compute(todo: pa.Table) -> pa.Table:
        rows = rows_of(images.filter(pc.is_in(images.column("image_id"), todo.column("image_id"))))
        return pa.Table.from_pylist(rows, schema=schema.remove(schema.get_field_index(INPUTS)))

    table, computed = reuse(run.folder.previous(name), wanted, ["image_id"], compute, schema, ["image_id"])
    if computed < images.num_rows:
        run.reporter.say(f"     {name}: {images.num_rows - computed} images kept from the last run, {computed} done")
    return table


def image_rows(study, run: StudyRun, cfg, actor_class: type, subject: str, track: str, submit, images) -> list[dict]:
    """One row per full image of `images` (a table of the study's), sorted by image id, from one Ray
    actor `actor_class(cfg)` that loads its model once: `submit(actor, batch, stimuli)` sends a batch
    of jobs with the loader task that decodes their images. The actor is killed however the loop ends."""
    rt = study.runtime
    ray = run.ray()
    check_actor_fit(study, ray)
    images = images.select(["image_id", "path"]).to_pylist()
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
    """The detector on each image it has not yet seen (new, changed, or failed last time)."""
    cfg = study.taxonomy.detector

    def detect(images: pa.Table) -> list[dict]:
        submit = lambda actor, batch, stimuli: actor.detect.remote(batch, stimuli)  # noqa: E731
        return image_rows(study, run, cfg, DetectActor, "detector", "detect", submit, images)

    return per_image(run, "detections", DETECTIONS_SCHEMA, cfg.fingerprint(), detect)
