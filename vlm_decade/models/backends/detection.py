"""`Detection`: one detected object, shared by every detector backend (ssd-template, hf-detector)
and by what reads their boxes later (the detections stage, the error taxonomy)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Detection:
    """One detected object: its label, the detector's score and its box (x0, y0, x1, y1) in fractions
    of the image's width and height."""

    label: str
    score: float
    box: tuple[float, float, float, float]

    @property
    def area(self) -> float:
        x0, y0, x1, y1 = self.box
        return (x1 - x0) * (y1 - y0)
