"""Similarity metrics of a candidate text to a reference text, as one registry (METHOD.md, "Similarity metric").

Two kinds of metric:

* `cosine`: cosine similarity of two texts' embeddings from any encoder in the encoders registry
  (`vlm_decade.models.encoders`): SBERT-SI with sentence-transformers, GPT-SI and Gemini-SI with the API
  encoders. Each distinct text is embedded once per call, however many pairs it appears in.
* `bertscore`: BERTScore (Zhang et al. 2020) through the bert-score package, F1 by default, without
  baseline rescaling (the baselines are files for hub models only) and without idf weighting.
  Weights resolve as the encoders' do: a configured path, a copy installed from a package (the
  packaged all-MiniLM-L6-v2, so it runs offline), then the hub id.

    metric = build_metric(MetricConfig(name="SBERT-SI", kind="cosine", encoder=EncoderConfig(name="SBERT-SI")))
    values = metric.score(candidates, references)      # float64, NaN where either text is blank

A built metric holds its model, so build it once (in an actor) and call `score` per batch;
`score_pairs(cfg, ...)` does both in one call.

The caption metrics users expect beside them (BLEU-1..4, METEOR, ROUGE-L, CIDEr-D) compare one
candidate with *several* references, so they are not pairwise: `caption_scores(candidates,
references)` scores a set of candidates, each against its own list of references, through
pycocoevalcap, the COCO caption evaluation's reference implementation (its PTB tokenizer and METEOR
run on Java). SPICE is left out: it downloads Stanford CoreNLP models at run time.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from vlm_decade.core.config import MINILM, EncoderConfig, MetricConfig
from vlm_decade.core.registry import Registry
from vlm_decade.models.encoders import encoder_class, normalise, text_key
from vlm_decade.models.encoders.sbert import resolve_weights

COMPONENTS = {"precision": 0, "recall": 1, "f1": 2}  # positions in bert-score's (P, R, F)

METRIC_SCORES_SCHEMA = pa.schema(
    [("subject", pa.string()), ("image_id", pa.string()), ("metric", pa.string()), ("value", pa.float64())]
)


class Metric:
    """A loaded metric: `score(candidates, references)` -> one float64 per pair."""

    def __init__(self, cfg: MetricConfig):
        self.cfg = cfg

    @property
    def name(self) -> str:
        return self.cfg.name

    @property
    def label(self) -> str:
        """What a figure or table legend should say: the metric with its model."""
        return self.cfg.name

    def score(self, candidates: list[str], references: list[str]) -> np.ndarray:
        candidates, references = list(candidates), list(references)
        if len(candidates) != len(references):
            raise ValueError(f"{len(candidates)} candidates but {len(references)} references")
        out = np.full(len(candidates), np.nan)
        ok = [i for i, (c, r) in enumerate(zip(candidates, references)) if c and c.strip() and r and r.strip()]
        if ok:
            out[ok] = self._score([candidates[i].strip() for i in ok], [references[i].strip() for i in ok])
        return out

    def _score(self, candidates: list[str], references: list[str]) -> np.ndarray:
        """Pairs of non-blank, stripped texts -> values."""
        raise NotImplementedError


class CosineMetric(Metric):
    def __init__(self, cfg: MetricConfig):
        super().__init__(cfg)
        self.encoder = encoder_class(cfg.encoder.backend)(cfg.encoder)

    @property
    def label(self) -> str:
        return f"{self.cfg.name} ({self.cfg.encoder.model_id.split('/')[-1]})"

    def _score(self, candidates: list[str], references: list[str]) -> np.ndarray:
        # Dedupe first: a gold standard is shared by every model's description of its image.
        keys = {text_key(t): t for t in [*candidates, *references]}
        order = list(keys)
        vectors = normalise(self.encoder.encode([keys[k] for k in order]))
        row = {k: i for i, k in enumerate(order)}
        a = vectors[[row[text_key(t)] for t in candidates]]
        b = vectors[[row[text_key(t)] for t in references]]
        return np.einsum("ij,ij->i", a.astype(np.float64), b.astype(np.float64))


def bertscore_layers(cfg: MetricConfig) -> int:
    """The layer whose token embeddings are matched: configured, else bert-score's tuned default.

    all-MiniLM-L6-v2 has no tuned default in bert-score; its last (6th) layer is used, as the
    packaged copy is a sentence encoder trained on that layer's output.
    """
    if cfg.num_layers is not None:
        return cfg.num_layers
    if cfg.model_id == MINILM:
        return 6
    from bert_score.utils import model2layers

    if cfg.model_id not in model2layers:
        raise ValueError(f"metric '{cfg.name}': bert-score has no default layer for {cfg.model_id}; set num_layers")
    return model2layers[cfg.model_id]


class BERTScoreMetric(Metric):
    def __init__(self, cfg: MetricConfig):
        super().__init__(cfg)
        from bert_score import BERTScorer

        self.num_layers = bertscore_layers(cfg)
        # lang=None and no rescaling: bert-score then reads no baseline file and fetches nothing.
        self.scorer = BERTScorer(
            model_type=resolve_weights(cfg),
            num_layers=self.num_layers,
            batch_size=cfg.batch_size,
            idf=False,
            rescale_with_baseline=False,
            lang=None,
            device=None if _cuda() else "cpu",
        )

    @property
    def label(self) -> str:
        component = "" if self.cfg.component == "f1" else f" {self.cfg.component}"
        return f"{self.cfg.name}{component} ({self.cfg.model_id.split('/')[-1]}, layer {self.num_layers})"

    def _score(self, candidates: list[str], references: list[str]) -> np.ndarray:
        # bert-score embeds each distinct sentence once, in batches it forms from a `set`, so which
        # sentences share a padded batch would follow Python's per-process hash seed and move the
        # floats in their last bit. Calls of at most `batch_size` sentences are one batch each,
        # formed from the pairs' own order, so every run computes the same numbers.
        step = max(1, self.cfg.batch_size // 2)
        component = COMPONENTS[self.cfg.component]
        chunks = [
            self.scorer.score(candidates[i : i + step], references[i : i + step], batch_size=self.cfg.batch_size)[
                component
            ]
            for i in range(0, len(candidates), step)
        ]
        return np.concatenate([c.numpy() for c in chunks]).astype(np.float64) if chunks else np.zeros(0)


METRICS = Registry(
    "metric kind",
    {"cosine": "vlm_decade.models.metrics:CosineMetric", "bertscore": "vlm_decade.models.metrics:BERTScoreMetric"},
)


def build_metric(cfg: MetricConfig) -> Metric:
    """Load a metric's model once; call `.score` on it as often as needed."""
    return METRICS.load(cfg.kind)(cfg)


def score_pairs(cfg: MetricConfig, candidates: list[str], references: list[str]) -> np.ndarray:
    """One metric's values for (candidate, reference) pairs; NaN where either text is blank."""
    return build_metric(cfg).score(candidates, references)


def cosine_metric(encoder: EncoderConfig) -> MetricConfig:
    """The cosine metric of a study's encoder, named as the encoder (SBERT-SI, GPT-SI, Gemini-SI)."""
    return MetricConfig(name=encoder.name, kind="cosine", encoder=encoder)


def offline_metrics() -> list[MetricConfig]:
    """The metrics that run with no network: SBERT-SI and BERTScore, both on the packaged MiniLM."""
    return [
        cosine_metric(EncoderConfig(name="SBERT-SI", model_id=MINILM)),
        MetricConfig(name="BERTScore", kind="bertscore", model_id=MINILM, num_layers=6),
    ]


def score_table(metrics: list[Metric], pairs: pa.Table) -> pa.Table:
    """(subject, image_id, candidate, reference) rows -> (subject, image_id, metric, value) rows.

    The long table `metric_validation.validate_metrics` takes; `metric` is each metric's name.
    """
    subjects = pairs.column("subject").to_pylist()
    images = pairs.column("image_id").to_pylist()
    candidates = pairs.column("candidate").to_pylist()
    references = pairs.column("reference").to_pylist()
    rows = []
    for metric in metrics:
        values = metric.score(candidates, references)
        rows += [
            {"subject": s, "image_id": i, "metric": metric.name, "value": float(v)}
            for s, i, v in zip(subjects, images, values)
        ]
    rows.sort(key=lambda r: (r["metric"], r["subject"], r["image_id"]))
    return pa.Table.from_pylist(rows, schema=METRIC_SCORES_SCHEMA)


CAPTION_METRICS = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr-D")


def caption_scores(candidates: list[str], references: list[list[str]], names=CAPTION_METRICS) -> dict[str, np.ndarray]:
    """Each candidate's score against its own references, per metric in `names`, as pycocoevalcap
    computes them after its PTB tokenizer (lower case, punctuation dropped): sentence-level BLEU-n
    (closest reference length, its tiny smoothing), METEOR 1.5, ROUGE-L (beta 1.2) and CIDEr-D
    (sigma 6, clipped, x10). CIDEr-D's idf is taken over the references of all the candidates scored
    together, so score one set of images in one call (one model's descriptions). Needs Java."""
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    unknown = sorted(set(names) - set(CAPTION_METRICS))
    if unknown:
        raise ValueError(f"unknown caption metric(s) {unknown}; known: {', '.join(CAPTION_METRICS)}")
    if len(candidates) != len(references):
        raise ValueError(f"{len(candidates)} candidates but {len(references)} reference lists")
    if any(not refs for refs in references):
        raise ValueError("every candidate needs at least one reference")
    if not candidates:
        return {name: np.zeros(0) for name in names}
    keys = [str(i) for i in range(len(candidates))]
    tokenizer = PTBTokenizer()
    res = tokenizer.tokenize({k: [{"caption": c}] for k, c in zip(keys, candidates)})
    gts = tokenizer.tokenize({k: [{"caption": r} for r in refs] for k, refs in zip(keys, references)})
    res, gts = {k: res[k] for k in keys}, {k: gts[k] for k in keys}  # the scorers follow the keys' order
    out: dict[str, np.ndarray] = {}
    bleu = [n for n in names if n.startswith("BLEU-")]
    if bleu:
        from pycocoevalcap.bleu.bleu import Bleu

        _, per = Bleu(4).compute_score(gts, res, verbose=0)
        out.update({n: np.asarray(per[int(n[-1]) - 1], dtype=np.float64) for n in bleu})
    for name, load in (
        ("METEOR", "meteor.meteor:Meteor"),
        ("ROUGE-L", "rouge.rouge:Rouge"),
        ("CIDEr-D", "cider.cider:Cider"),
    ):
        if name in names:
            module, cls = load.split(":")
            scorer = getattr(__import__(f"pycocoevalcap.{module}", fromlist=[cls]), cls)()
            out[name] = np.asarray(scorer.compute_score(gts, res)[1], dtype=np.float64)
    return {n: out[n] for n in names}


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
