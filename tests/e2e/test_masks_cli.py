"""`vlm-decade masks IMAGE --out DIR` writes the variants a person can look at, with their geometry."""

import json

import numpy as np
import pytest
from PIL import Image

from .conftest import vlm_decade

pytestmark = pytest.mark.e2e


def test_masks_command_writes_variants_and_geometry(tmp_path):
    image = tmp_path / "grey.png"
    Image.fromarray(np.full((60, 90, 3), 200, np.uint8)).save(image)
    result = vlm_decade("masks", str(image), "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == ["full.png", "m1.png", "m2.png", "m3.png", "masks.json"]
    geometry = json.loads((tmp_path / "out" / "masks.json").read_text())
    masks = geometry["masks"] if isinstance(geometry, dict) and "masks" in geometry else geometry
    fractions = [m["covered_fraction"] for m in masks]
    assert fractions == pytest.approx([1 / 3] * 3, abs=0.02)
    # The left window blacks out the left edge and leaves the right edge untouched.
    m1 = np.asarray(Image.open(tmp_path / "out" / "m1.png"))
    assert m1[:, 0].max() == 0 and (m1[:, -1] == 200).all()


def test_masks_command_names_a_missing_image(tmp_path):
    result = vlm_decade("masks", str(tmp_path / "nope.png"), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "nope.png" in result.stderr and "not found" in result.stderr
    assert not (tmp_path / "out").exists()
