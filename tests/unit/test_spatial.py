"""Spatial dependence (SDE) and its heat maps: profiles, the inter-human reference, the 2-SD rule,
undefined cases, order independence, and heat-map regions that are exactly the masked ones."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
from PIL import Image
from scipy.stats import pearsonr

from tests.figures import assert_drawn, panels, record_figures
from vlm_decade.imaging.masks import MaskConfig, MaskSpec, mask_specs, occlusion
from vlm_decade.studies.decade.taxonomy.heatmaps import coverage_map, importance_map, scaled, write_heatmap
from vlm_decade.studies.decade.taxonomy.spatial import (
    SPATIAL_SCHEMA,
    classify,
    heatmap_panels,
    inter_human_reference,
    mean_profile,
    pearson,
    spatial_dependence,
    spatial_table,
)

MASKS = ["m1", "m2", "m3"]
# Hand-worked case: two masked descriptions per mask. Similarities to the gold standard:
HAND = [[0.6, 0.7], [0.6, 0.7], [0.8, 0.8]]


def _case(human, model, image_id="img", subject="model-a", dataset="coco", masks=MASKS):
    """references rows, responses rows and the similarities of exactly the pairs the paradigm compares
    (masked human vs gold, masked model vs the model's own full description)."""
    gold = f"{image_id}: gold"
    refs = [
        {
            "image_id": image_id,
            "dataset": dataset,
            "condition": "full",
            "worker_id": "g0",
            "role": "gold",
            "text": gold,
        },
        {
            "image_id": image_id,
            "dataset": dataset,
            "condition": "full",
            "worker_id": "g1",
            "role": "top",
            "text": f"{image_id}: top",
        },
    ]
    sims = {}
    for m, values in zip(masks, human):
        for k, v in enumerate(values):
            text = f"{image_id}: {m} human {k}"
            refs.append(
                {
                    "image_id": image_id,
                    "dataset": dataset,
                    "condition": m,
                    "worker_id": f"w-{m}-{k:02d}",
                    "role": "masked",
                    "text": text,
                }
            )
            sims[(text, gold)] = v
    full = f"{subject} on {image_id}: full"
    responses = [{"subject": subject, "image_id": image_id, "variant": "full", "text": full, "status": "ok"}]
    for m, v in zip(masks, model):
        if v is None:
            continue
        text = f"{subject} on {image_id}: {m}"
        responses.append({"subject": subject, "image_id": image_id, "variant": m, "text": text, "status": "ok"})
        sims[(text, full)] = v
    return refs, responses, sims


def _run(refs, responses, sims, masks=MASKS, **kw):
    # A KeyError here means the code compared a pair the paradigm does not compare.
    return spatial_dependence(refs, responses, lambda a, b: sims[(a, b)], masks, **kw)


def _profile_with_r(target_r: float, human_profile) -> list[float]:
    """A profile whose Pearson r with `human_profile` is `target_r`: its centred direction is
    target_r * u + sqrt(1 - target_r^2) * v, u the humans' unit direction, v a unit vector orthogonal
    to u and to (1, 1, 1)."""
    h = np.asarray(human_profile) - np.mean(human_profile)
    u = h / np.linalg.norm(h)
    v = np.cross(u, np.ones(3) / math.sqrt(3))
    return list(0.6 + 0.1 * (target_r * u + math.sqrt(1 - target_r**2) * v))


# --- the inter-human reference ---------------------------------------------------------------------


def test_reference_worked_by_hand():
    # Pseudo-workers: one description per mask, 2 * 2 * 2 = 8; the rest of the group is the other
    # description of each mask. Choosing the same position in m1 and m2:
    #   (0.6, 0.6, 0.8) vs (0.7, 0.7, 0.8): both centred along (-1, -1, 2)  -> r = 1   (4 pseudo-workers)
    # choosing different positions:
    #   (0.6, 0.7, 0.8) vs (0.7, 0.6, 0.8): centred (-1, 0, 1) and (0, -1, 1) -> r = 1 / (sqrt2 sqrt2) = 0.5 (4)
    # mean = (4 * 1 + 4 * 0.5) / 8 = 0.75; SD = sqrt((4 * 0.25^2 + 4 * 0.25^2) / 8) = 0.25.
    ref = inter_human_reference(HAND)
    assert ref.exact and ref.n_pseudo == 8 and ref.n_defined == 8
    assert ref.mean_r == pytest.approx(0.75, abs=1e-12)
    assert ref.sd_r == pytest.approx(0.25, abs=1e-12)
    assert mean_profile(HAND) == pytest.approx([0.65, 0.65, 0.8])


def test_reference_equals_a_brute_force_loop_with_scipy():
    rng = np.random.default_rng(7)
    values = [rng.uniform(0.3, 0.9, size=n).tolist() for n in (3, 4, 5)]
    rs = []
    for pick in itertools.product(*(range(len(v)) for v in values)):
        own = [v[i] for v, i in zip(values, pick)]
        rest = [np.mean([x for j, x in enumerate(v) if j != i]) for v, i in zip(values, pick)]
        rs.append(pearsonr(own, rest).statistic)
    ref = inter_human_reference(values)
    assert ref.n_pseudo == ref.n_defined == 60
    assert ref.mean_r == pytest.approx(np.mean(rs), abs=1e-12)
    assert ref.sd_r == pytest.approx(np.std(rs), abs=1e-12)


def test_sampled_reference_is_seeded_close_to_exact_and_order_free():
    rng = np.random.default_rng(3)
    values = [rng.uniform(0.3, 0.9, size=6).tolist() for _ in range(3)]
    exact = inter_human_reference(values)
    sampled = inter_human_reference(values, seed=5, stream="img-1", max_exact=100, n_sampled=20_000)
    assert not sampled.exact and sampled.n_pseudo == 20_000
    assert sampled.mean_r == pytest.approx(exact.mean_r, abs=0.02)
    assert sampled.sd_r == pytest.approx(exact.sd_r, abs=0.02)
    shuffled = [random.Random(1).sample(v, len(v)) for v in values]
    assert inter_human_reference(shuffled, seed=5, stream="img-1", max_exact=100) == sampled
    assert inter_human_reference(values, seed=5, stream="img-2", max_exact=100).mean_r != sampled.mean_r


def test_reference_needs_two_descriptions_per_mask():
    with pytest.raises(ValueError, match="at least 2"):
        inter_human_reference([[0.5, 0.6], [0.7], [0.8, 0.9]])


# --- Pearson and the rule --------------------------------------------------------------------------


def test_pearson_matches_scipy_and_refuses_constants():
    rng = np.random.default_rng(11)
    for n in (3, 3, 5, 20):
        x, y = rng.normal(size=n), rng.normal(size=n)
        assert pearson(x, y) == pytest.approx(pearsonr(x, y).statistic, abs=1e-12)
    assert pearson([0.5, 0.5, 0.5], [0.1, 0.2, 0.3]) is None
    assert pearson([0.1, 0.2, 0.3], [0.4, 0.4, 0.4]) is None
    assert pearson([0.1, math.nan, 0.3], [0.1, 0.2, 0.3]) is None


def test_rule_is_strictly_more_than_n_sd_below():
    assert classify(0.75 - 1.5 * 0.25, 0.75, 0.25, n_sd=2.0) is False
    assert classify(0.75 - 1.5 * 0.25, 0.75, 0.25, n_sd=1.0) is True
    assert classify(0.75 + 3 * 0.25, 0.75, 0.25, n_sd=2.0) is False


# --- end to end on rows ----------------------------------------------------------------------------


def test_model_matching_the_humans_has_r_one_and_no_sde():
    [row] = _run(*_case(HAND, mean_profile(HAND)))
    assert row.model_r == pytest.approx(1.0)
    assert row.human_mean_r == pytest.approx(0.75) and row.human_sd_r == pytest.approx(0.25)
    assert row.z == pytest.approx((1.0 - 0.75) / 0.25)
    assert row.sde is False and row.reason == ""
    assert (row.n_human, row.n_pseudo, row.dataset) == (6, 8, "coco")


def test_anticorrelated_model_with_tight_humans_has_an_sde():
    # Twenty people per mask who agree closely: hiding m3 changes descriptions most, m1 least.
    rng = np.random.default_rng(0)
    humans = [(centre + rng.normal(0, 0.02, size=20)).tolist() for centre in (0.9, 0.7, 0.5)]
    [row] = _run(*_case(humans, [0.5, 0.7, 0.9]))
    assert row.model_r == pytest.approx(pearsonr([0.5, 0.7, 0.9], mean_profile(humans)).statistic)
    assert row.model_r < -0.99
    assert row.human_mean_r > 0.9
    assert row.sde is True and row.z < -2


def test_model_one_and_a_half_sd_below_has_no_sde_at_two():
    # Reference of HAND: mean 0.75, SD 0.25; a model with r = 0.375 sits exactly 1.5 SD below.
    model = _profile_with_r(0.375, mean_profile(HAND))
    [row] = _run(*_case(HAND, model))
    assert row.model_r == pytest.approx(0.375) and row.z == pytest.approx(-1.5)
    assert row.sde is False
    [row] = _run(*_case(HAND, model), n_sd=1.4)
    assert row.sde is True


def test_uncorrelated_model_is_three_sd_below():
    # Model centred along (1, -1, 0), humans along (-1, -1, 2): r = 0, z = (0 - 0.75) / 0.25 = -3.
    case = _case(HAND, [0.7, 0.6, 0.65])
    assert _run(*case, n_sd=2.9)[0].sde is True
    assert _run(*case, n_sd=3.1)[0].sde is False


@pytest.mark.parametrize(
    ("human", "model", "reason"),
    [
        (HAND, [0.7, 0.7, 0.7], "model's profile is constant"),
        ([[0.6, 0.7], [0.6, 0.7], [0.65, 0.65]], [0.5, 0.6, 0.9], "humans' mean profile is constant"),
        ([[0.6, 0.7], [0.6], [0.8, 0.9]], [0.5, 0.6, 0.9], "fewer than 2 human descriptions for m2"),
        ([[0.6, 0.7], [], [0.8, 0.9]], [0.5, 0.6, 0.9], "fewer than 2 human descriptions for m2"),
        (HAND, [0.5, 0.6, None], "no masked description from the model for m3"),
    ],
)
def test_undefined_cases_give_none_with_a_reason(human, model, reason):
    [row] = _run(*_case(human, model))
    assert row.sde is None
    assert reason in row.reason


def test_failed_or_absent_responses_are_missing():
    refs, responses, sims = _case(HAND, [0.5, 0.6, 0.9])
    failed = [dict(r, status="error") if r["variant"] == "m2" else r for r in responses]
    assert "for m2" in _run(refs, failed, sims)[0].reason
    no_full = [r for r in responses if r["variant"] != "full"]
    [row] = _run(refs, no_full, sims)
    assert row.sde is None and "no full-image description" in row.reason


def test_two_masks_give_no_correlation():
    refs, responses, sims = _case(HAND[:2], [0.5, 0.9], masks=MASKS[:2])
    [row] = _run(refs, responses, sims, masks=MASKS[:2])
    assert row.sde is None and "at least 3" in row.reason


def test_order_of_rows_changes_nothing():
    refs, responses, sims = [], [], {}
    rng = np.random.default_rng(4)
    for image_id in ("a", "b", "c"):
        humans = rng.uniform(0.3, 0.9, size=(3, 4)).tolist()
        for subject in ("gemini", "udc"):
            r, s, m = _case(humans, rng.uniform(0.3, 0.9, size=3).tolist(), image_id=image_id, subject=subject)
            refs += [x for x in r if x not in refs]
            responses += s
            sims.update(m)
    before = spatial_table(_run(refs, responses, sims))
    assert before.num_rows == 6 and sum(v is not None for v in before.column("sde").to_pylist()) == 6
    shuffle = random.Random(9)
    after = spatial_table(_run(shuffle.sample(refs, len(refs)), shuffle.sample(responses, len(responses)), sims))
    assert after.equals(before)


def test_table_and_heatmap_panels():
    refs, responses, sims = _case(HAND, [0.5, 0.6, None])
    rows = _run(refs, responses, sims)
    table = spatial_table(rows)
    assert table.schema == SPATIAL_SCHEMA
    assert table.column("model_profile").to_pylist() == [[0.5, 0.6, None]]
    assert table.column("sde").to_pylist() == [None]
    panels = heatmap_panels(rows, "img")
    assert list(panels) == ["humans", "model-a"]
    assert panels["humans"] == pytest.approx([0.35, 0.35, 0.2])
    assert panels["model-a"][:2] == pytest.approx([0.5, 0.4]) and math.isnan(panels["model-a"][2])


def test_ambiguous_inputs_are_refused():
    refs, responses, sims = _case(HAND, [0.5, 0.6, 0.9])
    with pytest.raises(ValueError, match="two 'ok' responses"):
        _run(refs, responses + [responses[1]], sims)
    with pytest.raises(ValueError, match="gold standard"):
        _run(refs + [dict(refs[0], text="another gold")], responses, sims)
    with pytest.raises(ValueError, match="n_sd"):
        _run(refs, responses, sims, n_sd=-1.0)


# --- heat maps -------------------------------------------------------------------------------------


def test_importance_map_values_at_centres_and_zero_outside():
    specs = [MaskSpec("m1", (0.05, 0.1, 0.35, 0.45), 0.04), MaskSpec("m2", (0.5, 0.5, 0.9, 0.9), 0.04)]
    heat = importance_map((100, 200), specs, [0.3, 0.8])
    # Window centres in pixels: m1 at x = 0.2 * 200, y = 0.275 * 100; m2 at x = 140, y = 70.
    assert heat[27, 40] == pytest.approx(0.3)
    assert heat[70, 140] == pytest.approx(0.8)
    outside = (occlusion(100, 200, specs[0]) == 0) & (occlusion(100, 200, specs[1]) == 0)
    assert outside.mean() > 0.5 and np.all(heat[outside] == 0.0)


def test_heat_regions_are_exactly_the_masked_ones():
    specs = mask_specs(MaskConfig(feather=0.1))
    for k, spec in enumerate(specs):
        one_hot = [1.0 if j == k else 0.0 for j in range(len(specs))]
        np.testing.assert_allclose(importance_map((60, 90), specs, one_hot), occlusion(60, 90, spec), atol=1e-7)
    # Tiled strips: alphas sum to 1, so the map is the alpha-weighted blend and every pixel is covered.
    values = [0.2, 0.5, 0.9]
    blend = sum(v * occlusion(60, 90, s).astype(np.float64) for v, s in zip(values, specs))
    np.testing.assert_allclose(importance_map((60, 90), specs, values), blend, atol=1e-7)
    np.testing.assert_allclose(coverage_map((60, 90), specs, values), 1.0, atol=1e-6)


def test_scaled_per_panel():
    assert scaled([0.2, 0.3, 0.6]) == pytest.approx([0.0, 0.25, 1.0])
    assert scaled([0.4, 0.4, 0.4]) == [0.0, 0.0, 0.0]
    out = scaled([0.1, math.nan, 0.5])
    assert out[0] == 0.0 and math.isnan(out[1]) and out[2] == 1.0


def test_write_heatmap_png_grows_with_panels(tmp_path, monkeypatch):
    image = np.random.default_rng(0).integers(0, 256, size=(60, 90, 3), dtype=np.uint8)
    specs = mask_specs(MaskConfig())
    two = {"model": [0.1, 0.5, math.nan], "humans": [0.2, 0.3, 0.6]}
    three = {**two, "other": [0.3, 0.3, 0.3]}
    sizes = []
    saved = record_figures(monkeypatch)
    for name, values in (("two.png", two), ("three.png", three)):
        write_heatmap(image, specs, values, tmp_path / name, title="img")
        with Image.open(tmp_path / name) as im:
            assert im.format == "PNG"
            sizes.append(im.size)
        # A panel per profile, humans first, each the photo under its tint with a number per mask.
        drawn = panels(saved[-1])
        assert [ax.get_title() for ax in drawn] == ["humans", *(n for n in values if n != "humans")]
        for ax in drawn:
            photo, tint = ax.get_images()
            assert (photo.get_array() == image).all() and tint.get_array()[..., 3].max() > 0
            assert len(ax.texts) == len(specs)
        assert_drawn(tmp_path / name, min_colours=1000)  # the photo's own colours, tinted
    (w2, h2), (w3, h3) = sizes
    assert h2 == h3
    # One more panel adds about one panel's width (3:2 image, 3.2 in high at 120 dpi: ~576 px).
    assert 400 < w3 - w2 < 700
    assert sorted(p.name for p in tmp_path.iterdir()) == ["three.png", "two.png"]  # no temporary files left
