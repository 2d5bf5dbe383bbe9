"""Every image file becomes the same 8-bit RGB pixels, wherever it is read (docs/data-format.md).

`load_rgb` is the one decoder: the image check at `validate`, the describe stage (what models see),
the masks command and the report's heat maps all call it, so they all see the same pixels.

Pillow's own `convert("RGB")` clips wider pixel types instead of scaling them: a 16-bit PNG becomes
white and a float TIFF black; and it ignores the EXIF orientation, so a portrait photo would be shown
lying on its side. Here the orientation is applied first, then each mode is brought to 8 bits:

- 16-bit modes (I;16, I;16B, I;16L, I;16N) and 32-bit integer `I` (how Pillow opens 16-bit PGM/PPM)
  are scaled from 0..65535 to 0..255 (round(v / 257)); `I` values outside 0..65535 are refused;
- float `F` is read as 0..1 when every value lies in [0, 1], else as 0..255 when every value lies in
  [0, 255]; NaN, infinities and other ranges are refused, as no scale can be known;
- every other mode (1, L, P, RGB, RGBA, CMYK, YCbCr, LAB, HSV, LA, PA, ...) by Pillow's conversion,
  which is exact for them; an alpha channel is dropped, as before.

What cannot be converted faithfully raises `ImageDecodeError` with the reason; `validate` reports it
for the image's row. Multi-frame files (animated GIF, multi-page TIFF) give their first frame.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import BinaryIO

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from vlm_decade.core import storage

SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N")


class ImageDecodeError(ValueError):
    """An image file that cannot be read as faithful 8-bit RGB; the message says why."""


def load_rgb(path: str | Path) -> tuple[np.ndarray, str]:
    """(H x W x 3 uint8 RGB pixels, upright by the EXIF orientation; the file's own Pillow mode) of a
    local file or an object-storage URI (`vlm_decade.core.storage`)."""
    problem = storage.file_problem(path)
    if problem is not None:
        raise ImageDecodeError(f"image file {problem}: {path}")
    if not storage.is_uri(path):
        return decode_rgb(path, path)
    try:
        data = storage.read_bytes(path)
    except OSError as exc:
        raise ImageDecodeError(f"cannot read image file {path}: {exc}") from None
    return decode_rgb(io.BytesIO(data), path)


def decode_rgb(source: str | Path | BinaryIO, path: str | Path) -> tuple[np.ndarray, str]:
    """`load_rgb` of a file already opened or read into memory (`source`); `path` names it in messages."""
    try:
        # Pillow refuses more than twice Image.MAX_IMAGE_PIXELS at open (and warns above it).
        with Image.open(source) as im:
            im.load()  # a full decode: a truncated file fails here, not just a bad header
            mode = im.mode
            ImageOps.exif_transpose(im, in_place=True)
            return to_rgb(im), mode
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
    except Exception as exc:  # Pillow signals a damaged image with many exception types
        raise ImageDecodeError(f"not a readable image ({type(exc).__name__}: {exc}): {path}") from None


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
        raise ImageDecodeError(f"float pixels from {lo:g} to {hi:g}, neither within 0..1 nor 0..255: no faithful 8-bit reading")
    try:
        return np.asarray(im.convert("RGB"))
    except (ValueError, OSError) as exc:
        raise ImageDecodeError(f"mode {im.mode} cannot be converted to RGB ({exc})") from None


def _gray(values: np.ndarray) -> np.ndarray:
    gray = np.clip(values, 0, 255).astype(np.uint8)
    return np.repeat(gray[:, :, None], 3, axis=2)
