"""The pictures the pages show, made on demand from the run's own images and cached in the run
folder (`.view/`): thumbnails, the full image and its masked variants scaled for the screen, and
the heat maps of the regions that matter (Study A).

An image is found only through the run's images table, never from a path in a request, and read
only while its bytes match the sha256 recorded there; cache entries are read and written through
`verify`, under names made from that sha256. A file that has moved, changed or cannot be read gives
a placeholder that says so, never an error.
"""

from __future__ import annotations

import hashlib
import html
import io
import json
import math

from PIL import Image, UnidentifiedImageError

from vlm_decade.core import storage
from vlm_decade.imaging.decode import WHITE, ImageDecodeError, decode_image
from vlm_decade.view.pages import pages_of
from vlm_decade.view.runs import RunView
from vlm_decade.view.verify import Missing, image_bytes, image_digest, read_cached, write_cached

THUMB_PX = 240
SCREEN_PX = 768
JPEG_QUALITY = 82


def placeholder(text: str, width: int = 320, height: int = 240) -> bytes:
    """An SVG that says why there is no picture."""
    lines = "".join(
        f"<tspan x='50%' dy='{0 if i == 0 else 16}'>{html.escape(line)}</tspan>"
        for i, line in enumerate(_wrapped(text, 40))
    )
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' viewBox='0 0 {width} {height}'>"
        f"<rect width='100%' height='100%' fill='#eee' stroke='#bbb'/>"
        f"<text x='50%' y='40%' text-anchor='middle' font-family='sans-serif' font-size='12' fill='#555'>{lines}</text></svg>"
    ).encode()


def _wrapped(text: str, width: int) -> list[str]:
    out = []
    while len(text) > width:
        out.append(text[:width])
        text = text[width:]
    return out + [text]


def _cached(view: RunView, folder: str, image: dict, tag: str, suffix: str, make) -> bytes:
    """The bytes cached as `.view/<folder>/<sha256>-<tag>.<suffix>`, made and saved first if absent.
    A run folder that cannot be written still gets its pictures, just not cached."""
    name = f"{image_digest(image)}-{tag}.{suffix}"
    data = read_cached(view.root, folder, name)
    if data is None:
        data = make()
        write_cached(view.root, folder, name, data)
    return data


def _decoded(image: dict) -> Image.Image:
    data = image_bytes(image)
    try:
        # as the models saw it: a transparent image composited onto the background the run recorded
        return Image.fromarray(decode_image(io.BytesIO(data), image["path"], image.get("background") or WHITE).rgb)
    except ImageDecodeError as exc:
        raise Missing(f"{image['path']}: not readable as an image ({exc})") from None


def original(image: dict) -> tuple[bytes, str]:
    """The image file's bytes, as the run recorded them, and their media type (from the decoded
    format, never from the file's name); raises Missing."""
    data = image_bytes(image)
    try:
        with Image.open(io.BytesIO(data)) as im:
            kind = Image.MIME.get(im.format or "")
    except (OSError, UnidentifiedImageError, ValueError) as exc:
        raise Missing(f"{image['path']}: not readable as an image ({exc})") from None
    if kind is None:
        raise Missing(f"{image['path']}: an image format the browser is not sent ({im.format})")
    return data, kind


def _jpeg(im: Image.Image, longest: int) -> bytes:
    im = im.copy()
    im.thumbnail((longest, longest))
    buffer = io.BytesIO()
    im.save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue()


def thumbnail(view: RunView, image: dict, longest: int = THUMB_PX) -> bytes:
    """A JPEG at most `longest` pixels on its longer side; raises Missing."""
    return _cached(view, "thumbs", image, str(int(longest)), "jpg", lambda: _jpeg(_decoded(image), longest))


def variant(view: RunView, image: dict, variant_id: str) -> bytes:
    """The full image (`full`) or one masked variant, as the models were shown it, scaled for the
    screen; raises Missing, or KeyError for a variant the study does not have."""
    import numpy as np

    from vlm_decade.imaging.masks import apply_mask

    specs = {s.mask_id: s for s in pages_of(view).masks(view)}
    if variant_id != "full" and variant_id not in specs:
        raise KeyError(variant_id)
    spec = specs.get(variant_id)
    # The mask's geometry is part of the name (hashed: a mask id is the study's text, not a file
    # name), so a study whose masks change gets new pictures.
    tag = "full"
    if spec is not None:
        tag = hashlib.sha256(repr((variant_id, spec.box, spec.feather)).encode()).hexdigest()[:16]

    def make() -> bytes:
        im = _decoded(image)
        if spec is not None:
            im = Image.fromarray(apply_mask(np.asarray(im), spec))
        return _jpeg(im, SCREEN_PX)

    return _cached(view, "variants", image, tag, "jpg", make)


def heatmap(view: RunView, image: dict) -> bytes | None:
    """Study A's heat map of one image (figure 7a's panels: humans and each model), drawn the way the
    report draws it; None when no subject has both profiles complete. Raises Missing."""
    import numpy as np

    from vlm_decade.studies.decade.taxonomy.heatmaps import heatmap_figure
    from vlm_decade.studies.decade.taxonomy.spatial import HUMANS, importance

    if not view.has("spatial"):
        return None
    rows = view.rows(
        "SELECT subject, model_profile, human_profile FROM spatial WHERE image_id = ? AND sde IS NOT NULL ORDER BY subject",
        [image["image_id"]],
    )
    if not rows:
        return None

    def profile(values) -> list[float]:
        return importance([math.nan if v is None else v for v in values])

    panels = {HUMANS: profile(rows[0]["human_profile"])}
    for r in rows:
        panels[r["subject"]] = profile(r["model_profile"])
    values = json.dumps({k: [None if math.isnan(v) else v for v in vs] for k, vs in panels.items()}, sort_keys=True)
    specs = pages_of(view).masks(view)
    tag = hashlib.sha256((values + repr([(s.box, s.feather) for s in specs])).encode()).hexdigest()[:16]

    def make() -> bytes:
        fig = heatmap_figure(np.asarray(_decoded(image)), specs, panels, title=image["image_id"])
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=90)
        return buffer.getvalue()

    return _cached(view, "heatmaps", image, tag, "png", make)


def exists(image: dict) -> bool:
    return storage.file_problem(image["path"]) is None
