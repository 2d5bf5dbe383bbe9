"""Is a mentioned object really in the image? Evidence that does not come from the model itself.

A model's description may name an object that the gold description does not (a *candidate*
hallucination). The paper counts it as a hallucination only when the object is not in the scene and
is not a misclassification of an object that is (section 2.5). Whether it is in the scene is
checked here against sources independent of the model (a model asked about its own mention tends to
agree with itself):

- `humans`: every human description of the full image (all workers, not only the gold): an object
  that at least `min_humans` of them name is there;
- `locator`: an open-vocabulary detector queried with the object's name found a box scoring at least
  its `min_score` (when the study's verifier is the locator);
- `verifier`: another MLLM, asked "Is there a guitar in this image?", said yes (when the study's
  verifier is a model).

`check(obj, evidence, matcher)` returns the verdict with every check it made: `present` True when
any source finds the object, None when none does but the verifier's answer could not be read or the
locator failed on the image (no label can be given), False otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vlm_decade.models.backends.detection import Detection
from vlm_decade.studies.decade.taxonomy.objects import Mention, ObjectMatcher
from vlm_decade.studies.decade.taxonomy.probes import parse_yes_no
from vlm_decade.studies.decade.taxonomy.rules import best_located


@dataclass(frozen=True)
class ImageEvidence:
    """What is known of one image beyond its gold description.

    `humans`: the objects each human description of the full image names (every worker);
    `min_humans`: how many of them must name an object for it to be there;
    `located`: the locator's boxes (label = the query), None when the locator is not the verifier;
    `locator_failed`: the locator is the verifier but failed on this image (nothing can be said);
    `verifier`: object -> (question, answer) of the verifier model, None when it is not the verifier."""

    humans: tuple[tuple[str, ...], ...] = ()
    min_humans: int = 1
    located: tuple[Detection, ...] | None = None
    locator_failed: bool = False
    min_score: float = 0.0
    verifier: dict[str, tuple[str, str]] | None = None
    verifier_name: str = ""


def candidates(relevant: Sequence[Mention], mentioned: Sequence[Mention], matcher: ObjectMatcher) -> list[str]:
    """The mentioned objects (first mention of each name, in order) that match no gold object."""
    gold = list(dict.fromkeys(m.name for m in relevant))
    return [name for name in dict.fromkeys(m.name for m in mentioned) if matcher.best_match(name, gold) is None]


def check(obj: str, evidence: ImageEvidence, matcher: ObjectMatcher) -> dict:
    """The verdict on whether `obj` is in the image, with each check's evidence (JSON-ready):
    {"object", "present": True | False | None, "checks": [...]}."""
    checks = []
    named = [m for names in evidence.humans if (m := matcher.best_match(obj, list(names))) is not None]
    checks.append(
        {
            "source": "humans",
            "descriptions": len(evidence.humans),
            "naming": len(named),
            "min": evidence.min_humans,
            "found": len(named) >= evidence.min_humans,
            "named_as": sorted({m[0] for m in named}),
        }
    )
    unclear = evidence.locator_failed
    if evidence.locator_failed:
        checks.append({"source": "locator", "found": False, "failed": True})
    elif evidence.located is not None:
        box = best_located(evidence.located, obj)
        found = box is not None and box.score >= evidence.min_score
        checks.append(
            {
                "source": "locator",
                "found": found,
                "min_score": evidence.min_score,
                "best_score": None if box is None else round(box.score, 3),
                "box": None if box is None else [round(v, 3) for v in box.box],
            }
        )
    if evidence.verifier is not None:
        question, answer = evidence.verifier.get(obj, (None, None))
        reading = None if answer is None else parse_yes_no(answer)
        unclear = reading is None
        checks.append(
            {
                "source": "verifier",
                "model": evidence.verifier_name,
                "question": question,
                "answer": answer,
                "reading": "unasked"
                if answer is None
                else "unclear"
                if reading is None
                else "yes"
                if reading
                else "no",
                "found": reading is True,
            }
        )
    present = True if any(c["found"] for c in checks) else (None if unclear else False)
    return {"object": obj, "present": present, "checks": checks}
