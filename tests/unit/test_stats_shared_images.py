"""Comparisons on shared images: a model that lacks some images is compared with the humans (and
the eras with each other) only on the images both sides have, and the images left out are counted.
Hand-worked cases; complete data gives exactly what it gave before."""

import numpy as np
import pyarrow as pa
import pytest

from vlm_decade.stats import BootstrapOptions, ComparisonSpec, Family, Term, bootstrap_study


def scores(values: dict[str, dict[str, float]], dataset: str = "d") -> pa.Table:
    rows = [(s, i, dataset, "full", "sim", v) for s, by_image in values.items() for i, v in by_image.items()]
    return pa.table(list(map(list, zip(*rows))), names=["subject", "image_id", "dataset", "variant", "metric", "value"])


def comparison(result, family: str, a: str) -> dict:
    (row,) = [r for r in result.comparisons.to_pylist() if r["family"] == family and r["a"] == a]
    return row


def test_a_model_on_one_image_is_compared_with_humans_on_that_image():
    # The model described i1 only (0.5); the humans scored 0.7 on i1 and 0.1 on i2.
    # Unpaired means would say the model beats the humans: 0.5 - (0.7 + 0.1) / 2 = +0.1.
    # On the image both have: 0.5 - 0.7 = -0.2, in every resample that holds i1.
    t = scores({"M": {"i1": 0.5}, "human:top": {"i1": 0.7, "i2": 0.1}})
    res = bootstrap_study(
        t, {"M": "pre-mllm", "human:top": "human"}, BootstrapOptions(1000, 5, keep_distributions=True)
    )
    r = comparison(res, "vs-humans", "M")
    assert r["difference"] == pytest.approx(-0.2, abs=1e-12)
    assert (r["estimate_a"], r["estimate_b"], r["n_dropped"], r["paired"]) == (0.5, pytest.approx(0.7), 1, True)
    dist = res.comparison_distributions[("vs-humans", "M", "human:top", "d", "d", "sim", "full")]
    held = ~np.isnan(dist)  # a resample without i1 (i2 drawn twice, chance 1/4) has no shared image
    assert 650 < held.sum() < 850
    assert np.allclose(dist[held], -0.2, atol=1e-12)
    assert (r["ci_low"], r["ci_high"]) == (pytest.approx(-0.2), pytest.approx(-0.2))
    assert r["p"] == pytest.approx(2 / (held.sum() + 1))  # no resample crosses 0: the two-sided floor 2/(B+1)
    # The model's own estimate is still its mean over the images it has.
    (stat,) = [s for s in res.stats.to_pylist() if s["subject"] == "human:top"]
    assert stat["estimate"] == pytest.approx(0.4) and stat["n_images"] == 2


def test_era_means_are_compared_on_the_images_every_member_has():
    # A1 lacks i3. On i1, i2: pre-mllm = mean(A1, A2) = ((0.2 + 0.4) / 2 + (0.3 + 0.5) / 2) / 2 = 0.35,
    # mllm = (0.6 + 0.8) / 2 = 0.7; difference -0.35. i3 (A2 0.9, B 0.0) is left out.
    t = scores(
        {"A1": {"i1": 0.2, "i2": 0.4}, "A2": {"i1": 0.3, "i2": 0.5, "i3": 0.9}, "B": {"i1": 0.6, "i2": 0.8, "i3": 0.0}}
    )
    res = bootstrap_study(t, {"A1": "pre-mllm", "A2": "pre-mllm", "B": "mllm"}, BootstrapOptions(500, 1))
    r = comparison(res, "era", "era:pre-mllm")
    assert r["difference"] == pytest.approx(-0.35, abs=1e-12) and r["n_dropped"] == 1
    assert (r["estimate_a"], r["estimate_b"]) == (pytest.approx(0.35), pytest.approx(0.7))


def test_complete_data_gives_the_same_comparisons_as_before():
    rng = np.random.default_rng(3)
    t = scores({s: {f"i{k}": float(rng.random()) for k in range(12)} for s in ("M", "N", "human:top")})
    spec = [
        ComparisonSpec(Term.subject("M", "d"), Term.subject("human:top", "d")),
        ComparisonSpec(Term.subject("N", "d"), Term.subject("M", "d")),
    ]
    for method in ("percentile", "bca"):
        shared = bootstrap_study(
            t, {}, BootstrapOptions(800, 2, families=[Family("f", spec, shared_images=True)], method=method)
        ).comparisons
        own = bootstrap_study(t, {}, BootstrapOptions(800, 2, families=[Family("f", spec)], method=method)).comparisons
        assert shared.equals(own)
        assert shared.column("n_dropped").to_pylist() == [0, 0]


def test_a_family_without_shared_images_keeps_each_terms_own_images():
    # The error impact compares different groups of pairs: each term keeps its own images.
    t = scores({"M": {"i1": 0.5}, "human:top": {"i1": 0.7, "i2": 0.1}})
    fam = Family("own", [ComparisonSpec(Term.subject("M", "d"), Term.subject("human:top", "d"))])
    (r,) = bootstrap_study(t, {}, BootstrapOptions(500, 5, families=[fam])).comparisons.to_pylist()
    assert r["difference"] == pytest.approx(0.1) and r["n_dropped"] == 0


@pytest.mark.parametrize("options", [{"method": "bca"}, {"mode": "poisson"}, {"n_tasks": 3}])
def test_shared_images_hold_for_every_method_and_mode(options):
    rng = np.random.default_rng(8)
    human = {f"i{k}": float(rng.random()) for k in range(30)}
    model = {i: v + 0.1 for i, v in human.items() if i not in ("i0", "i1", "i2")}  # 0.1 above on its 27
    t = scores({"M": model, "human:top": human})
    res = bootstrap_study(t, {"M": "mllm", "human:top": "human"}, BootstrapOptions(600, 4, **options))
    r = comparison(res, "vs-humans", "M")
    assert r["difference"] == pytest.approx(0.1, abs=1e-12) and r["n_dropped"] == 3
    assert r["ci_low"] == pytest.approx(0.1, abs=1e-9) and r["ci_high"] == pytest.approx(0.1, abs=1e-9)


@pytest.mark.parametrize(
    ("setting", "says"),
    [({"n_resamples": 10**10}, "at most 1,000,000"), ({"seed": 2**80}, "2\\*\\*63"), ({"seed": -1}, "from 0")],
)
def test_the_engine_refuses_settings_it_cannot_keep(setting, says):
    from vlm_decade.stats import StatsInputError, analyse

    t = scores({"M": {"i1": 0.5, "i2": 0.4}})
    with pytest.raises(StatsInputError, match=says):
        analyse(t, {}, **{"n_resamples": 100, "seed": 0, **setting}, families=[])
