"""A run that failed says so in its exit status (docs/cli.md): the docs' example study with its one
model's weights damaged (the files are there, so `validate` passes; the model cannot load) runs to
its report, names the model and its own error on the terminal and at the top of the report, with no
Ray wrapper or terminal escape code in anything it wrote, and ends with exit status 3 (what
`--allow-failures` changes is tested on `cli._end` directly: one run here is enough)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vlm_decade.core.errors import RUN_FAILED_EXIT

from .conftest import vlm_decade

pytestmark = pytest.mark.e2e
EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "study_a"
WRAPPERS = ("\x1b", "ActorDiedError", "RayTaskError", "ray::")


def _texts(run: Path) -> dict[str, str]:
    """Every text the run wrote: the manifest, the pages, the CSVs, and each table's string cells."""
    texts = {p.name: p.read_text() for p in [run / "manifest.json", *run.glob("*.html"), *run.glob("tables/*.csv")]}
    for path in run.glob("*.parquet"):
        table = pq.read_table(path)
        cells = [
            str(v) for f in table.schema if pa.types.is_string(f.type) for v in table.column(f.name).to_pylist() if v
        ]
        texts[path.name] = "\n".join(cells)
    return texts


def test_a_model_that_cannot_load_fails_the_run_with_status_3_after_its_report(tmp_path):
    study = tmp_path / "example" / "study.yaml"
    shutil.copytree(EXAMPLE, study.parent)
    weights = study.parent / "weights"
    weights.mkdir()
    for name in ("frozen_inference_graph.pb", "ssd_mobilenet_v2_coco_2018_03_29.pbtxt"):
        (weights / name).write_text("not a model\n")
    text = study.read_text().replace("    variants: all\n", "    variants: all\n    path: weights\n")
    study.write_text(text.replace("n_resamples: 1000", "n_resamples: 200"))
    out = tmp_path / "run"

    done = vlm_decade("run", str(study), "--out", str(out))
    assert done.returncode == RUN_FAILED_EXIT == 3, done.stderr[-4000:]
    said = " ".join(done.stderr.split())
    assert "Traceback" not in said and f"report: {out}/report.html" in said
    # The model's own error (OpenCV's `cv2.error`), said once per model with its count.
    summary = said.rsplit("failed rows", 1)[1]
    assert "rows not finished" not in said  # the failed rows are said once, in the summary
    assert (
        "exit status 3" in summary
        and "ssd-template: 12 of 12 responses failed (every one); most common (12)" in summary
    )
    responses = pq.read_table(out / "responses.parquet")
    (error,) = set(responses.column("error").to_pylist())
    assert error.startswith("error: OpenCV") and str(weights / "frozen_inference_graph.pb") in error
    assert error in summary
    html = (out / "report.html").read_text()
    assert html.index("class='failed'") < html.index("<h2>") and "<b>Failed:</b> ssd-template." in html
    assert json.loads((out / "manifest.json").read_text())["stages"]["responses"]["failed"][0]["count"] == 12
    for name, text in _texts(out).items():
        assert not any(wrapper in text for wrapper in WRAPPERS), name
