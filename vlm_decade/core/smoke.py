"""A smoke run (`run --limit N`): the first N images of each dataset, in a run folder marked as one so it
is never mistaken for the full study.

The study records its `limit`, so the manifest, the report's banner and `status` say it; by default its
run folder is the study's with `-smokeN` added; and a run folder is never resumed across kinds (a smoke
run into a full run's folder, or the full study into a smoke run's): the tables of the two would mix.
"""

from __future__ import annotations

from dataclasses import fields, replace

import pyarrow as pa
import pyarrow.compute as pc


def first_rows_per_dataset(images: pa.Table, limit: int) -> list[int]:
    """The rows of the first `limit` images of each dataset of an `images` table, in its order."""
    seen: dict[str, int] = {}
    keep = []
    for row, dataset in enumerate(images.column("dataset").to_pylist()):
        seen[dataset] = seen.get(dataset, 0) + 1
        if seen[dataset] <= limit:
            keep.append(row)
    return keep


def first_images(data, limit: int | None):
    """`data` (a study's checked input: a dataclass whose `images` table has `image_id` and `dataset`)
    with only the first `limit` images of each dataset, in the images table's order, and every
    other table with an `image_id` column cut to those images. `limit` None: `data` as it is."""
    if limit is None:
        return data
    images = data.images.take(first_rows_per_dataset(data.images, limit))
    ids = images.column("image_id")
    cut = {"images": images}
    for field in fields(data):
        table = getattr(data, field.name)
        if field.name != "images" and isinstance(table, pa.Table) and "image_id" in table.column_names:
            cut[field.name] = table.filter(pc.is_in(table.column("image_id"), value_set=ids))
    return replace(data, **cut)


def smoke_folder(output: str, limit: int) -> str:
    """The run folder of a smoke run by default: the study's, named `-smokeN` (a path or a URI)."""
    return f"{output.rstrip('/')}-smoke{limit}"


def _first(limit: int) -> str:
    return f"the first {limit} image{'s' if limit != 1 else ''} of each dataset"


def smoke_note(limit: int) -> str:
    return f"smoke run: only {_first(limit)} (run --limit {limit}); not the full study"


def resume_problem(manifest: dict, limit: int | None, location: str) -> str | None:
    """Why a run with `limit` may not go on in the run folder whose `manifest` this is (None: it may):
    one of the other kind (smoke or full) or another limit ran there before."""
    if not manifest.get("started"):
        return None  # no run began here yet
    before = manifest.get("limit")
    if before == limit:
        return None
    if before is None:
        return (
            f"{location} holds a run of the full study; a smoke run (--limit {limit}) would mix its few images "
            "into it: give the smoke run its own folder (leave out --out for the default one)"
        )
    then = f"a smoke run of {_first(before)} (--limit {before})"
    wanted = "the full study" if limit is None else f"a smoke run with --limit {limit}"
    return f"{location} holds {then}; {wanted} goes into another folder: give --out"
