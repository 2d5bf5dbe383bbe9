"""The locations stage: an open-vocabulary detector (OWL-ViT / OWLv2) asked, per image, where each
named object is, into the `locations` table.

The names are the image's gold objects (where each relevant object is, so the detector-based labels
can compare a captioner's boxes there) and, when the locator is the study's verifier, the objects
models mention that the gold does not (is it in the image at all?). It runs in one Ray actor that
loads the model once; loader tasks decode the images, as in the detections stage. One row per
image: its queries and the best boxes of each (label = the query), or why it failed; an image whose
file and queries are unchanged keeps its row from the last run.
"""

from __future__ import annotations

import pyarrow as pa

from vlm_decade.core.errors import error_text
from vlm_decade.core.reuse import INPUTS
from vlm_decade.core.runner import StudyRun
from vlm_decade.models.backends.detection import Detection
from vlm_decade.stages.describe.plan import Job
from vlm_decade.studies.decade.taxonomy.detect import DETECTION_TYPE, detection_row, image_rows, per_image

LOCATIONS_SCHEMA = pa.schema(
    [
        ("image_id", pa.string()),
        ("status", pa.string()),
        ("error", pa.string()),
        ("queries", pa.list_(pa.string())),
        ("boxes", pa.list_(DETECTION_TYPE)),
        (INPUTS, pa.string()),
    ]
)


class LocateActor:
    def __init__(self, cfg):
        from vlm_decade.models.backends.hf_locator import HFLocator

        self.locator = HFLocator(cfg.as_model())

    def locate(self, jobs: list[Job], stimuli, queries: dict[str, list[str]]) -> list[dict]:
        rows = []
        for job, stim in zip(jobs, stimuli):
            names = queries[job.image_id]
            row = {"image_id": job.image_id, "queries": names, "boxes": []}
            if isinstance(stim, str):
                rows.append({**row, "status": "error", "error": stim})
                continue
            try:
                (found,) = self.locator.locate([stim.image], [names])
            except Exception as exc:  # noqa: BLE001 - recorded per image
                rows.append({**row, "status": "error", "error": error_text(exc)})
                continue
            rows.append({**row, "status": "ok", "error": "", "boxes": [detection_row(d) for d in found]})
        return rows


def locations_of(table: pa.Table) -> dict[str, list[Detection] | None]:
    """image_id -> the locator's boxes (label = the name asked for), or None where it failed."""
    return {
        r["image_id"]: [Detection(d["label"], d["score"], (d["x0"], d["y0"], d["x1"], d["y1"])) for d in r["boxes"]]
        if r["status"] == "ok"
        else None
        for r in table.to_pylist()
    }


def run_locations(study, run: StudyRun, queries: dict[str, list[str]]) -> pa.Table:
    """Ask the locator for `queries[image_id]` on every image of the study whose image and queries
    it has not yet answered (`per_image`)."""
    cfg = study.taxonomy.locator

    def submit(actor, batch, stimuli):
        return actor.locate.remote(batch, stimuli, {j.image_id: queries.get(j.image_id, []) for j in batch})

    def locate(images: pa.Table) -> list[dict]:
        return image_rows(study, run, cfg, LocateActor, "locator", "locate", submit, images)

    asked = [queries.get(i, []) for i in run.table("images").column("image_id").to_pylist()]
    return per_image(run, "locations", LOCATIONS_SCHEMA, cfg.fingerprint(), locate, asked)
