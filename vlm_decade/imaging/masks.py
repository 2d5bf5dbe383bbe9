"""Masked variants: the paper's occluder, an opaque black window with feathered edges.

A mask is a box in image fractions plus a feather width. `occlusion` turns it into an alpha map
(1 = fully black) for a given image size; `apply_mask` blends the image towards black with it. The
soft edge is a raised-cosine ramp centred on the window's edge, so what the ramp takes from inside
the window it gives back outside and the covered fraction stays at the nominal box area
(docs/masks.md). Everything is pure numpy and deterministic for an image and a mask id.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from PIL import Image
from pydantic import Field, field_validator

from vlm_decade.core.config import Settings
from vlm_decade.core.errors import InputError, Problem
from vlm_decade.core.files import atomic_file, atomic_write_bytes
from vlm_decade.imaging.decode import WHITE, ImageDecodeError, background_rgb, composite, load_rgb


class MaskConfig(Settings):
    """The occluder: opaque black windows with feathered edges (docs/masks.md).

    `layout` places `count` equal windows that together tile the image (`columns`: full-height strips,
    `rows`: full-width strips), each covering 1/count of it; `windows` gives explicit fractional
    boxes [x0, y0, x1, y1] instead. `feather` is the width of the soft edge as a fraction of the
    image's shorter side.
    """

    layout: Literal["columns", "rows"] = Field(
        "columns", description="columns (full-height strips) or rows (full-width strips)."
    )
    count: int = Field(3, ge=1, le=16, description="How many equal windows tile the image.")
    windows: tuple[tuple[float, float, float, float], ...] | None = Field(
        None, description="Explicit windows [x0, y0, x1, y1] in fractions of the image, instead of layout and count."
    )
    feather: float = Field(
        0.04, ge=0.0, le=0.5, description="Width of the soft edge, a fraction of the image's shorter side."
    )

    @field_validator("windows")
    @classmethod
    def _boxes_inside_image(cls, windows):
        for box in windows or ():
            x0, y0, x1, y1 = box
            if not (0.0 <= x0 < x1 <= 1.0 and 0.0 <= y0 < y1 <= 1.0):
                raise ValueError(f"window {list(box)} must satisfy 0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1")
        return windows


@dataclass(frozen=True)
class MaskSpec:
    """One occluder: `box` is (x0, y0, x1, y1) in fractions of width and height; `feather` is the
    full width of the soft edge as a fraction of the image's shorter side."""

    mask_id: str
    box: tuple[float, float, float, float]
    feather: float


def mask_ids(cfg: MaskConfig) -> list[str]:
    """Mask ids in order: m1, m2, ...; with `full` these are the valid `condition`/`variant` values."""
    n = len(cfg.windows) if cfg.windows else cfg.count
    return [f"m{i}" for i in range(1, n + 1)]


def mask_specs(cfg: MaskConfig) -> list[MaskSpec]:
    """The masks a config asks for, in `mask_ids` order."""
    if cfg.windows:
        boxes = [tuple(float(v) for v in box) for box in cfg.windows]
    elif cfg.layout == "columns":
        boxes = [(i / cfg.count, 0.0, (i + 1) / cfg.count, 1.0) for i in range(cfg.count)]
    else:
        boxes = [(0.0, i / cfg.count, 1.0, (i + 1) / cfg.count) for i in range(cfg.count)]
    return [MaskSpec(mid, box, float(cfg.feather)) for mid, box in zip(mask_ids(cfg), boxes)]


def _ramp(d: np.ndarray, width: float, inclusive: bool) -> np.ndarray:
    """Coverage as a function of signed distance `d` past one edge (negative = inside the window).

    Raised cosine from 1 at d = -width/2 to 0 at d = +width/2; it is point-symmetric about the edge
    (ramp(d) + ramp(-d) = 1), which keeps the covered area and makes masks that share an edge sum to 1.
    With width 0 it is a hard step; `inclusive` says whether a pixel centre exactly on the edge is
    covered, so that windows are half-open [x0, x1) and tiled windows never share or miss a pixel.
    """
    if width <= 0:
        return (d <= 0 if inclusive else d < 0).astype(np.float64)
    t = np.clip(d / width + 0.5, 0.0, 1.0)
    # The explicit plateaus make the interior exactly 1 and the outside exactly 0, not merely close.
    return np.where(t <= 0.0, 1.0, np.where(t >= 1.0, 0.0, 0.5 * (1.0 + np.cos(np.pi * t))))


def _axis(n: int, lo: float, hi: float, width: float) -> np.ndarray:
    """Coverage along one axis of `n` pixels for the window [lo, hi) given in fractions."""
    centres = np.arange(n, dtype=np.float64) + 0.5
    a, b = lo * n, hi * n
    # An edge on the image border is not an edge of the occluder: the window runs off the image there,
    # so feathering it would leave a lighter band along the border.
    left = np.ones(n) if lo <= 0.0 else _ramp(a - centres, width, inclusive=True)
    right = np.ones(n) if hi >= 1.0 else _ramp(centres - b, width, inclusive=False)
    return left * right


def occlusion(height: int, width: int, spec: MaskSpec) -> np.ndarray:
    """Alpha map of one mask: float32 (height, width) in [0, 1], 1 = fully black.

    Separable: the product of the horizontal and vertical coverage, so a box's corners are rounded
    by the feather and the covered area of an interior box stays exactly its nominal area.
    """
    if height < 1 or width < 1:
        raise ValueError(f"image size must be at least 1x1, got {height}x{width}")
    x0, y0, x1, y1 = spec.box
    feather_px = spec.feather * min(height, width)
    ax = _axis(width, x0, x1, feather_px)
    ay = _axis(height, y0, y1, feather_px)
    return np.outer(ay, ax).astype(np.float32)


def as_rgb(image: np.ndarray) -> np.ndarray:
    """An image array as RGB uint8 (H, W, 3): gray (H, W) or (H, W, 1) is repeated, RGBA is
    composited onto white by its alpha (as `imaging.decode` does for files by default, so an array
    handed to a backend is seen as a file of it would be)."""
    image = np.asarray(image)
    if image.dtype != np.uint8:
        raise ValueError(f"image must be uint8, got {image.dtype}")
    if image.size == 0:
        raise ValueError(f"image is empty (shape {image.shape})")
    if image.ndim == 2:
        image = image[:, :, None]
    if image.ndim != 3 or image.shape[2] not in (1, 3, 4):
        raise ValueError(f"image must be HxW, HxWx1, HxWx3 or HxWx4, got shape {image.shape}")
    if image.shape[2] == 1:
        return np.repeat(image, 3, axis=2)
    if image.shape[2] == 4:
        return composite(image[:, :, :3], image[:, :, 3], background_rgb(WHITE))
    return np.ascontiguousarray(image)


def apply_mask(image: np.ndarray, spec: MaskSpec) -> np.ndarray:
    """A new RGB uint8 image blended towards black by the mask's alpha; the input is not modified."""
    rgb = as_rgb(image)
    keep = 1.0 - occlusion(rgb.shape[0], rgb.shape[1], spec)[:, :, None]
    return np.rint(rgb * keep).astype(np.uint8)


def variants(image: np.ndarray, cfg: MaskConfig) -> dict[str, np.ndarray]:
    """The unmasked image and every masked variant: {"full": rgb, "m1": ..., ...}."""
    rgb = as_rgb(image)
    out = {"full": rgb.copy()}
    out.update({spec.mask_id: apply_mask(rgb, spec) for spec in mask_specs(cfg)})
    return out


def geometry(spec: MaskSpec, height: int, width: int) -> dict:
    """What to record about one mask on one image, in fractions and in pixels."""
    x0, y0, x1, y1 = spec.box
    return {
        "mask_id": spec.mask_id,
        "box": [x0, y0, x1, y1],
        "box_px": [x0 * width, y0 * height, x1 * width, y1 * height],
        "feather": spec.feather,
        "feather_px": spec.feather * min(height, width),
        "covered_fraction": float(occlusion(height, width, spec).mean(dtype=np.float64)),
    }


def write_previews(image_path: str | Path, out_dir: str | Path, cfg: MaskConfig) -> list[Path]:
    """Write full.png, m1.png, ... and masks.json (image size and mode, config, geometry) into `out_dir`;
    an image that cannot be decoded is an InputError naming it."""
    image_path, out_dir = Path(image_path), Path(out_dir)
    try:
        rgb, mode = load_rgb(image_path)  # the pixels the models are shown
    except ImageDecodeError as exc:
        raise InputError([Problem(str(image_path), str(exc))]) from None
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, array in variants(rgb, cfg).items():
        path = out_dir / f"{name}.png"
        with atomic_file(path) as out:
            Image.fromarray(array).save(out, format="PNG")
        written.append(path)
    height, width = rgb.shape[:2]
    record = {
        "image": str(image_path),
        "mode": mode,
        "height": height,
        "width": width,
        "config": cfg.model_dump(mode="json"),
        "masks": [geometry(spec, height, width) for spec in mask_specs(cfg)],
    }
    path = out_dir / "masks.json"
    atomic_write_bytes(path, (json.dumps(record, indent=2) + "\n").encode("utf-8"))
    written.append(path)
    return written
