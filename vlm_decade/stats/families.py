"""Comparison families: what is compared with what, and which comparisons share one BH correction.

A `Term` is the mean over one or more subjects on one dataset (one subject: that subject's mean;
an era: the mean of its subjects, taken per resample). A `ComparisonSpec` is the difference
a - b of two terms. A `Family` is a name and a list of specs; q-values are computed within a
family (separately for each metric and variant). New families (error type vs no error, ...) are
just new lists of specs.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

ERAS = ("pre-mllm", "mllm", "human")
HUMAN_GROUPS = ("human:top", "human:bottom")


@dataclass(frozen=True)
class Term:
    label: str
    subjects: tuple[str, ...]
    dataset: str

    @classmethod
    def subject(cls, subject: str, dataset: str) -> Term:
        return cls(subject, (subject,), dataset)

    @classmethod
    def group(cls, label: str, subjects, dataset: str) -> Term:
        return cls(label, tuple(sorted(subjects)), dataset)


@dataclass(frozen=True)
class ComparisonSpec:
    a: Term
    b: Term


@dataclass(frozen=True)
class Family:
    """`shared_images`: a comparison on one dataset uses only the images that every subject of both
    terms has a score for (a model missing some images is compared with humans on the same images,
    not its mean over fewer images with theirs over all); the images it leaves out are counted in
    the comparison's `n_dropped`. Off, each term averages its own images (groups of different
    pairs, as the error impact compares)."""

    name: str
    specs: tuple[ComparisonSpec, ...]
    shared_images: bool = False

    def __init__(self, name: str, specs, shared_images: bool = False) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "specs", tuple(specs))
        object.__setattr__(self, "shared_images", shared_images)


def era_label(era: str) -> str:
    return f"era:{era}"


def _members(eras: dict[str, str], era: str) -> list[str]:
    return sorted(s for s, e in eras.items() if e == era)


def era_family(eras: dict[str, str], datasets) -> Family:
    """(a) pre-MLLM mean vs MLLM mean, on each dataset."""
    pre, mllm = _members(eras, "pre-mllm"), _members(eras, "mllm")
    specs = []
    if pre and mllm:
        for d in sorted(datasets):
            specs.append(
                ComparisonSpec(Term.group(era_label("pre-mllm"), pre, d), Term.group(era_label("mllm"), mllm, d))
            )
    return Family("era", specs, shared_images=True)


def dataset_family(eras: dict[str, str], datasets) -> Family:
    """(b) each subject on each pair of datasets (independent resamples), e.g. CSB vs COCO.

    The era means are included as two more "subjects", since the paper's headline ("pre-MLLMs
    are much worse on CSB than on COCO") is about the era mean.
    """
    specs = []
    pairs = list(combinations(sorted(datasets), 2))
    for s in sorted(eras):
        for d1, d2 in pairs:
            specs.append(ComparisonSpec(Term.subject(s, d1), Term.subject(s, d2)))
    for era in ("pre-mllm", "mllm"):
        members = _members(eras, era)
        if members:
            for d1, d2 in pairs:
                specs.append(
                    ComparisonSpec(Term.group(era_label(era), members, d1), Term.group(era_label(era), members, d2))
                )
    return Family("dataset", specs)


def vs_humans_family(eras: dict[str, str], datasets) -> Family:
    """(c) each model vs human:top and vs human:bottom, on each dataset (paired)."""
    models = sorted(s for s, e in eras.items() if e in ("pre-mllm", "mllm"))
    humans = [h for h in HUMAN_GROUPS if h in eras]
    specs = [
        ComparisonSpec(Term.subject(m, d), Term.subject(h, d)) for d in sorted(datasets) for m in models for h in humans
    ]
    return Family("vs-humans", specs, shared_images=True)


def era_vs_humans_family(eras: dict[str, str], datasets) -> Family:
    """(d) the era means against the human groups the paper compares them with, on each dataset
    (paired): the pre-MLLM mean vs the bottom-ranked humans ("below bottom-ranked humans on CSB"),
    the MLLM mean vs the top-ranked humans ("near top-ranked humans")."""
    pairs = (("pre-mllm", "human:bottom"), ("mllm", "human:top"))
    specs = [
        ComparisonSpec(Term.group(era_label(era), _members(eras, era), d), Term.subject(human, d))
        for d in sorted(datasets)
        for era, human in pairs
        if _members(eras, era) and human in eras
    ]
    return Family("era-vs-humans", specs)


def within_era_family(eras: dict[str, str], datasets) -> Family:
    """(e) every pair of models of one era, on each dataset (paired): which models of an era differ."""
    specs = [
        ComparisonSpec(Term.subject(a, d), Term.subject(b, d))
        for era in ("pre-mllm", "mllm")
        for d in sorted(datasets)
        for a, b in combinations(_members(eras, era), 2)
    ]
    return Family("within-era", specs)


def default_families(eras: dict[str, str], datasets) -> list[Family]:
    """The paper's families: era, dataset, vs-humans, era-vs-humans, within-era."""
    return [
        era_family(eras, datasets),
        dataset_family(eras, datasets),
        vs_humans_family(eras, datasets),
        era_vs_humans_family(eras, datasets),
        within_era_family(eras, datasets),
    ]
