"""Every image file becomes the same 8-bit RGB pixels, wherever it is read (docs/data-format.md).

`decode_image` is the one decoder (`load_rgb` and `load_image` read a file through it): the image
check at `validate`, the describe stage (what models see), the masks command, the viewer and the
report's heat maps all call it, so they all see the same pixels.

Pillow's own `convert("RGB")` clips wider pixel types instead of scaling them: a 16-bit PNG becomes
white and a float TIFF black; and it ignores the EXIF orientation, so a portrait photo would be shown
lying on its side. Here the orientation is applied first, then each mode is brought to 8 bits:

- 16-bit modes (I;16, I;16B, I;16L, I;16N) and 32-bit integer `I` (how Pillow opens 16-bit PGM/PPM)
  are scaled from 0..65535 to 0..255 (round(v / 257)); `I` values outside 0..65535 are refused;
- float `F` is read as 0..1 when every value lies in [0, 1], else as 0..255 when every value lies in
  [0, 255]; NaN, infinities and other ranges are refused, as no scale can be known;
- every other mode (1, L, P, RGB, CMYK, YCbCr, LAB, HSV, ...) by Pillow's conversion, which is
  exact for them.

An image with transparency (an alpha channel: RGBA, LA, PA; or a transparency entry: a palette's, or
a gray or RGB PNG's transparent colour) is composited onto a background, white unless the study's
`data.background` says otherwise, as a person sees it: each channel becomes
(c * a + b * (255 - a)) / 255 rounded, for alpha a, background b. Dropping the alpha instead would
show a model whatever colour lies under the transparent pixels (often the blocky leftovers of a
cut-out's old background). `background=None` refuses such an image (`data.background: none`).

What cannot be converted faithfully raises `ImageDecodeError` with the reason; `validate` reports it
for the image's row. Multi-frame files (animated GIF, multi-page TIFF) give their first frame.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, BinaryIO

import numpy as np
from PIL import Image, ImageColor, ImageOps, UnidentifiedImageError
from pydantic import AfterValidator, Field

from vlm_decade.core import storage

SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N")
WHITE = "#ffffff"
NO_BACKGROUND = "none"


class ImageDecodeError(ValueError):
    """An image file that cannot be read as faithful 8-bit RGB; the message says why."""


def background_text(value: str) -> str:
    """A background as a study file gives it (a colour name, #rrggbb, or `none`) in one spelling,
    `#rrggbb` or `none`, so that "white" and "#FFFFFF" are one setting; ValueError if no colour."""
    if value.strip().lower() == NO_BACKGROUND:
        return NO_BACKGROUND
    try:
        rgb = ImageColor.getrgb(value.strip())
    except ValueError:
        raise ValueError(f"'{value}' is no colour: give a colour name (white, black, gray), #rrggbb, or none") from None
    return "#{:02x}{:02x}{:02x}".format(*rgb[:3])


# A study's `data.background`: one spelling (#rrggbb, or `none`) whatever the study file wrote.
Background = Annotated[
    str,
    AfterValidator(background_text),
    Field(
        description="What transparent pixels are composited onto before any model, mask or metric sees them: "
        "a colour name or #rrggbb; none: images with transparency are refused."
    ),
]


def background_rgb(text: str | None) -> tuple[int, int, int] | None:
    """The RGB of a `background_text` (None for `none`)."""
    if text is None or text == NO_BACKGROUND:
        return None
    return ImageColor.getrgb(text)[:3]


@dataclass(frozen=True)
class Decoded:
    """What decoding one file gives: the RGB pixels the models are shown, the file's own mode, and
    whether any pixel was transparent (and so composited onto the background)."""

    rgb: np.ndarray
    mode: str
    transparent: bool


def load_rgb(path: str | Path, background: str | None = WHITE) -> tuple[np.ndarray, str]:
    """(H x W x 3 uint8 RGB pixels, upright by the EXIF orientation, transparent pixels composited
    onto `background` (#rrggbb); the file's own Pillow mode) of a local file, an object-storage URI
    or an image in a shard (`vlm_decade.core.storage`)."""
    decoded = load_image(path, background)
    return decoded.rgb, decoded.mode


def load_image(path: str | Path, background: str | None = WHITE) -> Decoded:
    """`load_rgb`, with whether the image had transparency."""
    problem = storage.file_problem(path)
    if problem is not None:
        raise ImageDecodeError(f"image file {problem}: {path}")
    if not storage.is_uri(path) and storage.member(path) is None:  # a shard's member is read by its range
        return decode_image(path, path, background)
    try:
        data = storage.read_bytes(path)
    except OSError as exc:
        raise ImageDecodeError(f"cannot read image file {path}: {exc}") from None
    return decode_image(io.BytesIO(data), path, background)


def decode_image(source: str | Path | BinaryIO, path: str | Path, background: str | None = WHITE) -> Decoded:
    """`load_image` of a file already opened or read into memory (`source`); `path` names it in
    messages. `background` None (`data.background: none`) refuses an image with transparency."""
    try:
        # Pillow refuses more than twice Image.MAX_IMAGE_PIXELS at open (and warns above it).
        with Image.open(source) as im:
            im.load()  # a full decode: a truncated file fails here, not just a bad header
            mode = im.mode
            ImageOps.exif_transpose(im, in_place=True)
            rgb, alpha = _rgb_and_alpha(im)
            if alpha is None:
                return Decoded(rgb, mode, False)
            colour = background_rgb(background)
            if colour is None:
                raise ImageDecodeError(
                    "has transparent pixels, and data.background is none: give a background "
                    "(white, a colour name or #rrggbb) or an image without transparency"
                )
            return Decoded(composite(rgb, alpha, colour), mode, True)
    except ImageDecodeError as exc:
        raise ImageDecodeError(f"{exc}: {path}") from None
    except UnidentifiedImageError:
        raise ImageDecodeError(f"not a readable image (not a format Pillow recognises): {path}") from None
    except Image.DecompressionBombError as exc:
        raise ImageDecodeError(f"refused as a possible decompression bomb ({exc}): {path}") from None
    except OSError as exc:
        if exc.errno is not None:  # reading the file failed, not decoding it
            raise ImageDecodeError(f"cannot read image file {path}: {exc.strerror or exc}") from None
        raise ImageDecodeError(f"not a readable image ({exc}): {path}") from None
    except Exception as exc:  # noqa: BLE001 - Pillow signals a damaged image with many exception types
        raise ImageDecodeError(f"not a readable image ({type(exc).__name__}: {exc}): {path}") from None


def _rgb_and_alpha(im: Image.Image) -> tuple[np.ndarray, np.ndarray | None]:
    """The image's RGB pixels and its alpha (H x W uint8), the alpha None when the image has no
    transparency data or every pixel is opaque (a fully opaque alpha channel changes nothing).
    An 8-bit image with transparency is converted once, to RGBA: converting a palette image with
    a transparency entry straight to RGB makes Pillow warn to every user."""
    if not im.has_transparency_data:
        return to_rgb(im), None
    if im.mode in SIXTEEN_BIT or im.mode in ("I", "F"):
        rgb, alpha = to_rgb(im), np.asarray(im.convert("RGBA"))[:, :, 3]
    else:
        rgba = np.asarray(im.convert("RGBA"))
        rgb, alpha = rgba[:, :, :3], rgba[:, :, 3]
    return rgb, (alpha if (alpha < 255).any() else None)


def composite(rgb: np.ndarray, alpha: np.ndarray, background: tuple[int, int, int]) -> np.ndarray:
    """RGB pixels over a background by their alpha: (c * a + b * (255 - a)) / 255, rounded (in
    integers: the exact half never occurs, as 255 is odd)."""
    a = alpha.astype(np.int64)[:, :, None]
    b = np.asarray(background, dtype=np.int64)[None, None, :]
    return ((rgb.astype(np.int64) * a + b * (255 - a) + 127) // 255).astype(np.uint8)


def to_rgb(im: Image.Image) -> np.ndarray:
    """An opened image's pixels as H x W x 3 uint8 RGB (the rules in the module docstring)."""
    if im.mode in SIXTEEN_BIT:
        return _gray(np.rint(np.asarray(im, dtype=np.float64) / 257.0))
    if im.mode == "I":
        values = np.asarray(im, dtype=np.int64)
        if values.size and (values.min() < 0 or values.max() > 65535):
            raise ImageDecodeError(
                f"32-bit integer pixels from {values.min()} to {values.max()}, outside 0..65535: no faithful 8-bit reading"
            )
        return _gray(np.rint(values / 257.0))
    if im.mode == "F":
        values = np.asarray(im, dtype=np.float64)
        if not np.isfinite(values).all():
            raise ImageDecodeError("float pixels include NaN or infinity: no faithful 8-bit reading")
        lo, hi = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
        if lo >= 0.0 and hi <= 1.0:
            return _gray(np.rint(values * 255.0))
        if lo >= 0.0 and hi <= 255.0:
            return _gray(np.rint(values))
        raise ImageDecodeError(
            f"float pixels from {lo:g} to {hi:g}, neither within 0..1 nor 0..255: no faithful 8-bit reading"
        )
    try:
        return np.asarray(im.convert("RGB"))
    except (ValueError, OSError) as exc:
        raise ImageDecodeError(f"mode {im.mode} cannot be converted to RGB ({exc})") from None


def _gray(values: np.ndarray) -> np.ndarray:
    gray = np.clip(values, 0, 255).astype(np.uint8)
    return np.repeat(gray[:, :, None], 3, axis=2)
