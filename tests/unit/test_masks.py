"""The occluder: coverage, exact black interior, untouched outside, feathering, tiling, determinism."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from vlm_decade.imaging.masks import (
    MaskConfig,
    MaskSpec,
    apply_mask,
    as_rgb,
    geometry,
    mask_ids,
    mask_specs,
    occlusion,
    variants,
    write_previews,
)


def _photo(height=120, width=180, seed=0) -> np.ndarray:
    # Values in 1..255 so that "unchanged" and "made black" can never be confused.
    return np.random.default_rng(seed).integers(1, 256, size=(height, width, 3), dtype=np.uint8)


def test_default_masks_are_three_columns_each_covering_a_third():
    cfg = MaskConfig()
    specs = mask_specs(cfg)
    assert [s.mask_id for s in specs] == mask_ids(cfg) == ["m1", "m2", "m3"]
    assert [s.box[0] for s in specs] == pytest.approx([0, 1 / 3, 2 / 3])
    for spec in specs:
        for height, width in ((480, 640), (512, 512), (333, 501)):
            assert occlusion(height, width, spec).mean() == pytest.approx(1 / 3, abs=2e-3)


def test_rows_layout_and_explicit_windows():
    rows = mask_specs(MaskConfig(layout="rows", count=2))
    assert [s.box for s in rows] == [(0.0, 0.0, 1.0, 0.5), (0.0, 0.5, 1.0, 1.0)]
    windows = mask_specs(MaskConfig(windows=((0.25, 0.25, 0.75, 0.75),), feather=0.1))
    assert [s.mask_id for s in windows] == ["m1"]
    # An interior box keeps its nominal area: the ramp gives back outside what it takes inside.
    assert occlusion(400, 400, windows[0]).mean() == pytest.approx(0.25, abs=1e-3)


def test_hand_worked_six_by_six():
    # 6 px wide, feather 1/3 of 6 = 2 px: the ramp runs from x = 1 to x = 3 around the edge at x = 2.
    # Pixel centres 1.5 and 2.5 sit half a pixel inside and outside: 0.5 * (1 + cos(pi/4 or 3pi/4)).
    hi, lo = 0.5 * (1 + np.cos(np.pi / 4)), 0.5 * (1 + np.cos(3 * np.pi / 4))
    m1, m2, m3 = mask_specs(MaskConfig(feather=1 / 3))
    np.testing.assert_allclose(occlusion(6, 6, m1), np.tile([1, hi, lo, 0, 0, 0], (6, 1)), atol=1e-6)
    np.testing.assert_allclose(occlusion(6, 6, m2), np.tile([0, lo, hi, hi, lo, 0], (6, 1)), atol=1e-6)
    np.testing.assert_allclose(occlusion(6, 6, m3), np.tile([0, 0, 0, lo, hi, 1], (6, 1)), atol=1e-6)
    assert occlusion(6, 6, m1).mean() == pytest.approx(1 / 3, abs=1e-6)
    image = np.full((6, 6, 3), 200, np.uint8)
    expected = np.rint(200 * (1 - np.array([1, hi, lo, 0, 0, 0])))
    np.testing.assert_array_equal(apply_mask(image, m1)[0, :, 0], expected)


def test_interior_exactly_black_and_far_outside_bit_identical():
    image = _photo()
    m2 = mask_specs(MaskConfig())[1]
    out = apply_mask(image, m2)
    feather_px = m2.feather * 120
    inner = slice(int(60 + feather_px / 2) + 1, int(120 - feather_px / 2) - 1)
    assert inner.start < inner.stop
    assert (out[:, inner] == 0).all()
    far = int(60 - feather_px / 2) - 1
    np.testing.assert_array_equal(out[:, :far], image[:, :far])
    np.testing.assert_array_equal(out[:, -far:], image[:, -far:])


def test_feather_zero_is_a_hard_edge():
    spec = MaskSpec("m1", (0.0, 0.0, 0.5, 1.0), 0.0)
    alpha = occlusion(4, 10, spec)
    np.testing.assert_array_equal(alpha, np.tile([1, 1, 1, 1, 1, 0, 0, 0, 0, 0], (4, 1)))
    assert set(np.unique(occlusion(37, 53, mask_specs(MaskConfig(feather=0))[1]))) <= {0.0, 1.0}


def test_values_monotone_across_each_edge():
    m2 = mask_specs(MaskConfig(feather=0.2))[1]
    row = occlusion(100, 300, m2)[50]
    left, right = row[:150], row[150:]
    assert (np.diff(left) >= 0).all() and (np.diff(right) <= 0).all()
    assert len(np.unique(left)) > 10  # really a ramp, not a step
    assert row.min() == 0.0 and row.max() == 1.0


def test_image_border_is_not_feathered():
    m1 = mask_specs(MaskConfig(feather=0.3))[0]
    assert (occlusion(50, 90, m1)[:, 0] == 1.0).all()
    top = mask_specs(MaskConfig(layout="rows", feather=0.3))[0]
    assert (occlusion(90, 50, top)[0] == 1.0).all()


@pytest.mark.parametrize("feather", [0.0, 0.04, 0.25])
@pytest.mark.parametrize("layout", ["columns", "rows"])
def test_layout_masks_tile_the_image(layout, feather):
    specs = mask_specs(MaskConfig(layout=layout, count=4, feather=feather))
    total = sum(occlusion(61, 83, s).astype(np.float64) for s in specs)
    np.testing.assert_allclose(total, 1.0, atol=1e-6)


def test_deterministic_same_bytes():
    image = _photo(seed=3)
    first = variants(image, MaskConfig())
    second = variants(image.copy(), MaskConfig())
    assert list(first) == ["full", "m1", "m2", "m3"]
    for key in first:
        assert first[key].tobytes() == second[key].tobytes()


def test_input_not_modified_and_full_is_a_copy():
    image = _photo()
    before = image.copy()
    out = variants(image, MaskConfig())
    np.testing.assert_array_equal(image, before)
    assert out["full"] is not image and np.array_equal(out["full"], image)


def test_gray_and_rgba_inputs():
    gray = _photo()[:, :, 0]
    spec = mask_specs(MaskConfig())[0]
    out = apply_mask(gray, spec)
    assert out.shape == (120, 180, 3) and out.dtype == np.uint8
    np.testing.assert_array_equal(out[:, -1], np.stack([gray[:, -1]] * 3, axis=1))
    # RGBA is seen over white, as a file of it would be: c * 7/255 + 255 * 248/255, rounded.
    rgba = np.dstack([_photo(), np.full((120, 180), 7, np.uint8)])
    over_white = np.rint(_photo() * (7 / 255) + 255 * (248 / 255)).astype(np.uint8)
    np.testing.assert_array_equal(apply_mask(rgba, spec), apply_mask(over_white, spec))


@pytest.mark.parametrize(
    "bad", [np.zeros((0, 4, 3), np.uint8), np.zeros((4, 4, 2), np.uint8), np.zeros((4, 4, 3), np.float32)]
)
def test_unusable_images_are_refused(bad):
    with pytest.raises(ValueError):
        as_rgb(bad)


def test_geometry_record():
    spec = mask_specs(MaskConfig())[0]
    g = geometry(spec, 300, 600)
    assert g["mask_id"] == "m1"
    assert g["box"] == pytest.approx([0, 0, 1 / 3, 1])
    assert g["box_px"] == pytest.approx([0, 0, 200, 300])
    assert g["feather_px"] == pytest.approx(0.04 * 300)
    assert g["covered_fraction"] == pytest.approx(1 / 3, abs=1e-3)
    json.dumps(g)


def test_write_previews(tmp_path):
    src = tmp_path / "photo.png"
    Image.fromarray(_photo()).save(src)
    written = write_previews(src, tmp_path / "out", MaskConfig())
    assert [p.name for p in written] == ["full.png", "m1.png", "m2.png", "m3.png", "masks.json"]
    np.testing.assert_array_equal(np.asarray(Image.open(written[0])), _photo())
    m2 = apply_mask(_photo(), mask_specs(MaskConfig())[1])
    np.testing.assert_array_equal(np.asarray(Image.open(written[2])), m2)
    record = json.loads(written[-1].read_text())
    assert (record["height"], record["width"]) == (120, 180)
    assert [m["mask_id"] for m in record["masks"]] == ["m1", "m2", "m3"]
    assert record["config"]["count"] == 3
