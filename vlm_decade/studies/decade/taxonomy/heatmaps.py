"""Heat maps of which image regions matter (figure 7a): one PNG per image, one panel per subject.

Each panel shows the image with every masked region tinted by that subject's importance
(1 - similarity, from vlm_decade.studies.decade.taxonomy.spatial). The regions are drawn with the occluder's own
alpha maps (vlm_decade.imaging.masks.occlusion), feathered edges included, so a tinted region is exactly the
part of the image its mask hid. Colours are scaled per panel (the subject's least important region
0, its most important 1) and share one colour bar; the raw importances are written on the regions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from vlm_decade.imaging.masks import MaskSpec, as_rgb, occlusion
from vlm_decade.report.figures import save_figure
from vlm_decade.studies.decade.taxonomy.spatial import HUMANS

CMAP = "YlOrRd"  # pale = least important, dark red = most; low values do not read as "masked"
TINT_ALPHA = 0.6  # how strongly a fully covered pixel is tinted; the image stays readable beneath
PANEL_HEIGHT_IN = 3.2
DPI = 120


def importance_map(shape: Sequence[int], specs: Sequence[MaskSpec], importance: Sequence[float]) -> np.ndarray:
    """Per-pixel importance (float64, shape[:2]): each mask's value weighted by its alpha map.

    Inside a window it is the window's value; outside every window 0; across a feathered edge shared by
    tiled windows (alphas summing to 1) it blends the two values. Where windows overlap (alphas summing
    above 1) it is their alpha-weighted mean. A NaN value leaves its region at 0.
    """
    if len(specs) != len(importance):
        raise ValueError(f"{len(specs)} masks but {len(importance)} importance values")
    height, width = int(shape[0]), int(shape[1])
    total = np.zeros((height, width))
    weight = np.zeros((height, width))
    for spec, value in zip(specs, importance):
        if math.isnan(value):
            continue
        alpha = occlusion(height, width, spec).astype(np.float64)
        total += alpha * value
        weight += alpha
    return total / np.maximum(weight, 1.0)


def coverage_map(shape: Sequence[int], specs: Sequence[MaskSpec], importance: Sequence[float]) -> np.ndarray:
    """How much of each pixel the masks with a value cover, in [0, 1] (the tint's opacity)."""
    height, width = int(shape[0]), int(shape[1])
    alphas = [occlusion(height, width, s) for s, v in zip(specs, importance) if not math.isnan(v)]
    return np.minimum(np.sum(alphas, axis=0, dtype=np.float64), 1.0) if alphas else np.zeros((height, width))


def scaled(importance: Sequence[float]) -> list[float]:
    """Importances scaled to [0, 1] within one panel (NaN stays NaN); all equal -> all 0 (none stands out)."""
    values = np.asarray(importance, dtype=np.float64)
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return values.tolist()
    low, span = finite.min(), finite.max() - finite.min()
    unit = (values - low) / span if span > 0 else np.zeros_like(values)
    return np.where(np.isnan(values), np.nan, unit).tolist()


def heatmap_figure(
    image_rgb: np.ndarray, specs: Sequence[MaskSpec], panels: dict[str, Sequence[float]], title: str = ""
) -> Figure:
    """The figure `write_heatmap` saves: "humans" first, then the other panels in the given order."""
    if not panels:
        raise ValueError("no panels to draw")
    rgb = as_rgb(image_rgb)
    height, width = rgb.shape[:2]
    order = ([HUMANS] if HUMANS in panels else []) + [name for name in panels if name != HUMANS]
    cmap = ScalarMappable(norm=Normalize(0.0, 1.0), cmap=CMAP)
    panel_width = PANEL_HEIGHT_IN * width / height
    fig = Figure(figsize=(panel_width * len(order) + 1.2, PANEL_HEIGHT_IN + 0.9), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(order), squeeze=False)[0]
    for ax, name in zip(axes, order):
        raw = [float(v) for v in panels[name]]
        colour = scaled(raw)
        tint = cmap.to_rgba(np.nan_to_num(importance_map(rgb.shape, specs, colour)))
        tint[..., 3] = TINT_ALPHA * coverage_map(rgb.shape, specs, colour)
        ax.imshow(rgb)
        ax.imshow(tint)
        for spec, value in zip(specs, raw):
            x0, y0, x1, y1 = spec.box
            label = "n/a" if math.isnan(value) else f"{value:.2f}"
            ax.text(
                (x0 + x1) / 2 * width,
                (y0 + y1) / 2 * height,
                label,
                ha="center",
                va="center",
                fontsize=9,
                color="white",
                fontweight="bold",
                bbox={"facecolor": "black", "alpha": 0.55, "pad": 2, "lw": 0},
            )
        ax.set_title(name, fontsize=10)
        ax.set_axis_off()
    bar = fig.colorbar(cmap, ax=list(axes), fraction=0.04, pad=0.02)
    bar.set_label("importance, scaled per panel\n(0 least, 1 most; numbers: 1 - similarity)", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def write_heatmap(
    image_rgb: np.ndarray, specs: list[MaskSpec], panels: dict[str, list[float]], path: Path, title: str = ""
) -> None:
    """Draw the heat map of one image and write it as a PNG atomically (temporary file, then replace)."""
    save_figure(heatmap_figure(image_rgb, specs, panels, title), Path(path), dpi=DPI)
