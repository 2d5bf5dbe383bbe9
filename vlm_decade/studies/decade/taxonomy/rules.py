"""Detector-based error labels for local models (METHOD.md "Error taxonomy", paper section 2.5.1).

For one (model, image): the relevant objects (named in the gold description), the detector's
boxes on the image and the objects the model's description names give a list of `Finding`s:

- detection: a relevant object neither mentioned nor detected;
- recognition: a detected relevant object left unmentioned while the description names, in its place,
  something confusable with it that is neither in the gold nor detected; or a detected irrelevant
  (non-gold) object, unmentioned, that such a mention misnames;
- scene_understanding: a relevant object detected (and not misnamed) but left out of the description;
- hallucination: a mentioned object that matches no gold object and no detection and misnames nothing.

A mention of a detected object the gold leaves out is no error. Misnamings are paired greedily, most
similar pair first, one mention per object.

With an open-vocabulary locator (`located_errors`), the paper's reading of the detector's
classification: each relevant object is found by its name, and the local model's boxes at that place
(IoU) say what its detector made of it: no box there -> detection; a box of its class -> scene
understanding (if left out); only boxes of other classes -> recognition (misclassified). A mention
outside the gold that no independent source finds: its box lying on an object that is there (gold or
human-named, also located) -> recognition (that object misidentified); otherwise -> hallucination.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from vlm_decade.models.backends.detection import Detection
from vlm_decade.studies.decade.taxonomy.objects import CONFUSABLE_THRESHOLD, Mention, ObjectMatcher

ERROR_TYPES = ("detection", "recognition", "scene_understanding", "hallucination")


@dataclass(frozen=True)
class Finding:
    """One error of `error_type` about object `obj`, with the evidence that decided it (JSON-ready).

    `unclear` marks a probe whose answer could not be read: kept so the transcript shows, never
    counted as an error."""

    error_type: str
    obj: str
    evidence: dict
    unclear: bool = False

    def __post_init__(self):
        if self.error_type not in ERROR_TYPES:
            raise ValueError(f"unknown error type {self.error_type!r}; expected one of {ERROR_TYPES}")


def detector_errors(
    relevant: Sequence[Mention],
    detections: Sequence[Detection],
    mentioned: Sequence[Mention],
    matcher: ObjectMatcher,
    confusable: float = CONFUSABLE_THRESHOLD,
    existence: dict[str, dict] | None = None,
) -> list[Finding]:
    """The errors of one description, in ERROR_TYPES order: detection and scene understanding in the
    gold's order, recognition relevant objects first (gold order) then irrelevant ones (detection
    order), hallucination in the description's order. `confusable` is the least similarity of a
    misnaming to the object it misnames. `existence` (name -> `existence.check` verdict) says which
    mentioned objects outside the gold an independent source found in the image: those are no error;
    one whose verdict is undecided (None) gives an unclear hallucination if it misnames nothing."""
    gold = _unique(relevant)
    said = _unique(mentioned)
    best_box = _best_box_per_label(detections)
    labels = list(best_box)
    gold_names = [g.name for g in gold]
    said_names = [m.name for m in said]

    missed = [g for g in gold if matcher.best_match(g.name, said_names) is None]
    seen = {g.name: matcher.best_match(g.name, labels) for g in missed}
    verdicts = existence or {}
    unexplained = [
        m
        for m in said
        if matcher.best_match(m.name, gold_names) is None
        and matcher.best_match(m.name, labels) is None
        and verdicts.get(m.name, {}).get("present") is not True
    ]
    ignored = [
        label
        for label in labels
        if matcher.best_match(label, gold_names) is None and matcher.best_match(label, said_names) is None
    ]

    # Objects the detector saw that the description does not name, each with its detection label.
    targets = [(g.name, g.phrase, seen[g.name][0], True) for g in missed if seen[g.name] is not None]
    targets += [(label, label, label, False) for label in ignored]
    pairs = _pair(unexplained, targets, matcher, confusable)

    detection = [
        Finding("detection", g.name, {"object": g.name, "phrase": g.phrase}) for g in missed if seen[g.name] is None
    ]
    recognition, scene = [], []
    for t, (obj, phrase, label, is_relevant) in enumerate(targets):
        box = _box_evidence(best_box[label])
        if t in pairs:
            mention, score = pairs[t]
            recognition.append(
                Finding(
                    "recognition",
                    obj,
                    {
                        "object": obj,
                        "phrase": phrase,
                        "relevant": is_relevant,
                        "named_as": mention.name,
                        "named_phrase": mention.phrase,
                        "similarity": round(score, 3),
                        "detection": box,
                    },
                )
            )
        elif is_relevant:
            scene.append(
                Finding(
                    "scene_understanding",
                    obj,
                    {"object": obj, "phrase": phrase, "similarity": round(seen[obj][1], 3), "detection": box},
                )
            )
    misnamed = {mention.name for mention, _ in pairs.values()}
    hallucination = [_hallucination(m, verdicts.get(m.name)) for m in unexplained if m.name not in misnamed]
    return detection + recognition + scene + hallucination


def iou(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> float:
    """Intersection over union of two boxes (x0, y0, x1, y1); 0 when either has no area."""
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    inter = max(w, 0.0) * max(h, 0.0)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def located_errors(
    relevant: Sequence[Mention],
    detections: Sequence[Detection],
    mentioned: Sequence[Mention],
    matcher: ObjectMatcher,
    located: Sequence[Detection],
    min_score: float,
    min_iou: float,
    existence: dict[str, dict] | None = None,
    present: Sequence[str] = (),
) -> list[Finding]:
    """The errors of one description read from where things are (the paper's 2.5.1 with boxes):
    `located` are the locator's boxes (label = the object's name asked for), a find when scoring at
    least `min_score`; a local model's box is at an object's place when its IoU with the object's
    best located box reaches `min_iou`. `present`: the objects known to be in the image (gold and
    human-named), located too, that a box of a mentioned object may lie on.

    Relevant objects (gold order): mentioned -> no error; else the boxes at its place decide:
    none -> detection, one of its class -> scene understanding, only others -> recognition (the class
    the detector gave, `named_as`). A relevant object the locator did not find falls back to the
    name rules: a box of its class anywhere -> scene understanding, none -> detection.
    Mentioned objects outside the gold (description order), unless an independent source found them
    (`existence`): a box of the mention's class that lies on a present object other than one the
    description names -> recognition about that object (unless already counted as its misclassification);
    otherwise -> hallucination (undecided existence: unclear)."""
    gold = _unique(relevant)
    said = _unique(mentioned)
    said_names = [m.name for m in said]
    gold_names = [g.name for g in gold]
    verdicts = existence or {}
    image = _Located(matcher, detections, located, min_score, min_iou)
    findings = [_relevant_error(g, image) for g in gold if matcher.best_match(g.name, said_names) is None]
    misclassified = {f.obj for f in findings if f.error_type == "recognition"}
    others = [name for name in dict.fromkeys(present) if matcher.best_match(name, said_names) is None]
    for m in said:
        if matcher.best_match(m.name, gold_names) is not None or verdicts.get(m.name, {}).get("present") is True:
            continue
        finding = _mention_error(m, image, others, gold_names, misclassified, verdicts.get(m.name))
        if finding is not None:
            findings.append(finding)
    return [f for t in ERROR_TYPES for f in findings if f.error_type == t]


@dataclass(frozen=True)
class _Located:
    """One image's boxes as `located_errors` reads them: the local model's `detections`, the
    locator's `located` (a find from `min_score`), and `min_iou`, the overlap that puts a box at a place."""

    matcher: ObjectMatcher
    detections: Sequence[Detection]
    located: Sequence[Detection]
    min_score: float
    min_iou: float

    def place(self, name: str) -> Detection | None:
        """Where the locator found `name`, if it did."""
        best = best_located(self.located, name)
        return best if best is not None and best.score >= self.min_score else None

    def boxes_at(self, spot: Detection) -> list[tuple[Detection, float]]:
        """The local model's boxes at `spot`, each with its IoU."""
        return [(d, iou(d.box, spot.box)) for d in self.detections if iou(d.box, spot.box) >= self.min_iou]

    def own(self, name: str) -> list[Detection]:
        """The local model's boxes of `name`'s class, anywhere."""
        return [d for d in self.detections if self.matcher.matches(d.label, name)]


def _relevant_error(g: Mention, image: _Located) -> Finding:
    """The error about a relevant object the description leaves out, from the boxes at its place
    (or, when the locator did not find it, from the name rules)."""
    spot = image.place(g.name)
    evidence = {"object": g.name, "phrase": g.phrase, "located": None if spot is None else _box_evidence(spot)}
    if spot is None:  # not found by name: the name rule
        own = image.own(g.name)
        evidence["located"] = "not found: read by name"
        if own:
            best = max(own, key=lambda d: d.score)
            return Finding("scene_understanding", g.name, {**evidence, "detection": _box_evidence(best)})
        return Finding("detection", g.name, evidence)
    there = image.boxes_at(spot)
    evidence["boxes_there"] = [{**_box_evidence(d), "iou": round(v, 3)} for d, v in there]
    if not there:
        return Finding("detection", g.name, evidence)
    if any(image.matcher.matches(d.label, g.name) for d, _ in there):
        return Finding("scene_understanding", g.name, evidence)
    label = max(there, key=lambda pair: (pair[1], pair[0].score))[0].label
    return Finding("recognition", g.name, {**evidence, "relevant": True, "named_as": label})


def _mention_error(
    m: Mention,
    image: _Located,
    others: list[str],
    gold_names: list[str],
    misclassified: set[str],
    verdict: dict | None,
) -> Finding | None:
    """The error of a mention outside the gold: recognition about the present, unnamed object
    (`others`) its box lies on (None when that object's misclassification is already counted),
    else hallucination (`verdict`: the independent source's, undecided -> unclear)."""
    own = image.own(m.name)
    lies_on = [
        (thing, d, iou(d.box, spot.box))
        for d in own
        for thing in others
        if (spot := image.place(thing)) is not None and iou(d.box, spot.box) >= image.min_iou
    ]
    if lies_on:
        thing, box, overlap = max(lies_on, key=lambda t: (t[2], t[1].score))
        if thing in misclassified:
            return None
        evidence = {
            "object": thing,
            "relevant": image.matcher.best_match(thing, gold_names) is not None,
            "named_as": m.name,
            "named_phrase": m.phrase,
            "detection": {**_box_evidence(box), "iou": round(overlap, 3)},
            "located": _box_evidence(image.place(thing)),
        }
        return Finding("recognition", thing, evidence)
    evidence = {"object": m.name, "phrase": m.phrase, "detections": [_box_evidence(d) for d in own]}
    if verdict is not None:
        evidence["existence"] = verdict
    return Finding("hallucination", m.name, evidence, unclear=verdict is not None and verdict["present"] is None)


def best_located(located: Sequence[Detection], name: str) -> Detection | None:
    """The highest-scoring box the locator found for the name `name` (the earliest on a tie)."""
    best = None
    for det in located:
        if det.label == name and (best is None or det.score > best.score):
            best = det
    return best


def _hallucination(mention: Mention, verdict: dict | None) -> Finding:
    evidence = {"object": mention.name, "phrase": mention.phrase}
    if verdict is None:
        return Finding("hallucination", mention.name, evidence)
    return Finding(
        "hallucination", mention.name, {**evidence, "existence": verdict}, unclear=verdict["present"] is None
    )


def summarise(findings: Sequence[Finding]) -> dict[str, tuple[bool, str]]:
    """For every error type: whether it is present (any finding that is not unclear) and the
    evidence of its findings as compact JSON ("[]" when none)."""
    summary = {}
    for error_type in ERROR_TYPES:
        mine = [f for f in findings if f.error_type == error_type]
        evidence = [{**f.evidence, "unclear": True} if f.unclear else f.evidence for f in mine]
        summary[error_type] = (
            any(not f.unclear for f in mine),
            json.dumps(evidence, separators=(",", ":"), ensure_ascii=False),
        )
    return summary


def _pair(
    mentions: list[Mention], targets: list[tuple[str, str, str, bool]], matcher: ObjectMatcher, confusable: float
) -> dict[int, tuple[Mention, float]]:
    """Greedy one-to-one pairing of unexplained mentions with unnamed detected objects, most similar
    first (ties: earlier object, then earlier mention). A mention's similarity to an object is the
    larger of its similarity to the object's name and to the detection label that found it."""
    candidates = []
    for t, (obj, _, label, _) in enumerate(targets):
        for m, mention in enumerate(mentions):
            score = max(matcher.similarity(mention.name, obj), matcher.similarity(mention.name, label))
            if score >= confusable:
                candidates.append((-score, t, m))
    pairs: dict[int, tuple[Mention, float]] = {}
    used: set[int] = set()
    for negative, t, m in sorted(candidates):
        if t not in pairs and m not in used:
            pairs[t] = (mentions[m], -negative)
            used.add(m)
    return pairs


def _unique(mentions: Sequence[Mention]) -> list[Mention]:
    """The first mention of each name, in order."""
    first: dict[str, Mention] = {}
    for mention in mentions:
        first.setdefault(mention.name, mention)
    return list(first.values())


def _best_box_per_label(detections: Sequence[Detection]) -> dict[str, Detection]:
    """Each detected label once (first-seen order) with its highest-scoring box, as evidence."""
    best: dict[str, Detection] = {}
    for det in detections:
        if det.label not in best or det.score > best[det.label].score:
            best[det.label] = det
    return best


def _box_evidence(det: Detection) -> dict:
    return {"label": det.label, "score": round(det.score, 3), "box": [round(v, 3) for v in det.box]}
