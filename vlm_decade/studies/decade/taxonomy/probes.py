"""Probe-based error labels for API models, whose internals are closed (paper section 2.5.2).

Pure planning and parsing; the caller sends each question with the image through the API.

1. `first_round`: a detection question for each relevant object the description leaves out, in the
   paper's form: it points at the place through another gold object and does not name the object
   ("Is there an object near the man?"), so a model that would misname the object still says yes,
   and a model that says yes to whatever it is asked is caught by the next question; and a location
   question for each mentioned object the gold does not name that no independent source finds in
   the image (the verifier's `presence_questions` ask about it by name).
2. `second_round`: a recognition question ("What is the object near the man?") for each detection
   question answered yes, the name it gives compared with the relevant object by the matcher; and an
   identification question for each location question answered yes.
3. `probe_findings`: detection answered no -> detection error; yes, and the recognition answer names
   the object -> scene understanding (recognised but left out); names something else -> recognition.
   A mentioned object no independent source finds in the image (`existence`) is asked about where the
   description puts it: nothing there, or the mention again -> hallucination; an object that is
   there -> recognition (the mention misidentifies it). Answers that cannot be read give no label,
   only a finding marked unclear that keeps the transcript.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from dataclasses import dataclass

from vlm_decade.studies.decade.taxonomy.objects import Mention, ObjectMatcher, indefinite_article
from vlm_decade.studies.decade.taxonomy.rules import Finding

# The paper's detection question names no object ("Is there an object in the hand of the person
# standing by the wall?"): naming it would let a model that sees something there, but would call it
# something else, answer "no" (a detection error instead of a recognition error).
DETECTION_TEMPLATE = "Is there an object near the {anchor} in this image? Answer yes or no."
# Without another gold object the place cannot be pointed at, so the object is named (our choice).
DETECTION_NO_ANCHOR_TEMPLATE = "Is there {article} {object} in this image? Answer yes or no."
RECOGNITION_TEMPLATE = "What is the object near the {anchor}? Answer with a short noun phrase."
# Without an anchor no single object can be pointed at without naming it, so the model lists what
# it sees and the object counts as recognised when the list names it.
RECOGNITION_NO_ANCHOR_TEMPLATE = (
    "List the objects you can see in this image, as short noun phrases separated by commas."
)
PRESENCE_TEMPLATE = "Is there {article} {object} in this image? Answer yes or no."

_FIELDS = {"object", "anchor", "article"}
QUESTION_KINDS = ("detection", "recognition", "location", "identification", "presence")


@dataclass(frozen=True)
class ProbeTemplates:
    """The question wordings (configurable); fields {object}, {anchor} and {article} ("a"/"an" for
    the object). Recognition questions must not name the object: that would answer them. The
    detection question may name it (the older "Is there a flashlight near the man?" form), though the
    default, as the paper, does not."""

    detection: str = DETECTION_TEMPLATE
    detection_no_anchor: str = DETECTION_NO_ANCHOR_TEMPLATE
    recognition: str = RECOGNITION_TEMPLATE
    recognition_no_anchor: str = RECOGNITION_NO_ANCHOR_TEMPLATE
    presence: str = PRESENCE_TEMPLATE

    def __post_init__(self):
        rules = {  # template -> (fields it needs, fields it must not use)
            "detection": ({"anchor"}, set()),
            "detection_no_anchor": ({"object"}, {"anchor"}),
            "recognition": ({"anchor"}, {"object", "article"}),
            "recognition_no_anchor": (set(), {"object", "article", "anchor"}),
            "presence": ({"object"}, {"anchor"}),
        }
        for name, (needed, banned) in rules.items():
            template = getattr(self, name)
            used = {field for _, field, _, _ in string.Formatter().parse(template) if field is not None}
            problems = [f"unknown field(s) {sorted(used - _FIELDS)}"] if used - _FIELDS else []
            if needed - used:
                problems.append(f"needs {sorted(needed - used)}")
            if used & banned:
                problems.append(f"must not use {sorted(used & banned)}")
            if problems:
                raise ValueError(f"probe template {name!r} ({template!r}): {'; '.join(problems)}")


@dataclass(frozen=True)
class Question:
    """One probe, about object `obj`, pointed at through `anchor` (another gold object, or for a
    location question the object the description places `obj` near) or None, worded as `text`.
    `kind`: "detection" / "recognition" (a relevant object left out), "location" / "identification"
    (the place of a mentioned object nothing else finds) or "presence" (the verifier's question)."""

    kind: str
    obj: str
    anchor: str | None
    text: str

    def __post_init__(self):
        if self.kind not in QUESTION_KINDS:
            raise ValueError(f"unknown question kind {self.kind!r}; expected one of {QUESTION_KINDS}")


def first_round(
    relevant: Sequence[Mention],
    mentioned: Sequence[Mention],
    matcher: ObjectMatcher,
    templates: ProbeTemplates = ProbeTemplates(),
    absent: Sequence[str] = (),
) -> list[Question]:
    """Detection questions for the relevant objects the description does not mention (gold order),
    then location questions for the mentioned objects in `absent` (those no independent source found
    in the image, `existence.check`; description order).

    The anchor of a relevant object is the first other gold object, in the gold's order, that it does
    not match and that no earlier question used: each question is asked with no history, so two
    objects near one anchor would get the same recognition question, and the same answer. Only when
    every candidate is taken is an anchor shared.

    A location question asks, in the detection question's words, about the place where the
    description puts the absent object: near its `reference`, the object the description names
    nearest to it that the gold also names (the paper: "we analysed the model's description,
    determined a potential location based on a reference object, and asked questions similar to the
    detection and recognition questions"). An absent object with no such reference gets none."""
    gold = list(dict.fromkeys(m.name for m in relevant))
    said = list(dict.fromkeys(m.name for m in mentioned))
    questions = []
    used: set[str] = set()
    for obj in gold:
        if matcher.best_match(obj, said) is None:
            candidates = [other for other in gold if other != obj and not matcher.matches(obj, other)]
            anchor = next((c for c in candidates if c not in used), candidates[0] if candidates else None)
            used.add(anchor)
            template = templates.detection if anchor else templates.detection_no_anchor
            questions.append(Question("detection", obj, anchor, _fill(template, obj, anchor)))
    for obj in dict.fromkeys(absent):
        anchor = reference(obj, said, gold, matcher)
        if anchor is not None:
            questions.append(Question("location", obj, anchor, _fill(templates.detection, obj, anchor)))
    return questions


def reference(obj: str, said: Sequence[str], gold: Sequence[str], matcher: ObjectMatcher) -> str | None:
    """The object that places `obj` in the description: of the mentioned objects that match a gold
    object (so are there), the nearest to `obj` in the description's order, the earlier on a tie
    ("a man holding a frisbee" places the frisbee near the man); None when there is none."""
    at = list(said).index(obj)
    near = [
        (abs(j - at), j > at, name)
        for j, name in enumerate(said)
        if j != at and matcher.best_match(name, list(gold)) is not None
    ]
    return min(near)[2] if near else None


def second_round(
    answered: Sequence[tuple[Question, str]], templates: ProbeTemplates = ProbeTemplates()
) -> list[Question]:
    """A recognition question for each detection question answered yes, and an identification
    question ("What is the object near the man?") for each location question answered yes, with the
    same anchor."""
    asked = []
    for q, answer in answered:
        if q.kind not in ("detection", "location") or parse_yes_no(answer) is not True:
            continue
        kind = "recognition" if q.kind == "detection" else "identification"
        template = templates.recognition if q.anchor else templates.recognition_no_anchor
        asked.append(Question(kind, q.obj, q.anchor, _fill(template, q.obj, q.anchor)))
    return asked


def presence_questions(objects: Sequence[str], templates: ProbeTemplates = ProbeTemplates()) -> list[Question]:
    """The verifier's questions: is each object in the image (it is told which object)?"""
    return [Question("presence", obj, None, _fill(templates.presence, obj, None)) for obj in dict.fromkeys(objects)]


def _fill(template: str, obj: str, anchor: str | None) -> str:
    return template.format(object=obj, anchor=anchor or "", article=indefinite_article(obj))


# -- reading answers --------------------------------------------------------------------------------

_YES = {"yes", "yeah", "yep", "yup", "correct", "affirmative", "true"}
_NO = {"no", "nope", "not", "negative", "false", "none"}
# Statements of doubt: they override even a leading yes/no ("Yes? I'm not sure").
_DOUBT = re.compile(
    r"\b(?:not sure|unsure|uncertain|unclear|not clear|can'?t tell|cannot tell|can not tell|hard to (?:say|tell)"
    r"|difficult to (?:say|tell)|impossible to (?:say|tell)|(?:don'?t|do not) know|cannot determine"
    r"|can'?t determine|unable to (?:see|tell|determine))\b"
)
# Hedges: an answer without a leading yes/no that hedges is not read.
_HEDGE = re.compile(r"\b(?:maybe|perhaps|possibly|probably|might|could be|likely|unlikely)\b")
_NEGATIVE = re.compile(
    r"\bthere(?: is|'s| are) no\b|\bthere (?:isn'?t|aren'?t|is not|are not)\b|\bno (?:such|visible)\b"
    r"|\b(?:don'?t|do not|can'?t|cannot|can not) see\b|\bi see no\b|\bnot (?:present|visible)\b"
)
_POSITIVE = re.compile(
    r"\bthere(?: is|'s| are| (?:appears|seems) to be)\b|\bi (?:can )?see\b|\b(?:is|are) (?:present|visible)\b"
)


def parse_yes_no(text: str) -> bool | None:
    """Read a yes/no answer: True, False, or None when it is unclear (empty, doubtful, hedged
    without a leading yes/no, or neither)."""
    lowered = text.lower().replace("\u2019", "'").strip()
    if _DOUBT.search(lowered):
        return None
    words = re.findall(r"[a-z']+", lowered)
    if not words:
        return None
    if words[0] in _YES:
        return True
    if words[0] in _NO:
        return False
    if _HEDGE.search(lowered):
        return None
    if _NEGATIVE.search(lowered):
        return False
    if _POSITIVE.search(lowered):
        return True
    return None


_LEAD_INS = re.compile(
    r"^(?:(?:it|this|that) (?:is|looks like|appears to be|seems to be)|it's|that's|there (?:is|are)"
    r"|i (?:can )?see|the object(?: near the [a-z' -]+?)? is|the objects are)\s+"
)
_DETERMINERS = set(
    "a an the some one two three four five six seven eight nine ten several many his her their its my "
    "your this that these those another".split()
)
_PREPOSITION = re.compile(r"\s(?:of|with|on|in|at|by|near|next to|under|behind|beside|holding|from)\s")
_NOTHING = re.compile(r"^(?:nothing|no object|none)\b")


def answer_names(text: str) -> list[str]:
    """The object names in a short answer ("A small cat." -> ["small cat"]; "a cup, a spoon and a
    saucer" -> three names): lower-cased, lead-ins ("it is") and determiners removed. Empty when the
    answer names nothing or doubts."""
    lowered = text.lower().replace("\u2019", "'").strip()
    if _DOUBT.search(lowered):
        return []
    names = []
    for piece in re.split(r"[,;/\n]|\band\b|\bor\b", lowered):
        piece = piece.strip(" \t.!?:\"'()*-")
        piece = _LEAD_INS.sub("", piece)
        words = piece.split()
        while words and words[0] in _DETERMINERS:
            words = words[1:]
        if words and not _NOTHING.match(" ".join(words)):
            names.append(" ".join(words))
    return names


def _name_variants(name: str) -> list[str]:
    """The ways a short answer may name its object: whole, before a preposition ("cup of coffee" ->
    "cup"), and its last one or two words (the English head noun and a compound)."""
    core = _PREPOSITION.split(f" {name} ", maxsplit=1)[0].strip() or name
    words = core.split()
    return list(dict.fromkeys([name, core, " ".join(words[-2:]), words[-1]]))


def _recognised(obj: str, anchor: str | None, answer: str, matcher: ObjectMatcher) -> tuple[str, float] | None:
    """The name in `answer` most similar to `obj` (the earliest on a tie) and that similarity; None
    when the answer names nothing. Names of the anchor itself are skipped: "What is the object near
    the man?" - "A man." says nothing about the object."""
    best: tuple[str, float] | None = None
    for name in answer_names(answer):
        variants = _name_variants(name)
        if anchor is not None and any(matcher.matches(v, anchor) for v in variants):
            continue
        score = max(matcher.similarity(obj, v) for v in variants)
        if best is None or score > best[1]:
            best = (name, score)
    return best


def probe_findings(
    answered: Sequence[tuple[Question, str]],
    matcher: ObjectMatcher,
    existence: dict[str, dict] | None = None,
    relevant: Sequence[str] = (),
    present: Sequence[str] = (),
) -> list[Finding]:
    """The errors a transcript shows, at most one finding per object, relevant objects first (question
    order), then the mentioned objects the gold does not name (`existence`: name -> verdict of
    `existence.check`, in description order).

    Relevant objects: detection answered no -> detection; yes, and the recognition answer names the
    object (matcher) -> scene understanding (recognised but left out); names something else ->
    recognition. Evidence: the object, its anchor, the transcript of its questions with how each
    answer was read ("yes"/"no"/"unclear", or the name a recognition answer gave), and for a
    recognition answer the name it gave (`named_as`) and its similarity to the object.

    Mentioned objects the gold does not name: found in the image by an independent source -> no
    error; not found -> at the place the description puts it (its reference), is there an object, and
    what is it? Nothing there -> hallucination; an object `present` in the image (a gold object or one
    a human named), other than the reference -> recognition (the mention misidentifies it: the
    finding is about that object, `named_as` the mention); the mention itself again, or nothing
    present -> hallucination. A mention that the model gave as the name of a relevant object when
    asked about it is that misnaming (already a recognition finding), not a hallucination. Each
    finding keeps the existence checks and the location transcript."""
    by_kind = {(q.kind, q.obj): (q, a) for q, a in answered}
    findings = []
    for question, answer in answered:
        if question.kind != "detection":
            continue
        reading = parse_yes_no(answer)
        transcript = [_entry(question, answer, _yes_no_word(reading))]
        evidence = {"object": question.obj, "anchor": question.anchor, "transcript": transcript}
        if reading is not True:
            findings.append(Finding("detection", question.obj, evidence, unclear=reading is None))
            continue
        if ("recognition", question.obj) not in by_kind:
            transcript.append({"kind": "recognition", "question": None, "answer": None, "reading": "unasked"})
            findings.append(Finding("recognition", question.obj, evidence, unclear=True))
            continue
        rec_question, rec_answer = by_kind[("recognition", question.obj)]
        named = _recognised(question.obj, question.anchor, rec_answer, matcher)
        transcript.append(_entry(rec_question, rec_answer, named[0] if named else "unclear"))
        if named is None:
            findings.append(Finding("recognition", question.obj, evidence, unclear=True))
            continue
        evidence.update(named_as=named[0], similarity=round(named[1], 3))
        error_type = "scene_understanding" if named[1] >= matcher.threshold else "recognition"
        findings.append(Finding(error_type, question.obj, evidence))
    misnamings = [f.evidence["named_as"] for f in findings if f.error_type == "recognition" and not f.unclear]
    for obj, verdict in (existence or {}).items():
        if verdict["present"] is True:
            continue
        evidence = {"object": obj, "existence": verdict}
        if verdict["present"] is None:
            findings.append(Finding("hallucination", obj, evidence, unclear=True))
            continue
        said_for = next((m for m in misnamings if any(matcher.matches(obj, v) for v in _name_variants(m))), None)
        if said_for is not None:
            continue  # the model's name for a relevant object it was asked about: a recognition error
        finding = _located_finding(obj, evidence, by_kind, matcher, list(relevant), list(present))
        findings.append(finding)
    return findings


def _located_finding(
    obj: str, evidence: dict, by_kind: dict, matcher: ObjectMatcher, relevant: list[str], present: list[str]
) -> Finding:
    """An absent mention, judged by what the model says is at the place the description puts it."""
    if ("location", obj) not in by_kind:
        evidence["location"] = "not asked: the description places it near no object the gold names"
        return Finding("hallucination", obj, evidence)
    question, answer = by_kind[("location", obj)]
    reading = parse_yes_no(answer)
    transcript = [_entry(question, answer, _yes_no_word(reading))]
    evidence.update(reference=question.anchor, transcript=transcript)
    if reading is not True:
        return Finding("hallucination", obj, evidence, unclear=reading is None)
    if ("identification", obj) not in by_kind:
        transcript.append({"kind": "identification", "question": None, "answer": None, "reading": "unasked"})
        return Finding("hallucination", obj, evidence, unclear=True)
    id_question, id_answer = by_kind[("identification", obj)]
    names = answer_names(id_answer)
    real = _present_object(names, obj, question.anchor, present, matcher)
    transcript.append(_entry(id_question, id_answer, ", ".join(names) if names else "unclear"))
    if real is None:
        return Finding("hallucination", obj, evidence, unclear=not names)
    name, thing, similarity = real
    return Finding(
        "recognition",
        thing,
        {
            "object": thing,
            "relevant": matcher.best_match(thing, relevant) is not None,
            "named_as": obj,
            "said_there": name,
            "similarity": round(similarity, 3),
            **evidence,
        },
    )


def _present_object(
    names: Sequence[str], obj: str, anchor: str, present: Sequence[str], matcher: ObjectMatcher
) -> tuple[str, str, float] | None:
    """The first name in an identification answer that names an object present in the image (not the
    reference, not the mention itself): (the name, the present object, their similarity)."""
    for name in names:
        variants = _name_variants(name)
        if any(matcher.matches(v, anchor) or matcher.matches(v, obj) for v in variants):
            continue
        best = max(
            ((thing, matcher.similarity(thing, v)) for thing in present for v in variants),
            key=lambda pair: pair[1],
            default=None,
        )
        if best is not None and best[1] >= matcher.threshold:
            return name, best[0], best[1]
    return None


def _yes_no_word(reading: bool | None) -> str:
    return "unclear" if reading is None else "yes" if reading else "no"


def _entry(question: Question, answer: str, reading: str) -> dict:
    return {"kind": question.kind, "question": question.text, "answer": answer, "reading": reading}
