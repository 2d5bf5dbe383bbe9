"""What both studies' pages share: the page number read from a query string (a whole number
from 1; anything else is a bad request, a page past the last one is not found), the link to the same
query with some filters changed, the datasets with their image counts, a model's failed responses,
and a statistics table's rows about all images apart from each group's (`analysis.group_by`)."""

from __future__ import annotations

import math
import re
from dataclasses import fields, replace

from vlm_decade.view.runs import RunView

PAGE = re.compile(r"[0-9]{1,9}")  # at most 999,999,999: an offset that any table engine takes


class BadRequest(Exception):
    """A request the pages cannot answer: `status` 400 (malformed) or 404 (names nothing there)."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


def page_number(params, name: str = "page") -> int:
    """The page a query string asks for (1 when it names none); BadRequest when it is not a whole number from 1."""
    value = params.get(name, "1")
    if not PAGE.fullmatch(value) or int(value) < 1:
        raise BadRequest(400, f"'{name}' must be a whole number from 1, not '{value[:24]}'")
    return int(value)


def page_count(total: int, size: int, page: int) -> int:
    """How many pages `total` rows fill (at least one); BadRequest (404) when `page` is past the last."""
    pages = max(1, math.ceil(total / size))
    if page > pages:
        raise BadRequest(404, f"there is no page {page}: {total} rows fill {pages} page(s)")
    return pages


FAILED_PAGE_SIZE = 100


def failed_responses(view: RunView, model: str, keys: str, page: int) -> tuple[int, int, list[dict]]:
    """A model page's failed responses: (how many, pages, the rows of `page`), each row its `keys`
    (the responses' key columns, comma-separated, also their order), status and error."""
    total = 0
    if view.has("responses"):
        total = view.values("SELECT count(*) FROM responses WHERE subject = ? AND status <> 'ok'", [model])[0]
    pages = page_count(total, FAILED_PAGE_SIZE, page)
    if not total:
        return total, pages, []
    rows = view.rows(
        f"SELECT image_id, {keys}, status, error FROM responses WHERE subject = ? AND status <> 'ok' "
        f"ORDER BY image_id, {keys} LIMIT {FAILED_PAGE_SIZE} OFFSET {(page - 1) * FAILED_PAGE_SIZE}",
        [model],
    )
    return total, pages, rows


class Query:
    """A mixin for a gallery's frozen query dataclass (with a `page` field): its links."""

    def link(self, **changes) -> dict:
        """The query string of this query with `changes` (and the page back to 1 unless given)."""
        changed = replace(self, **{"page": 1, **changes})
        values = {f.name: getattr(changed, f.name) for f in fields(changed)}
        return {k: v for k, v in values.items() if v not in ("", None) and not (k == "page" and v == 1)}


def datasets(view: RunView) -> list[tuple[str, int]]:
    """Each dataset of the run with its number of images, by name."""
    rows = view.rows("SELECT dataset, count(*) AS n FROM images GROUP BY dataset ORDER BY dataset")
    return [(r["dataset"], r["n"]) for r in rows]


def all_images(view: RunView, table: str) -> str:
    """The SQL condition that keeps a statistics table's rows about all images: with
    `analysis.group_by` the table also holds each group's rows (`stats.groups`: `group_by` and
    `group` set); a table written before grouping existed has no others."""
    return "group_by IS NULL" if "group_by" in view.columns(table) else "TRUE"


def by_group(view: RunView, table: str, where: str, params: list, order: str) -> list[tuple[str, list[dict]]]:
    """The per-group rows of a statistics table that `where` keeps: (variable, its rows by group,
    then by `order`) for each grouping variable, in the study's order; none for a run without groups."""
    if "group_by" not in view.columns(table):
        return []
    rows = view.rows(
        f'SELECT * FROM "{table}" WHERE group_by IS NOT NULL AND {where} ORDER BY "group", {order}', params
    )
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["group_by"], []).append(r)
    study = list(view.study.analysis.group_by)
    return sorted(out.items(), key=lambda item: (study.index(item[0]) if item[0] in study else len(study), item[0]))


def metadata(view: RunView, image_id: str) -> list[tuple[str, str]]:
    """The image's metadata (the user's own columns of the images or labels table) as (column, value)."""
    if not view.has("metadata"):
        return []
    rows = view.rows("SELECT * FROM metadata WHERE image_id = ?", [image_id])
    return [(k, v) for k, v in rows[0].items() if k != "image_id"] if rows else []
