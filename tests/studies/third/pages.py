"""The third study's viewer pages (`view.pages.Pages`): a gallery of the images with their mean
brightness, one page per image and one per model; templates in `templates/` beside this module."""

from __future__ import annotations

from vlm_decade.view.runs import RunView

HEADER = "Third study: brightness"
LINKS: tuple[tuple[str, str], ...] = ()


def _measured(view: RunView) -> str:
    if view.has("brightness"):
        return "(SELECT i.*, b.brightness FROM images AS i LEFT JOIN brightness AS b ON b.image_id = i.image_id)"
    return "(SELECT *, NULL AS brightness FROM images)"


def gallery_page(view: RunView, params) -> dict:
    return {"rows": view.rows(f"SELECT image_id, brightness FROM {_measured(view)} ORDER BY image_id")}


def image_page(view: RunView, image_id: str) -> dict | None:
    rows = view.rows(f"SELECT * FROM {_measured(view)} WHERE image_id = ?", [image_id])
    return {"image": rows[0]} if rows else None


def model_page(view: RunView, model: str, page: int) -> dict | None:
    return {"name": model} if model in view.models else None


def masks(view: RunView) -> list:
    return []
