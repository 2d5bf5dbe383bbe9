"""What a study's viewer pages offer the app (the `Pages` protocol), found through the study's
registration (`studies.registry`): the app serves any registered study's run with the same routes,
each page's data from the run's study's pages module and its template `<study>_<page>.html` from
the view's templates or the `templates/` folder beside that module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, cast

from vlm_decade.studies import STUDIES
from vlm_decade.studies.registry import resolve
from vlm_decade.view.runs import RunView


class Pages(Protocol):
    """A study's viewer pages: each `*_page` returns the data of its template (`<study>_gallery.html`,
    `_image`, `_model`), None for an image or model the run does not have. A module may also offer
    `confusion_page(view, params)` (`<study>_confusions.html`); without it `/confusions` is not found."""

    HEADER: str  # beside the study's name at the top of every page
    LINKS: tuple[tuple[str, str], ...]  # (path, text): its own pages, linked from every page's header

    def gallery_page(self, view: RunView, params: Any) -> dict: ...

    def image_page(self, view: RunView, image_id: str) -> dict | None: ...

    def model_page(self, view: RunView, model: str, page: int) -> dict | None: ...

    def masks(self, view: RunView) -> list: ...  # the mask specs of the variants its pictures show


def pages_of(view: RunView) -> Pages:
    """The viewer pages of the run's study."""
    return cast(Pages, resolve(STUDIES[view.kind].pages))


def template_folders(pages: Pages) -> list[Path]:
    """Where the app finds templates: the view's own (the base page, the shared macros, the
    built-in studies' pages), then the `templates/` folder beside the study's pages module."""
    own = Path(__file__).parent / "templates"
    beside = Path(cast(Any, pages).__file__).parent / "templates"
    return [own] if beside == own else [own, beside]
