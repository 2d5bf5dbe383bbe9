"""Study A's input: read and check the images, human descriptions and votes, and rank the descriptions.

`load_study_data` reads the tables of docs/data-format.md (or a COCO captions JSON, `studies.forms`; the
images from `data.shards`, `stages.shard_images`), decodes every image once, and checks everything before
it ranks anything: all problems (file, spreadsheet row, field) come back together as one InputError, which
carries the image ids the images table names (for the checks of the files that refer to images). It writes
nothing. The result is the run folder's `images` and `references` tables (DESIGN.md) and each dataset's ranking method.

`thin_human_data` says what the human data is too thin to support (a gold standard chosen by votes
or consensus, the top- and bottom-ranked groups, spatial dependence): `validate` warns of it and
the report says it where the missing figure would be.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.columns import first_rows, run_starts
from vlm_decade.core.errors import InputError, Problems
from vlm_decade.core.runner import release_memory
from vlm_decade.core.tables import Table, cell_present, cell_text, cells_filled, read_table
from vlm_decade.imaging.masks import MaskConfig, mask_ids
from vlm_decade.stages.images import (
    IMAGE_COLUMNS,
    ImageCache,
    check_group_by,
    check_images,
    declared_ids,
    images_table,
    metadata_table,
)
from vlm_decade.stages.shard_images import study_shard_images
from vlm_decade.studies.decade.config import DataConfig, RankingConfig, StudyConfig
from vlm_decade.studies.decade.ranking import ROLES, consensus_places, group_sizes, rank_by_votes, roles_of_places
from vlm_decade.studies.decade.taxonomy.spatial import MIN_MASKED_PER_MASK, MIN_MASKS
from vlm_decade.studies.forms import coco_tables, json_path, name_rows

DESCRIPTION_COLUMNS = ("description_id", "image_id", "worker_id", "condition", "text")
VOTE_COLUMNS = ("image_id", "rater_id", "trial", "shown", "chosen")

FULL = "full"
MASKED = "masked"
VOTES, CONSENSUS = "votes", "consensus"

REFERENCES_SCHEMA = pa.schema(
    [
        ("description_id", pa.string()),
        ("image_id", pa.string()),
        ("dataset", pa.string()),
        ("condition", pa.string()),
        ("worker_id", pa.string()),
        ("role", pa.string()),
        ("votes", pa.int64()),
        ("shown", pa.int64()),
        ("text", pa.string()),
    ]
)


@dataclass(frozen=True)
class StudyData:
    """Study A's checked input: the run folder's `images` and `references` tables (docs/data-format.md)."""

    images: pa.Table
    references: pa.Table
    ranking_method: dict[str, str]  # dataset -> "votes" | "consensus"
    metadata: pa.Table | None = None  # image_id and the images table's further columns (stages.images.metadata_table)
    ratings: pa.Table | None = None  # human similarity ratings, when the study has them (metric_validation)
    hand_labels: pa.Table | None = None  # hand error labels, when the study has them (taxonomy)
    incomplete: tuple[str, ...] = ()  # what imported models' files lack (`imported.missing_rows`), said before a run


def load_study_data(
    data: DataConfig,
    ranking: RankingConfig,
    masks: MaskConfig,
    cache: ImageCache | None = None,
    group_by: tuple[str, ...] = (),
    images_checked: Callable[[pa.ChunkedArray | None, pa.Table | None], None] = lambda image_ids, images: None,
    images_named: Callable[[pa.Array], None] = lambda image_ids: None,
    limit: int | None = None,
) -> StudyData:
    """Read, check and rank Study A's input; every problem is raised together as one InputError.
    `group_by`: the study's `analysis.group_by`, each a column the images table must have.
    `images_named` is given every id the images table names as soon as it is read, before its
    images are checked. `images_checked` is given the image ids once the images are checked and
    before the descriptions are read (those that passed, or every id the table names when any did
    not; None when it could not be read) and the images table (None unless every image passed),
    for what needs the ids and memory of its own (the models' files). `limit`: a smoke run's, whose
    images alone are read (`check_images`)."""
    problems = Problems()
    images_t, descriptions_t = read_forms(data, problems)
    images = descriptions = known = None
    if data.shards is not None:  # the images, checked as the shards are read, and their table
        images_t, images = study_shard_images(data, images_t, problems, cache, limit) or (None, None)
    if images_t is not None:
        # References are checked against every id the table names, so one bad images row is one
        # problem, not one more for each description and vote of its image.
        known = declared_ids(images_t)
        images_named(known)
        # Checked before the descriptions are read: what checking a million images holds is let go first.
        if data.shards is None:
            images = check_images(images_t, data.image_dir, problems, cache, data.background, limit=limit)
        check_group_by(group_by, images_t, problems)
    table = None  # the images table, once every image passed
    if images is not None and not problems:
        table = images_table(images, data.background)
        images_checked(table.column("image_id"), table)
    else:
        images_checked(None if known is None else pa.chunked_array([known]), None)
    if images is not None:  # what the checks below read of it: the rest is in `table`, not held twice
        images = images.select(["image_id", "row", "dataset"])
    # What the checks of the images and the models' files freed is given back before the descriptions
    # are held: kept by the allocators, it stayed beside them (up to 0.6 GB at a million images).
    release_memory()
    if data.captions_json is None:
        descriptions_t = read_table(Path(data.descriptions), DESCRIPTION_COLUMNS, problems)
    votes_t = read_table(Path(data.votes), VOTE_COLUMNS, problems, lists=("shown",)) if data.votes is not None else None
    if descriptions_t is not None:
        held_by = "the images table" if data.shards is None or data.images is not None else "any shard"
        descriptions = _check_descriptions(descriptions_t, known, [FULL, *mask_ids(masks)], problems, held_by)
    if images is not None and descriptions is not None:
        _check_every_image_has_full(images_t, images, descriptions, descriptions_t.name, problems)
    tally = _Tally()
    if votes_t is not None and known is not None and descriptions is not None:
        tally = _check_votes(votes_t, known, descriptions, descriptions_t.text("description_id"), problems)
    methods = _ranking_methods(images, tally, votes_t, problems) if images is not None else {}
    if data.captions_json is not None:
        # The reader names and leaves out the bad captions; what the shared checks find at a row is
        # of an image, its index in `images`: named by its JSON path.
        name_rows(problems, data.captions_json, json_path("images", {"image_id": "id", "file": "file_name"}))
    if problems:
        raise InputError(problems.items, image_ids=None if known is None else set(known.to_pylist()))
    del descriptions_t  # what is kept of it is in `descriptions` (its own columns, when every row was kept in order)
    descriptions = descriptions.drop_columns(["row"])  # the rows' numbers, for problems: there are none

    return StudyData(
        images=table,
        references=_references_table(images, descriptions, tally, methods, ranking),
        ranking_method=methods,
        metadata=metadata_table(images_t, images),
    )


def read_forms(data: DataConfig, problems: Problems) -> tuple[Table | None, Table | None]:
    """The images table and, from a captions JSON, the descriptions table (None: read later, from
    its own table, once the images are checked and let go)."""
    if data.shards is not None:  # the images are the shards' (`check_shard_images`), or this table's
        return (read_table(Path(data.images), IMAGE_COLUMNS[:2], problems, extra=True) if data.images else None), None
    if data.captions_json is None:
        return read_table(Path(data.images), IMAGE_COLUMNS, problems, extra=True), None
    read = coco_tables(data.captions_json, data.dataset or Path(data.captions_json).stem, problems)
    return read if read is not None else (None, None)


# --- descriptions ----------------------------------------------------------------------------------

_ID_COLUMNS = DESCRIPTION_COLUMNS[:4]


def _check_descriptions(
    table: Table, known: pa.Array | None, conditions: list[str], problems: Problems, held_by: str = "the images table"
) -> pa.Table:
    """The descriptions that passed their checks (row, then DESCRIPTION_COLUMNS as text), sorted by
    image, condition and id (the references table's order). The checks run on whole columns; only
    the rows found bad are looked at one by one, to say what is wrong with each."""
    blank = {c: table.blank(c) for c in _ID_COLUMNS}
    ids_ok = ~np.logical_or.reduce(list(blank.values()))
    text_empty = table.blank("text")
    description_id, image_id, condition = (table.text(c) for c in ("description_id", "image_id", "condition"))
    known_ok = _is_in(image_id, known) if known is not None else np.ones(len(table), bool)
    condition_ok = _is_in(condition, pa.array(conditions, pa.string()))
    # A description is kept at the first row that passes every check; a later row with its id is a duplicate.
    first = first_rows(pa.table({"description_id": description_id}), ids_ok & known_ok & condition_ok)
    duplicate = ids_ok & (first >= 0) & (first < np.arange(len(table)))
    kept = ids_ok & ~duplicate & known_ok & condition_ok
    numbers = table.numbers.to_numpy()
    for i in np.flatnonzero(~kept | text_empty):
        row = int(numbers[i])
        for column in _ID_COLUMNS:
            if blank[column][i]:
                problems.add(table.file, f"'{column}' is empty", row=row, field=column)
        if text_empty[i]:
            problems.add(table.file, "'text' is empty or only whitespace", row=row, field="text")
        if not ids_ok[i]:
            continue
        if duplicate[i]:
            message = f"duplicate description_id '{description_id[i].as_py()}' (first at row {numbers[first[i]]})"
            problems.add(table.file, message, row=row, field="description_id")
            continue
        if not known_ok[i]:
            message = f"unknown image_id '{image_id[i].as_py()}' (not in {held_by})"
            problems.add(table.file, message, row=row, field="image_id")
        if not condition_ok[i]:
            message = f"unknown condition '{condition[i].as_py()}': expected one of {', '.join(conditions)}"
            problems.add(table.file, message, row=row, field="condition")
    checked = pa.table({"row": table.numbers} | {c: table.text(c) for c in DESCRIPTION_COLUMNS})
    if kept.all() and _in_order(checked, _REFERENCE_ORDER):
        return checked  # every row kept, in order already: the table's own columns, not a copy
    order = pc.sort_indices(checked, sort_keys=[(c, "ascending") for c in _REFERENCE_ORDER]).to_numpy()
    return checked.take(pa.array(order[kept[order]], pa.int64()))


_REFERENCE_ORDER = ("image_id", "condition", "description_id")


def _in_order(table: pa.Table, columns: tuple[str, ...]) -> bool:
    """Whether the rows are sorted by `columns` (ties kept in row order: a stable sort leaves
    them as they are), each row compared with the next."""
    n = table.num_rows
    before = np.zeros(max(n - 1, 0), bool)  # a row decided to be before the next by an earlier column
    for column in columns:
        values = table.column(column)
        this, following = values.slice(0, n - 1), values.slice(1)
        if not np.all(before | pc.less_equal(this, following).fill_null(False).to_numpy(zero_copy_only=False)):
            return False
        before |= pc.less(this, following).fill_null(False).to_numpy(zero_copy_only=False)
    return True


def _is_in(values: pa.Array, known: pa.Array) -> np.ndarray:
    return pc.is_in(values, value_set=known).to_numpy(zero_copy_only=False)


def _check_every_image_has_full(
    table: Table, images: pa.Table, descriptions: pa.Table, source: str, problems: Problems
) -> None:
    with_full = pc.unique(pc.filter(descriptions.column("image_id"), pc.equal(descriptions.column("condition"), FULL)))
    lacking = images.filter(pc.invert(pc.is_in(images.column("image_id"), value_set=with_full)))
    for image_id, row in zip(lacking.column("image_id").to_pylist(), lacking.column("row").to_pylist()):
        problems.add(table.file, f"image '{image_id}' has no 'full' description in {source}", row=row, field="image_id")


# --- votes -----------------------------------------------------------------------------------------


@dataclass
class _Tally:
    """Per description: times chosen best and times shown, counting only votes for its own image."""

    votes: Counter = field(default_factory=Counter)
    shown: Counter = field(default_factory=Counter)
    images_with_votes: set[str] = field(default_factory=set)


def _check_votes(
    table: Table,
    known_ids: pa.Array,
    kept: pa.Table,
    declared_ids: pa.Array,
    problems: Problems,
) -> _Tally:
    """Check each vote and tally the good ones.

    `declared_ids` holds every id in the descriptions table, `kept` only the rows that passed their
    checks: a vote naming a rejected description is not counted, but is not reported again either.
    The votes are read row by row; of the descriptions and images, only those they name become Python.
    """
    named = {cell_text(row, "chosen") for row in table.rows} | {
        d for r in table.rows for d in _shown_ids(r.cells["shown"])
    }
    named_ids = pa.array(sorted(named), pa.string())
    at = kept.filter(pc.is_in(kept.column("description_id"), value_set=named_ids))
    descriptions = dict(
        zip(
            at.column("description_id").to_pylist(), zip(*(at.column(c).to_pylist() for c in ("image_id", "condition")))
        )
    )
    declared = set(named_ids.filter(pc.is_in(named_ids, value_set=declared_ids)).to_pylist())
    images = pa.array(sorted({cell_text(row, "image_id") for row in table.rows}), pa.string())
    known = set(images.filter(pc.is_in(images, value_set=known_ids)).to_pylist())
    tally = _Tally()
    keyed = ("image_id", "rater_id", "trial")
    # A vote is matched with earlier ones once its cells are all there and its image is known.
    first = first_rows(
        pa.table({c: [cell_text(row, c) for row in table.rows] for c in keyed}),
        np.array([cells_filled(row, VOTE_COLUMNS) and cell_text(row, "image_id") in known for row in table.rows], bool),
    )
    for i, row in enumerate(table.rows):
        if not cell_present(row, table, VOTE_COLUMNS, problems):
            continue
        errors: list[tuple[str, str]] = []  # (field, message) for this row
        image_id, chosen = cell_text(row, "image_id"), cell_text(row, "chosen")
        key = (image_id, cell_text(row, "rater_id"), cell_text(row, "trial"))
        shown = _shown_ids(row.cells["shown"])
        own = [d for d in shown if d in descriptions and descriptions[d][0] == image_id]
        if image_id not in known:
            errors.append(("image_id", f"unknown image_id '{image_id}' (not in the images table)"))
        elif first[i] != i:
            message = f"duplicate vote: rater '{key[1]}', trial '{key[2]}' on image '{image_id}'"
            errors.append(("trial", f"{message} (first at row {table.rows[first[i]].number})"))
        else:
            if not shown:
                errors.append(("shown", "'shown' lists no description ids"))
            for description_id, n in Counter(shown).items():
                if description_id not in declared:
                    errors.append(("shown", f"unknown description id '{description_id}' in 'shown'"))
                elif n > 1:
                    errors.append(("shown", f"'shown' lists '{description_id}' {n} times"))
            if shown and not own and all(d in descriptions for d in shown):
                errors.append(("shown", f"'shown' has no description of image '{image_id}'"))
            if chosen not in declared:
                errors.append(("chosen", f"unknown description id '{chosen}' in 'chosen'"))
            elif chosen not in shown:
                errors.append(("chosen", f"chosen '{chosen}' is not among the shown descriptions"))
        for column, message in errors:
            problems.add(table.file, message, row=row.number, field=column)
        if errors or not all(d in descriptions for d in (*shown, chosen)):
            continue
        tally.shown.update(own)
        # A distractor (another image's description) chosen as best counts for nothing.
        if descriptions[chosen][0] == image_id:
            tally.votes[chosen] += 1
        if any(descriptions[d][1] == FULL for d in own):
            tally.images_with_votes.add(image_id)
    return tally


def _shown_ids(value: str | list[str]) -> list[str]:
    parts = value if isinstance(value, list) else value.split(";")
    return [p.strip() for p in parts if p.strip()]


def _ranking_methods(images: pa.Table, tally: _Tally, votes_t: Table | None, problems: Problems) -> dict[str, str]:
    """Per dataset: "votes" if every image has votes, "consensus" if none has; a mix is a problem."""
    voted = pa.array(sorted(tally.images_with_votes), pa.string())
    without = pc.invert(pc.is_in(images.column("image_id"), value_set=voted))
    datasets = images.column("dataset")
    methods = {}
    for dataset in sorted(pc.unique(datasets).to_pylist()):
        of = pc.equal(datasets, dataset)
        lacking = images.column("image_id").filter(pc.and_(of, without))
        if not len(lacking):
            methods[dataset] = VOTES
        elif len(lacking) == pc.sum(of).as_py():
            methods[dataset] = CONSENSUS
        else:
            problems.add(
                votes_t.file,
                f"dataset '{dataset}' has votes for some images but none showing a 'full' description of "
                f"{len(lacking)} image(s): {', '.join(sorted(lacking.to_pylist()))}",
                field="image_id",
            )
    return methods


_SLAB = 1 << 16  # descriptions ranked at a time: the Python objects ranking needs live for one slab
ROLE_NAMES = pa.array([*ROLES, MASKED], pa.string())  # `roles_of_places`' codes, and one for a masked description


def _references_table(
    images: pa.Table, descriptions: pa.Table, tally: _Tally, methods: dict[str, str], cfg: RankingConfig
) -> pa.Table:
    """`descriptions` (sorted by image, condition and id: `_check_descriptions`) with their
    datasets, roles and vote counts. The images of datasets ranked by consensus are ranked a slab
    at a time on arrays (`consensus_places`), a slab per core at once (an image's roles are its
    own: slabs on threads give what one after another gives); those ranked by votes one at a time."""
    image_ids = descriptions.column("image_id").combine_chunks()
    dataset = images.column("dataset").take(pc.index_in(image_ids, value_set=images.column("image_id")))
    descriptions = descriptions.append_column("dataset", dataset)
    # Each image's descriptions are contiguous: slabs end where an image does.
    starts = run_starts(image_ids)
    by_consensus = pa.array([d for d, m in methods.items() if m == CONSENSUS], pa.string())
    voted = bool(tally.votes or tally.shown)
    # Nothing voted on: every count is 0, one array of zeros for both columns.
    zeros = None if voted else pa.array(np.zeros(len(descriptions), np.int64))
    bounds = [0]
    while bounds[-1] < len(descriptions):
        at = np.searchsorted(starts, bounds[-1] + _SLAB)  # the first image that starts a slab's length on
        bounds.append(int(starts[at]) if at < len(starts) else len(descriptions))

    def slab_columns(begin: int, end: int) -> tuple[pa.Array, pa.Array, pa.Array]:
        slab = descriptions.slice(begin, end - begin)
        full = pc.equal(slab.column("condition"), FULL)
        codes = np.full(slab.num_rows, len(ROLES), np.int8)  # masked, unless ranked below
        consensus = pc.and_(full, pc.is_in(slab.column("dataset"), value_set=by_consensus))
        codes[_where(consensus)] = _consensus_codes(slab.filter(consensus), cfg)
        by_votes = _where(pc.and_(full, pc.invert(consensus)))
        if len(by_votes):
            codes[by_votes] = _vote_codes(slab.take(pa.array(by_votes)), tally, cfg)
        roles = ROLE_NAMES.take(pa.array(codes))
        if not voted:
            return roles, zeros.slice(begin, slab.num_rows), zeros.slice(begin, slab.num_rows)
        ids = slab.column("description_id").to_pylist()
        return roles, *(pa.array([counts[i] for i in ids], pa.int64()) for counts in (tally.votes, tally.shown))

    with ThreadPoolExecutor(os.cpu_count()) as pool:
        slabs = list(pool.map(slab_columns, bounds[:-1], bounds[1:]))
    roles, votes, shown = ([slab[k] for slab in slabs] for k in range(3))
    columns = {c: descriptions.column(c) for c in ("description_id", "image_id", "dataset", "condition", "worker_id")}
    columns |= {"role": pa.chunked_array(roles, pa.string()), "votes": pa.chunked_array(votes, pa.int64())}
    columns |= {"shown": pa.chunked_array(shown, pa.int64()), "text": descriptions.column("text")}
    return pa.table(columns, schema=REFERENCES_SCHEMA)


def _where(mask: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return np.flatnonzero(pc.fill_null(mask, False).to_numpy(zero_copy_only=False))


def _consensus_codes(rows: pa.Table, cfg: RankingConfig) -> np.ndarray:
    """The role codes of full descriptions of images ranked by consensus (each image's contiguous)."""
    if not rows.num_rows:
        return np.zeros(0, np.int8)
    image = rows.column("image_id")
    first = run_starts(image)
    streams = image.take(pa.array(first)).to_pylist()
    texts, ids = (rows.column(c).combine_chunks() for c in ("text", "description_id"))
    places = consensus_places(ids, texts, first, streams, cfg.seed)
    counts = np.diff(np.append(first, rows.num_rows))
    return roles_of_places(places, np.repeat(counts, counts), cfg.top_k, cfg.bottom_k)


def _vote_codes(rows: pa.Table, tally: _Tally, cfg: RankingConfig) -> np.ndarray:
    """The role codes of full descriptions of images ranked by votes, an image at a time."""
    image, ids = rows.column("image_id").to_pylist(), rows.column("description_id").to_pylist()
    first = run_starts(rows.column("image_id")).tolist()
    codes = []
    for a, b in zip(first, [*first[1:], len(ids)]):
        ranked = rank_by_votes(
            ids[a:b], tally.votes, tally.shown, cfg.top_k, cfg.bottom_k, seed=cfg.seed, stream=image[a]
        )
        codes += [ROLES.index(ranked[i]) for i in ids[a:b]]
    return np.array(codes, np.int8)


# --- what the human data can support -----------------------------------------------------------------

# Votes choose between an image's descriptions: a lone description is the gold standard by no vote.
MIN_FOR_VOTES = 2
# Two descriptions are exactly as similar to each other: the consensus rule needs a third to choose.
MIN_FOR_CONSENSUS = 3
# The gold standard and one description for each of the top and bottom groups (`group_sizes`).
MIN_FOR_GROUPS = next(n for n in count(1) if min(group_sizes(n, 1, 1)) > 0)
GOLD_NOTE, GROUPS_NOTE, MASKED_NOTE = "gold", "groups", "masked"


@dataclass(frozen=True)
class ThinData:
    """One thing the human data cannot support: `validate` warns of it (an error with --strict) and the
    report says it where the missing figure would be. `topic`: the gold standard (`GOLD_NOTE`), the
    top- and bottom-ranked groups (`GROUPS_NOTE`) or spatial dependence (`MASKED_NOTE`); `dataset`:
    the dataset it concerns (None: all of them)."""

    topic: str
    dataset: str | None
    message: str


def thin_human_data(study: StudyConfig, references: pa.Table, methods: Mapping[str, str]) -> list[ThinData]:
    """What the descriptions (the `references` table) are too few for, given the study's ranking,
    masks and models and each dataset's ranking method (`methods`); each says the file, the counts,
    and what the report will lack and why. Counted on the columns: what becomes Python is a count of
    images per number of descriptions."""
    source = str(study.data.source)
    rows = references.select(["image_id", "dataset", "condition"])
    full = pc.cast(pc.equal(rows.column("condition"), FULL), pa.int64())
    per_image = rows.append_column("full", full).group_by(["image_id", "dataset"], use_threads=False)
    per_image = per_image.aggregate([("full", "sum")])
    found: list[ThinData] = []
    for dataset in sorted(pc.unique(per_image.column("dataset")).to_pylist()):
        counts = _histogram(per_image.column("full_sum").filter(pc.equal(per_image.column("dataset"), dataset)))
        found += _thin_gold(source, dataset, counts, methods.get(dataset))
        found += _thin_groups(source, dataset, counts, study.ranking)
    found += _thin_masked(study, source, rows)
    return found


def _histogram(values: pa.ChunkedArray) -> Counter:
    """How many times each value occurs (here: how many images have each number of descriptions)."""
    counted = pc.value_counts(values)
    return Counter(dict(zip(counted.field("values").to_pylist(), counted.field("counts").to_pylist())))


def _images_with(few: Counter, of: int, dataset: str, below: int) -> str:
    """ "3 of 5 images of dataset 'x' have 1 description", or "... have fewer than 3 (2 have 1, 1 has 2)".
    `few`: how many images have each number of descriptions."""
    n_few = sum(few.values())
    where = f"{n_few} of {of} images" + (f" of dataset '{dataset}'" if dataset else "")
    by = sorted(few.items())
    if len(by) == 1:
        n = by[0][0]
        return f"{where} {'has' if n_few == 1 else 'have'} {n} description{'' if n == 1 else 's'}"
    counted = ", ".join(f"{k} {'has' if k == 1 else 'have'} {n}" for n, k in by)
    return f"{where} have fewer than {below} descriptions ({counted})"


def _below(counts: Counter, low: int, high: int) -> Counter:
    """The part of a histogram of description counts from `low` to below `high`."""
    return Counter({n: k for n, k in counts.items() if low <= n < high})


def _thin_gold(source: str, dataset: str, counts: Counter, method: str | None) -> list[ThinData]:
    if method == CONSENSUS:
        few = _below(counts, 0, MIN_FOR_CONSENSUS)
        why = (
            f"the consensus rule (the description most similar to the others) needs at least {MIN_FOR_CONSENSUS} "
            "to choose: on those images the report's gold standard was chosen by no one (the only description, "
            "or a seeded draw between two)"
        )
        need = MIN_FOR_CONSENSUS
    elif method == VOTES:
        few = _below(counts, 0, MIN_FOR_VOTES)
        why = (
            f"votes choose between at least {MIN_FOR_VOTES} descriptions: on those images the report's gold "
            "standard is the only description, chosen by no vote"
        )
        need = MIN_FOR_VOTES
    else:
        return []
    if not few:
        return []
    of = sum(counts.values())
    return [ThinData(GOLD_NOTE, dataset, f"{source}: {_images_with(few, of, dataset, need)}; {why}")]


def _thin_groups(source: str, dataset: str, counts: Counter, ranking: RankingConfig) -> list[ThinData]:
    found = []
    of = sum(counts.values())
    few = _below(counts, 0, MIN_FOR_GROUPS)
    if few:
        rest = of - sum(few.values())
        missing = (
            f"the report has no top- or bottom-ranked human bands for '{dataset}' and no comparison with them"
            if not rest
            else f"the human bands and comparisons of '{dataset}' rest on the other {rest} images"
        )
        found.append(
            ThinData(
                GROUPS_NOTE,
                dataset,
                f"{source}: {_images_with(few, of, dataset, MIN_FOR_GROUPS)}; the top- and bottom-ranked "
                f"human groups need at least {MIN_FOR_GROUPS} (the gold standard and one for each): {missing}",
            )
        )
    asked = 1 + ranking.top_k + ranking.bottom_k
    small = _below(counts, MIN_FOR_GROUPS, asked)
    if small:
        found.append(
            ThinData(
                GROUPS_NOTE,
                dataset,
                f"{source}: {_images_with(small, of, dataset, asked)}; groups of ranking.top_k "
                f"{ranking.top_k} and ranking.bottom_k {ranking.bottom_k} need {asked} (with the gold standard): "
                f"on those images each group has at most (n - 1) // 2, so the human bands of '{dataset}' are drawn "
                "from smaller groups than asked",
            )
        )
    return found


def _thin_masked(study: StudyConfig, source: str, rows: pa.Table) -> list[ThinData]:
    """Spatial dependence (a taxonomy with models that describe the masked variants) needs at least
    MIN_MASKS masks and MIN_MASKED_PER_MASK human descriptions of each mask of an image. `rows`: the
    references' image_id, dataset and condition."""
    models = [m.name for m in study.models if m.variants == "all"]
    if study.taxonomy is None or not models:
        return []
    masks = mask_ids(study.masks)
    who = f"{', '.join(models)} describe{'s' if len(models) == 1 else ''} the masked variants (variants: all)"
    if len(masks) < MIN_MASKS:
        message = (
            f"masks: {len(masks)} masked variant(s) and {who}; spatial dependence correlates profiles over at "
            f"least {MIN_MASKS} regions: the report has no spatial dependence labels and no heat maps"
        )
        return [ThinData(MASKED_NOTE, None, message)]
    masked = rows.filter(pc.not_equal(rows.column("condition"), FULL))
    if not masked.num_rows:
        message = (
            f"{source} has no masked descriptions (condition {', '.join(masks)}) and {who}; spatial dependence "
            "compares a model's masked descriptions with people's: the report has no spatial dependence "
            "labels and no heat maps"
        )
        return [ThinData(MASKED_NOTE, None, message)]
    per_mask = masked.group_by(["image_id", "condition"], use_threads=False).aggregate([("dataset", "count")])
    enough = per_mask.filter(pc.greater_equal(per_mask.column("dataset_count"), MIN_MASKED_PER_MASK))
    images = pc.unique(rows.column("image_id"))
    covered = images  # the images with enough descriptions of every mask
    for mask in masks:
        of_mask = enough.filter(pc.equal(enough.column("condition"), mask)).column("image_id")
        covered = covered.filter(pc.is_in(covered, value_set=of_mask))
    few = len(images) - len(covered)
    if not few:
        return []
    empty = "; the spatial panel is empty" if not len(covered) else ""
    message = (
        f"{source}: {few} of {len(images)} images have fewer than {MIN_MASKED_PER_MASK} masked descriptions "
        f"of some mask ({', '.join(masks)}) and {who}; the inter-human reference needs {MIN_MASKED_PER_MASK} per "
        f"mask: on those images spatial dependence is undecided and there is no heat map{empty}"
    )
    return [ThinData(MASKED_NOTE, None, message)]
