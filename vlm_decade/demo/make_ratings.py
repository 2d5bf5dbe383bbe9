"""Regenerate the demo's SIMULATED similarity ratings (data/ratings.csv) for the metric validation.

No person rated anything here. The paper had 16-20 raters score, 1 to 5, how similar a model's
description is to the image's gold-standard description; this script stands in for them:

* the rated pairs are `demo-imported`'s full-image captions (data/imported_captions.csv) against
  each photo's gold standard (the other demo model, `ssd-template`, writes its captions at run time,
  so it cannot be rated in advance);
* the gold standard is computed from the demo data as the pipeline computes it (materialize the demo
  into a temporary folder, then `vlm_decade.studies.decade.data.load_study_data`), and must still be the
  description LATENT below was judged against, else the script stops;
* LATENT holds, per caption, the demo author's own judgement of its similarity to that gold
  standard, 0 (unrelated or wrong) to 1 (says the same);
* each of N_RATERS simulated raters (`s01`..`s08`) rates round(1 + 4 * latent + bias + noise),
  clipped to 1..5, with a per-rater bias ~ N(0, BIAS_SD) and per-rating noise ~ N(0, NOISE_SD).

Randomness comes from numpy's default_rng seeded with (SEED, crc32(rater_id)) for the bias and
(SEED, crc32(rater_id), crc32(image_id)) for each rating, so the file is the same on every machine.

    python -m vlm_decade.demo.make_ratings            # rewrites vlm_decade/demo/data/ratings.csv
    python -m vlm_decade.demo.make_ratings --out X.csv
"""

from __future__ import annotations

import csv
import tempfile
import zlib
from pathlib import Path

import numpy as np

from vlm_decade.demo.make_votes import write_simulated

DATA_DIR = Path(__file__).resolve().parent / "data"
SEED = 20261130
SUBJECT = "demo-imported"
N_RATERS = 8
BIAS_SD = 0.4  # some raters are lenient, some strict
NOISE_SD = 0.6

# image_id -> (gold description it was judged against, latent similarity of demo-imported's caption to it)
LATENT: dict[str, tuple[str, float]] = {
    # "a woman in an orange jacket standing next to a flag": right person, colour and flag; no astronaut
    "astronaut": ("astronaut-w02", 0.55),
    # "a cup of coffee on a saucer on a table": right, without the espresso, spoon and colours
    "coffee": ("coffee-w05", 0.70),
    # "a close up of a cat looking at the camera": right, though the cat looks aside
    "chelsea": ("chelsea-w02", 0.70),
    # "a tall white tower in the middle of a city at night": misses the rocket and the launch pad
    "rocket": ("rocket-w02", 0.20),
    # "a man standing in a field with a camera": the scene, without the tripod and coat
    "camera": ("camera-w01", 0.75),
    # "a blurry photo of a clock on a wall": the gist exactly
    "clock": ("clock-w02", 0.80),
    # "a red motorcycle parked in a garage": the gist, without the vintage Yamaha, bench and bicycle
    # (w01 and w02 tie on votes and win rate; the ranking's seeded draw chose w02)
    "motorcycle": ("motorcycle-w02", 0.80),
    # "a bunch of coins sitting on a black table": right objects, not ancient, not a museum
    "coins": ("coins-w02", 0.60),
    # "a close up of a pizza on a plate": wrong
    "retina": ("retina-w02", 0.05),
    # "a bunch of lights in the dark at night": lights in the dark, but no galaxies or telescope
    "hubble_deep_field": ("hubble_deep_field-w05", 0.30),
    # "a black and white photo of a snow covered field": a gray surface, but not the moon
    "moon": ("moon-w05", 0.20),
    # "a close up of a plate of food with bread": wrong
    "immunohistochemistry": ("immunohistochemistry-w02", 0.05),
    # "a black and white photo of a brick wall": the gist exactly
    "brick": ("brick-w02", 0.80),
    # "a black and white photo of a field of grass": right, without the clover
    "grass": ("grass-w02", 0.70),
    # "a black and white photo of a pile of rocks": close (gravel, stones)
    "gravel": ("gravel-w01", 0.65),
    # "a close up of a piece of paper with writing on it": right, without what the text is about
    "page": ("page-w01", 0.55),
}


def gold_standards() -> dict[str, str]:
    """image_id -> description_id of its gold standard, computed from the demo data as a run does."""
    from vlm_decade import demo
    from vlm_decade.studies import load_study
    from vlm_decade.studies.decade.data import load_study_data

    with tempfile.TemporaryDirectory() as folder:
        cfg = load_study(demo.materialize(folder))
        references = load_study_data(cfg.data, cfg.ranking, cfg.masks).references
    return {r["image_id"]: r["description_id"] for r in references.to_pylist() if r["role"] == "gold"}


def _full_captions(path: Path = DATA_DIR / "imported_captions.csv") -> dict[str, str]:
    with path.open(encoding="utf-8", newline="") as f:
        return {r["image_id"]: r["text"] for r in csv.DictReader(f) if r["variant"] == "full"}


def simulate(gold: dict[str, str]) -> list[dict[str, str]]:
    captions = _full_captions()
    if set(captions) != set(LATENT):
        raise SystemExit(f"LATENT out of step with imported_captions.csv: {sorted(set(captions) ^ set(LATENT))}")
    stale = sorted(i for i, (judged, _) in LATENT.items() if gold.get(i) != judged)
    if stale:
        raise SystemExit(f"the gold standard changed for {stale}: judge those captions again in LATENT")
    rows = []
    for r in range(1, N_RATERS + 1):
        rater = f"s{r:02d}"
        key = zlib.crc32(rater.encode("utf-8"))
        bias = np.random.default_rng([SEED, key]).normal(0.0, BIAS_SD)
        for image_id in sorted(LATENT):
            noise = np.random.default_rng([SEED, key, zlib.crc32(image_id.encode("utf-8"))]).normal(0.0, NOISE_SD)
            rating = int(np.clip(np.rint(1 + 4 * LATENT[image_id][1] + bias + noise), 1, 5))
            rows.append({"rater_id": rater, "subject": SUBJECT, "image_id": image_id, "rating": str(rating)})
    return rows


def main(argv: list[str] | None = None) -> Path:
    fields = ["rater_id", "subject", "image_id", "rating"]
    simulated = lambda: simulate(gold_standards())  # noqa: E731 - the gold standards only once --out is read
    return write_simulated(argv, __doc__, DATA_DIR / "ratings.csv", fields, simulated, "simulated ratings")


if __name__ == "__main__":
    main()
