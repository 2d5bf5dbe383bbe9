"""The HF backends through the describe stage on Ray: rows equal direct calls of the same model, and
the responses table is the same with 1 actor and batch size 3 as with 2 actors and batch size 1."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from tests import hf_tiny
from vlm_decade.core.config import ModelConfig
from vlm_decade.demo import materialize
from vlm_decade.imaging.masks import apply_mask, mask_specs
from vlm_decade.models.backends import Stimulus, backend_class
from vlm_decade.studies import load_study
from vlm_decade.studies.decade.data import load_study_data

from .conftest import describe_stage

pytestmark = pytest.mark.ray
KEEP = {"chelsea", "coffee", "astronaut"}


def _tiny(name: str, backend: str, era: str, path, prompt: str | None = None, **options) -> ModelConfig:
    """A tiny model of `backend` saved at `path`, run on every masked variant."""
    return ModelConfig(
        name=name,
        backend=backend,
        model_id=f"tiny/{name}",
        era=era,
        variants="all",
        prompt=prompt,
        path=path,
        options=options,
    )


@pytest.fixture(scope="module")
def hf_study(tmp_path_factory):
    """The demo study's data on three images, with one tiny model of each HF family, masks included."""
    root = tmp_path_factory.mktemp("hf")
    models = (
        _tiny("cap", "hf-captioner", "pre-mllm", hf_tiny.save_captioner(root / "cap"), max_new_tokens=6),
        _tiny("vlm", "hf-vlm", "mllm", hf_tiny.save_vlm(root / "vlm"), "describe this image", max_new_tokens=6),
        _tiny("det", "hf-detector", "pre-mllm", hf_tiny.save_detector(root / "det"), score_threshold=0.98),
    )
    study = load_study(materialize(tmp_path_factory.mktemp("study"))).model_copy(update={"models": models})
    images = load_study_data(study.data, study.ranking, study.masks).images
    return study, images.filter(pa.compute.is_in(images.column("image_id"), pa.array(sorted(KEEP))))


def _describe(study, images, out, actors, batch_size):

    models = tuple(m.model_copy(update={"batch_size": batch_size}) for m in study.models)
    runtime = study.runtime.model_copy(update={"actors_per_model": actors, "cpus_per_actor": 1.0})
    study = study.model_copy(update={"models": models, "runtime": runtime})
    return describe_stage(study, images, out)


def test_same_table_whatever_the_layout_and_equal_to_direct_calls(hf_study, tmp_path):
    study, images = hf_study
    one = _describe(study, images, tmp_path / "one", actors=1, batch_size=3)
    assert one.num_rows == 3 * len(KEEP) * 4 and set(one.column("status").to_pylist()) == {"ok"}
    # The other layout for the two families where batching could change answers (left padding of
    # prompts; images padded to a common size): each actor start costs seconds, so not the captioner,
    # whose inputs all have one size.
    sensitive = study.model_copy(update={"models": tuple(m for m in study.models if m.name != "cap")})
    two = _describe(sensitive, images, tmp_path / "two", actors=2, batch_size=1)
    expected = one.filter(pa.compute.not_equal(one.column("subject"), "cap"))
    assert two.drop_columns(["latency_s"]).equals(expected.drop_columns(["latency_s"]))

    specs = {s.mask_id: s for s in mask_specs(study.masks)}
    paths = dict(zip(images.column("image_id").to_pylist(), images.column("path").to_pylist()))
    for model in study.models:
        backend = backend_class(model.backend)(model)
        rows = [r for r in one.to_pylist() if r["subject"] == model.name]
        for row in rows:
            rgb = np.asarray(Image.open(paths[row["image_id"]]).convert("RGB"))
            image = rgb if row["variant"] == "full" else apply_mask(rgb, specs[row["variant"]])
            prompt = model.prompt or study.prompt
            direct = backend.describe([Stimulus(row["image_id"], row["variant"], image, prompt)])[0]
            assert (row["text"], row["model_version"]) == (direct.text, direct.model_version), row
        assert len({r["text"] for r in rows}) > 1, model.name  # answers depend on the image
