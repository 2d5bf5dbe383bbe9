"""Hand-made cases the error taxonomy's tests share: vectors whose cosines are set by hand, a matcher
that embeds each object's name by them, mentions and detections."""

from __future__ import annotations

import numpy as np

from vlm_decade.models.backends.detection import Detection
from vlm_decade.studies.decade.taxonomy.objects import MATCH_THRESHOLD, Mention, ObjectMatcher


def axis_vector(*pairs, dim: int = 14) -> np.ndarray:
    """A `dim`-d vector with the given (axis, value) entries, zero elsewhere."""
    v = np.zeros(dim)
    for axis, value in pairs:
        v[axis] = value
    return v


def hand_matcher(vector_of, threshold: float = MATCH_THRESHOLD) -> ObjectMatcher:
    """A matcher whose encoder embeds a mention's text ("a cat", "the sofa") as `vector_of` its name."""
    return ObjectMatcher(lambda texts: np.array([vector_of(t.split(" ", 1)[1]) for t in texts]), threshold)


def mentions(*names: str) -> list[Mention]:
    return [Mention(name, f"a {name}") for name in names]


def det(label: str, score: float = 0.9, box=(0.1, 0.2, 0.5, 0.6)) -> Detection:
    return Detection(label, score, box)
