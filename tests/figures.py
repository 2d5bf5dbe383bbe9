"""What the figure tests look at: a figure as saved (its PNG's pixels) and as drawn (the matplotlib
Figure behind it, its bars, points and curves), so that a blank or one-colour image, or a plot that
lost its data, fails the test that drew it."""

from __future__ import annotations

import io

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from PIL import Image

# A bar or a band is thousands of pixels of its colour; a colour drawn nowhere may still turn up
# in a few antialiased ones, and a legend's patch is a few hundred.
AREA = 1000


def pixels(png) -> np.ndarray:
    """The image at `png` (a path, or its bytes) as an RGB array."""
    with Image.open(io.BytesIO(png) if isinstance(png, bytes) else png) as im:
        return np.asarray(im.convert("RGB"))


def colour_pixels(png, colour: str) -> int:
    """How many pixels of the image are exactly `colour` (#rrggbb): a fill's inside, not its edge."""
    rgb = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)], np.uint8)
    return int((pixels(png) == rgb).all(axis=2).sum())


def assert_drawn(png, min_share: float = 0.02, min_colours: int = 8) -> np.ndarray:
    """The image's pixels, checked to hold a drawing: more than `min_share` of them differ from its
    commonest colour (the background), in at least `min_colours` colours (text and lines are
    antialiased, so even a plot of nothing but axes and words has many)."""
    rgb = pixels(png)
    assert rgb.shape[0] > 100 and rgb.shape[1] > 100, rgb.shape
    colours, counts = np.unique(rgb.reshape(-1, 3), axis=0, return_counts=True)
    drawn = 1 - counts.max() / counts.sum()
    assert drawn > min_share, f"{drawn:.4f} of the pixels differ from the background"
    assert len(colours) >= min_colours, f"{len(colours)} colours"
    return rgb


def record_figures(monkeypatch) -> list[Figure]:
    """Every matplotlib Figure saved from now until the test ends, in order; each is saved as before."""
    saved: list[Figure] = []
    save = Figure.savefig

    def recorded(fig, *args, **kwargs):
        saved.append(fig)
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", recorded)
    return saved


def panels(fig: Figure) -> list:
    """The figure's axes that have a title: its panels (not a colour bar, nor the legend's cell)."""
    return [ax for ax in fig.axes if ax.get_title()]


def bar_heights(ax) -> list[float]:
    """The heights of the bars drawn in `ax`, left to right."""
    bars = sorted((p for p in ax.patches if isinstance(p, Rectangle)), key=lambda p: p.get_x())
    return [float(p.get_height()) for p in bars]


def texts(ax) -> list[str]:
    """The words written inside `ax` (not its title, labels or ticks)."""
    return [t.get_text() for t in ax.texts]


def markers(ax) -> list[tuple[float, float]]:
    """The (x, y) of every round marker drawn in `ax` (an error bar's point, a curve's), in drawing order."""
    return [(float(x), float(y)) for line in ax.lines if line.get_marker() == "o" for x, y in zip(*line.get_data())]


def titled(saved: list[Figure], start: str) -> Figure:
    """The one figure of `saved` whose title, or one of whose panels' titles, begins with `start`."""
    found = [
        fig
        for fig in saved
        if any(t.startswith(start) for t in [fig.get_suptitle(), *(ax.get_title() for ax in fig.axes)])
    ]
    assert len(found) == 1, [fig.get_suptitle() or [ax.get_title() for ax in fig.axes] for fig in saved]
    return found[0]
