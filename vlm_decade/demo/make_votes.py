"""Regenerate the demo's SIMULATED ranking votes (data/votes.csv).

No person voted on these descriptions. Each full-image description in data/descriptions.csv gets a
quality score in QUALITY below: the demo author's own judgement of how well it describes the photo
(complete and correct near 1; vague, one-word or wrong near 0). The script then simulates the paper's
ranking design, scaled down:

* per image, N_RATERS raters (the same rater ids for every image);
* each rater sees the image's 10 full descriptions in 2 disjoint splits of 5 (2 trials), the split
  drawn at random per rater;
* every trial also shows 2 distractor descriptions drawn from other images (quality DISTRACTOR);
* the rater picks the best shown description with probability softmax(BETA * quality).

Randomness comes from numpy's default_rng seeded with (SEED, crc32(image_id)), so the file is the same
on every run and every machine, and one image's votes do not change when another image is edited.

    python -m vlm_decade.demo.make_votes            # rewrites vlm_decade/demo/data/votes.csv
    python -m vlm_decade.demo.make_votes --out X.csv
"""

from __future__ import annotations

import argparse
import csv
import io
import zlib
from pathlib import Path

import numpy as np

from vlm_decade.core.files import atomic_write_bytes

DATA_DIR = Path(__file__).resolve().parent / "data"
SEED = 20261129
N_RATERS = 12
SPLIT = 5  # descriptions of the image per trial
N_DISTRACTORS = 2  # descriptions of other images per trial
BETA = 10.0  # softmax inverse temperature over quality
DISTRACTOR = -0.5  # quality given to a description of another image

# Hand-assigned quality of each full description, 0 (useless or wrong) to 1 (complete and correct).
# Worker roles are loose: w07 is the careless one (often wrong), w03 and w09 write a word or a vague
# phrase, w02 and w05 write long and detailed, w06 guesses at context.
QUALITY: dict[str, float] = {
    # everyday
    "astronaut-w01": 0.85,
    "astronaut-w02": 0.90,
    "astronaut-w03": 0.15,
    "astronaut-w04": 0.40,
    "astronaut-w05": 0.80,
    "astronaut-w06": 0.55,
    "astronaut-w07": 0.05,
    "astronaut-w08": 0.70,
    "astronaut-w09": 0.10,
    "astronaut-w10": 0.75,
    "coffee-w01": 0.85,
    "coffee-w02": 0.85,
    "coffee-w03": 0.10,
    "coffee-w04": 0.40,
    "coffee-w05": 0.80,
    "coffee-w06": 0.45,
    "coffee-w07": 0.10,
    "coffee-w08": 0.75,
    "coffee-w09": 0.10,
    "coffee-w10": 0.70,
    "chelsea-w01": 0.85,
    "chelsea-w02": 0.90,
    "chelsea-w03": 0.20,
    "chelsea-w04": 0.45,
    "chelsea-w05": 0.80,
    "chelsea-w06": 0.50,
    "chelsea-w07": 0.05,
    "chelsea-w08": 0.70,
    "chelsea-w09": 0.10,
    "chelsea-w10": 0.75,
    "rocket-w01": 0.85,
    "rocket-w02": 0.90,
    "rocket-w03": 0.25,
    "rocket-w04": 0.50,
    "rocket-w05": 0.80,
    "rocket-w06": 0.60,
    "rocket-w07": 0.05,
    "rocket-w08": 0.75,
    "rocket-w09": 0.10,
    "rocket-w10": 0.70,
    "camera-w01": 0.90,
    "camera-w02": 0.85,
    "camera-w03": 0.25,
    "camera-w04": 0.40,
    "camera-w05": 0.80,
    "camera-w06": 0.45,
    "camera-w07": 0.25,
    "camera-w08": 0.75,
    "camera-w09": 0.05,
    "camera-w10": 0.65,
    "clock-w01": 0.85,
    "clock-w02": 0.90,
    "clock-w03": 0.10,
    "clock-w04": 0.50,
    "clock-w05": 0.75,
    "clock-w06": 0.60,
    "clock-w07": 0.05,
    "clock-w08": 0.75,
    "clock-w09": 0.10,
    "clock-w10": 0.80,
    "motorcycle-w01": 0.90,
    "motorcycle-w02": 0.85,
    "motorcycle-w03": 0.20,
    "motorcycle-w04": 0.45,
    "motorcycle-w05": 0.80,
    "motorcycle-w06": 0.45,
    "motorcycle-w07": 0.10,
    "motorcycle-w08": 0.65,
    "motorcycle-w09": 0.05,
    "motorcycle-w10": 0.60,
    "coins-w01": 0.80,
    "coins-w02": 0.90,
    "coins-w03": 0.20,
    "coins-w04": 0.45,
    "coins-w05": 0.85,
    "coins-w06": 0.50,
    "coins-w07": 0.05,
    "coins-w08": 0.75,
    "coins-w09": 0.05,
    "coins-w10": 0.65,
    # specialist
    "retina-w01": 0.90,
    "retina-w02": 0.85,
    "retina-w03": 0.20,
    "retina-w04": 0.45,
    "retina-w05": 0.70,
    "retina-w06": 0.55,
    "retina-w07": 0.05,
    "retina-w08": 0.75,
    "retina-w09": 0.15,
    "retina-w10": 0.70,
    "hubble_deep_field-w01": 0.85,
    "hubble_deep_field-w02": 0.85,
    "hubble_deep_field-w03": 0.20,
    "hubble_deep_field-w04": 0.35,
    "hubble_deep_field-w05": 0.75,
    "hubble_deep_field-w06": 0.55,
    "hubble_deep_field-w07": 0.05,
    "hubble_deep_field-w08": 0.75,
    "hubble_deep_field-w09": 0.20,
    "hubble_deep_field-w10": 0.70,
    "moon-w01": 0.80,
    "moon-w02": 0.85,
    "moon-w03": 0.25,
    "moon-w04": 0.55,
    "moon-w05": 0.75,
    "moon-w06": 0.50,
    "moon-w07": 0.05,
    "moon-w08": 0.70,
    "moon-w09": 0.10,
    "moon-w10": 0.75,
    "immunohistochemistry-w01": 0.85,
    "immunohistochemistry-w02": 0.80,
    "immunohistochemistry-w03": 0.15,
    "immunohistochemistry-w04": 0.45,
    "immunohistochemistry-w05": 0.70,
    "immunohistochemistry-w06": 0.45,
    "immunohistochemistry-w07": 0.05,
    "immunohistochemistry-w08": 0.80,
    "immunohistochemistry-w09": 0.10,
    "immunohistochemistry-w10": 0.75,
    "brick-w01": 0.85,
    "brick-w02": 0.80,
    "brick-w03": 0.30,
    "brick-w04": 0.50,
    "brick-w05": 0.80,
    "brick-w06": 0.45,
    "brick-w07": 0.05,
    "brick-w08": 0.65,
    "brick-w09": 0.10,
    "brick-w10": 0.70,
    "grass-w01": 0.85,
    "grass-w02": 0.85,
    "grass-w03": 0.30,
    "grass-w04": 0.45,
    "grass-w05": 0.75,
    "grass-w06": 0.55,
    "grass-w07": 0.15,
    "grass-w08": 0.80,
    "grass-w09": 0.15,
    "grass-w10": 0.70,
    "gravel-w01": 0.85,
    "gravel-w02": 0.85,
    "gravel-w03": 0.25,
    "gravel-w04": 0.40,
    "gravel-w05": 0.75,
    "gravel-w06": 0.60,
    "gravel-w07": 0.05,
    "gravel-w08": 0.65,
    "gravel-w09": 0.05,
    "gravel-w10": 0.70,
    "page-w01": 0.90,
    "page-w02": 0.85,
    "page-w03": 0.15,
    "page-w04": 0.50,
    "page-w05": 0.70,
    "page-w06": 0.45,
    "page-w07": 0.15,
    "page-w08": 0.75,
    "page-w09": 0.10,
    "page-w10": 0.55,
}


def _full_descriptions(path: Path) -> dict[str, list[str]]:
    """image_id -> sorted ids of its full-image descriptions."""
    by_image: dict[str, list[str]] = {}
    with path.open(encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            if row["condition"] == "full":
                by_image.setdefault(row["image_id"], []).append(row["description_id"])
    return {image: sorted(ids) for image, ids in sorted(by_image.items())}


def simulate(descriptions: Path = DATA_DIR / "descriptions.csv") -> list[dict[str, str]]:
    """The vote rows (image_id, rater_id, trial, shown, chosen) for every image, in a fixed order."""
    by_image = _full_descriptions(descriptions)
    missing = sorted(d for ids in by_image.values() for d in ids if d not in QUALITY)
    extra = sorted(set(QUALITY) - {d for ids in by_image.values() for d in ids})
    if missing or extra:
        raise SystemExit(f"QUALITY out of step with {descriptions}: missing {missing}, unknown {extra}")
    rows = []
    for image, ids in by_image.items():
        if len(ids) != 2 * SPLIT:
            raise SystemExit(f"{image}: expected {2 * SPLIT} full descriptions, found {len(ids)}")
        others = [d for other, o_ids in by_image.items() if other != image for d in o_ids]
        rng = np.random.default_rng([SEED, zlib.crc32(image.encode("utf-8"))])
        for r in range(1, N_RATERS + 1):
            order = rng.permutation(len(ids))
            for trial in (1, 2):
                own = [ids[k] for k in order[(trial - 1) * SPLIT : trial * SPLIT]]
                distractors = [others[k] for k in rng.choice(len(others), N_DISTRACTORS, replace=False)]
                shown = [*own, *distractors]
                shown = [shown[k] for k in rng.permutation(len(shown))]
                quality = np.array([QUALITY[d] if d in own else DISTRACTOR for d in shown])
                p = np.exp(BETA * (quality - quality.max()))
                chosen = shown[int(rng.choice(len(shown), p=p / p.sum()))]
                rows.append(
                    {
                        "image_id": image,
                        "rater_id": f"r{r:02d}",
                        "trial": str(trial),
                        "shown": ";".join(shown),
                        "chosen": chosen,
                    }
                )
    return rows


def write_simulated(argv: list[str] | None, doc: str, default: Path, fields: list[str], simulated, what: str) -> Path:
    """A demo generator's command: the rows `simulated()` makes written as a CSV of `fields` to
    `--out` (`default`), whole or not at all, and a line that says how many `what` it holds."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", type=Path, default=default)
    args = parser.parse_args(argv)
    rows = simulated()
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_bytes(args.out, text.getvalue().encode("utf-8"))
    print(f"wrote {len(rows)} {what} to {args.out}")
    return args.out


def main(argv: list[str] | None = None) -> Path:
    fields = ["image_id", "rater_id", "trial", "shown", "chosen"]
    return write_simulated(argv, __doc__, DATA_DIR / "votes.csv", fields, simulate, "simulated votes")


if __name__ == "__main__":
    main()
