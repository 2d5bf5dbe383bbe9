"""The `reliability` stage: how far Study A's human data can be trusted, as the table the report shows.

Per dataset and over all images, two measures from `reliability` (docs/human.md):

* `gold stability`: a bootstrap over the ranking's participants (the votes' `rater_id`) of how often
  a resample picks the gold standard all the votes pick, the mean over the dataset's voted images
  (`gold_stability`, the study's own ranking rule and tie draw). It has no CI: it is itself a share
  of resamples.
* `Krippendorff alpha (interval)`: the raters' agreement on the similarity ratings of the dataset's
  images (`ratings_alpha`); null where it is undefined (one rater, or a single value rated).

The stage runs when the study has votes or ratings. The votes are read from the study's votes file as
the study's check read them (it refused the run had any been bad); the stage reruns when that file's
content, the ratings, the references table or the seeds change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from vlm_decade.core.errors import Problems
from vlm_decade.core.files import file_sha256
from vlm_decade.core.fingerprints import table_fingerprint
from vlm_decade.core.runner import Stage, StudyRun
from vlm_decade.core.tables import read_table
from vlm_decade.studies.decade.data import FULL, VOTE_COLUMNS
from vlm_decade.studies.decade.human.reliability import gold_stability, ratings_alpha, vote_matrices

STABILITY = "gold stability"
ALPHA = "Krippendorff alpha (interval)"
ALL = "all"  # the row over every dataset's images
N_RESAMPLES = 1000  # bootstrap resamples of the participants: the share's standard error is at most 0.016
VERSION = 1  # part of the stage's settings: bump it when the table's computation changes
REFERENCE_COLUMNS = ("image_id", "description_id", "dataset", "condition")
RELIABILITY_SCHEMA = pa.schema(
    [
        ("dataset", pa.string()),  # a dataset, or "all"
        ("measure", pa.string()),  # STABILITY | ALPHA
        ("value", pa.float64()),
        ("participants", pa.int64()),  # the ranking's participants, or the raters
        ("items", pa.int64()),  # voted images, or rated (subject, image) pairs
        ("n_resamples", pa.int64()),  # STABILITY's; null for ALPHA
        ("seed", pa.int64()),  # STABILITY's; null for ALPHA
    ]
)


def reliability_table(
    votes: Sequence[Mapping] | None,
    ratings: Sequence[Mapping] | None,
    references: Sequence[Mapping],
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
    ranking_seed: int = 0,
) -> pa.Table:
    """The `reliability` table from the votes rows (image_id, rater_id, shown, chosen), the ratings
    rows (rater_id, subject, image_id, rating) and the references rows (`REFERENCE_COLUMNS`): per
    dataset, then over all, each measure the data allows. `seed`: the bootstrap's; `ranking_seed`:
    the study's `ranking.seed` (its tie draw)."""
    dataset_of = {r["image_id"]: r["dataset"] for r in references}
    rows = []
    if votes:
        rows += _stability_rows(votes, references, dataset_of, n_resamples, seed, ranking_seed)
    if ratings:
        rows += _alpha_rows(ratings, dataset_of)
    return pa.Table.from_pylist(rows, schema=RELIABILITY_SCHEMA)


def _groups(images, dataset_of: Mapping[str, str]) -> list[tuple[str, set[str]]]:
    """Each dataset's images of `images`, sorted by dataset, then all of them."""
    by: dict[str, set[str]] = {}
    for image in images:
        by.setdefault(dataset_of[image], set()).add(image)
    return sorted(by.items()) + [(ALL, set(images))]


def _stability_rows(votes, references, dataset_of, n_resamples: int, seed: int, ranking_seed: int) -> list[dict]:
    voted = {v["image_id"] for v in votes}
    own: dict[str, list[str]] = {}
    for r in references:
        if r["condition"] == FULL and r["image_id"] in voted:
            own.setdefault(r["image_id"], []).append(r["description_id"])
    data = vote_matrices(votes, own)
    shares = gold_stability(data, n_resamples, seed, ranking_seed)
    rows = []
    for dataset, images in _groups(data.images, dataset_of):
        participants = {str(v["rater_id"]) for v in votes if v["image_id"] in images}
        value = float(np.mean([shares[i] for i in images]))
        rows.append(_row(dataset, STABILITY, value, len(participants), len(images), n_resamples, seed))
    return rows


def _alpha_rows(ratings, dataset_of) -> list[dict]:
    rows = []
    for dataset, images in _groups({r["image_id"] for r in ratings}, dataset_of):
        rated = [r for r in ratings if r["image_id"] in images]
        raters = {r["rater_id"] for r in rated}
        units = {(r["subject"], r["image_id"]) for r in rated}
        rows.append(_row(dataset, ALPHA, _alpha(rated) if len(raters) > 1 else None, len(raters), len(units)))
    return rows


def _alpha(rated: Sequence[Mapping]) -> float | None:
    try:
        return ratings_alpha(rated)
    except ValueError:  # one value in the whole domain: agreement beyond chance is undefined
        return None


def _row(dataset, measure, value, participants, items, n_resamples=None, seed=None) -> dict:
    return dict(zip(RELIABILITY_SCHEMA.names, (dataset, measure, value, participants, items, n_resamples, seed)))


def read_votes(path: str | Path) -> list[dict]:
    """The votes file's rows, read as the study's check reads them (`data.VOTE_COLUMNS`)."""
    problems = Problems()
    table = read_table(Path(path), VOTE_COLUMNS, problems, lists=("shown",))
    problems.raise_if_any()
    return table.columns.to_pylist()


def stage(study, ratings: pa.Table | None) -> Stage:
    """The `reliability` table of a study with votes (`data.votes`) or ratings (checked, `ratings`),
    its bootstrap seeded from `statistics.seed`."""
    votes, seed, ranking_seed = study.data.votes, study.statistics.seed, study.ranking.seed

    def compute(run: StudyRun) -> dict[str, pa.Table]:
        references = run.table("references", REFERENCE_COLUMNS).to_pylist()
        voted = read_votes(votes) if votes is not None else None
        rated = ratings.to_pylist() if ratings is not None else None
        return {"reliability": reliability_table(voted, rated, references, N_RESAMPLES, seed, ranking_seed)}

    settings = [
        file_sha256(votes) if votes is not None else None,
        table_fingerprint(ratings) if ratings is not None else None,
        seed,
        ranking_seed,
        N_RESAMPLES,
        VERSION,
    ]
    return Stage("reliability", ("references",), settings, compute, needs_ray=False)
