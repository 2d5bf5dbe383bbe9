"""The error taxonomy's stages (`stages`): detections, probes, errors and error_stats, the glue
between the run's tables and the pure taxonomy functions (objects, rules, probes, spatial,
analysis). Loading spaCy and the object matcher happens here, once per stage."""

from __future__ import annotations

import dataclasses

import pyarrow as pa

from vlm_decade.core.runfolder import table_fingerprint
from vlm_decade.core.runner import Stage, StudyRun
from vlm_decade.imaging.masks import mask_specs
from vlm_decade.models.backends import backend_class
from vlm_decade.models.encoders import text_key
from vlm_decade.stages.describe import api_budgets
from vlm_decade.stats import analyse
from vlm_decade.studies.decade.config import StudyConfig
from vlm_decade.studies.decade.score import cosine, encoder_vectors
from vlm_decade.studies.decade.taxonomy import analysis, probes
from vlm_decade.studies.decade.taxonomy.detect import detections_of, run_detections
from vlm_decade.studies.decade.taxonomy.objects import ObjectExtractor, ObjectMatcher
from vlm_decade.studies.decade.taxonomy.probing import run_probes, transcripts
from vlm_decade.studies.decade.taxonomy.spatial import spatial_dependence, spatial_table


def matcher_for(study: StudyConfig) -> ObjectMatcher:
    from vlm_decade.models.encoders.sbert import SentenceTransformerEncoder  # torch: only when a stage needs it

    return ObjectMatcher(SentenceTransformerEncoder(study.taxonomy.matcher).encode, study.taxonomy.match_threshold)


def probed_models(study: StudyConfig) -> set[str]:
    """API models have no boxes to read: their labels come from probe questions."""
    return {m.name for m in study.models if backend_class(m.backend).remote}


def model_texts(study: StudyConfig, images: pa.Table, responses: pa.Table) -> list[tuple[str, str, str, str]]:
    """(subject, image_id, dataset, text) of every model's successful full-image description."""
    dataset_of = dict(zip(images.column("image_id").to_pylist(), images.column("dataset").to_pylist()))
    models = {m.name for m in study.models}
    return [
        (r["subject"], r["image_id"], dataset_of[r["image_id"]], r["text"])
        for r in responses.to_pylist()
        if r["subject"] in models and r["variant"] == "full" and r["status"] == "ok"
    ]


def objects(references: pa.Table, pairs) -> tuple[dict, dict]:
    """Relevant objects per image (from its gold description) and mentioned objects per pair."""
    extractor = ObjectExtractor()
    gold = {r["image_id"]: r["text"] for r in references.to_pylist() if r["role"] == "gold" and r["condition"] == "full"}
    gold_ids = sorted(gold)
    relevant = dict(zip(gold_ids, extractor.objects_many([gold[i] for i in gold_ids])))
    mentioned = dict(zip([(s, i) for s, i, _, _ in pairs], extractor.objects_many([t for *_, t in pairs])))
    return relevant, mentioned


def first_probe_questions(study: StudyConfig, images, references, responses) -> dict[tuple[str, str], list[probes.Question]]:
    probed = probed_models(study)
    pairs = [p for p in model_texts(study, images, responses) if p[0] in probed]
    if not pairs:
        return {}
    relevant, mentioned = objects(references, pairs)
    matcher, templates = matcher_for(study), study.taxonomy.probes.templates()
    return {
        (s, i): probes.first_round(relevant.get(i, []), mentioned[(s, i)], matcher, templates)
        for s, i, _, _ in pairs
    }


def probe_transcripts(study: StudyConfig, table: pa.Table, pairs, relevant: dict, mentioned: dict, matcher) -> dict:
    """(subject, image_id) -> the answered questions of each probed pair. A pair whose description
    names every relevant object and nothing else had nothing to ask: its empty transcript decides
    "no error", where a pair whose questions all failed stays undecided."""
    found = transcripts(table)
    templates = study.taxonomy.probes.templates()
    for subject, image_id, _, _ in pairs:
        key = (subject, image_id)
        if key not in found and not probes.first_round(relevant.get(image_id, []), mentioned[key], matcher, templates):
            found[key] = []
    return found


def compute_errors(study: StudyConfig, tables, hand: pa.Table | None) -> dict[str, pa.Table]:
    """The `errors`, `spatial` and `hand_agreement` tables."""
    images, references, responses = tables("images"), tables("references"), tables("responses")
    pairs = model_texts(study, images, responses)
    relevant, mentioned = objects(references, pairs)
    probed = probed_models(study)
    matcher = matcher_for(study)
    probed_pairs = [p for p in pairs if p[0] in probed]
    answered = probe_transcripts(study, tables("probes"), probed_pairs, relevant, mentioned, matcher) if probed else {}
    rows = analysis.object_labels(
        pairs,
        relevant,
        mentioned,
        detections_of(tables("detections")),
        answered,
        probed,
        matcher,
        study.taxonomy.confusable_threshold,
    )
    vectors = encoder_vectors(tables("embeddings"), study.taxonomy_metric)
    masked_models = {m.name for m in study.models if m.variants == "all"}
    spatial = spatial_dependence(
        references.to_pylist(),
        [r for r in responses.to_pylist() if r["subject"] in masked_models],
        lambda a, b: cosine(vectors[text_key(a)], vectors[text_key(b)]),
        [s.mask_id for s in mask_specs(study.masks)],
        study.taxonomy.sde_n_sd,
    )
    dataset_of = dict(zip(images.column("image_id").to_pylist(), images.column("dataset").to_pylist()))
    errors, agreement = analysis.errors_table(rows + analysis.spatial_labels(spatial), hand, dataset_of)
    return {"errors": errors, "spatial": spatial_table(spatial), "hand_agreement": agreement}


def compute_error_stats(study: StudyConfig, errors: pa.Table, scores: pa.Table) -> dict[str, pa.Table]:
    """Error rates (per model and dataset, with the era and dataset comparisons) and error impact."""
    settings = study.statistics.model_dump()
    model_eras = {m.name: m.era for m in study.models}
    error_stats, error_comparisons = analyse(analysis.error_scores(errors), model_eras, **settings)
    impact = analysis.impact_scores(errors, scores, study.taxonomy_metric)
    if impact.num_rows:
        impact_stats, impact_comparisons = analyse(impact, {}, **settings, families=[analysis.impact_family(impact)])
    else:
        impact_stats, impact_comparisons = error_stats.schema.empty_table(), error_comparisons.schema.empty_table()
    return {
        "error_stats": error_stats,
        "error_comparisons": error_comparisons,
        "impact_stats": impact_stats,
        "impact_comparisons": impact_comparisons,
    }


def stages(study: StudyConfig, hand: pa.Table | None) -> list[Stage]:
    """Detections, probes (API models), error labels with spatial dependence, and their statistics."""
    cfg = study.taxonomy
    matching = [cfg.matcher.fingerprint(), cfg.match_threshold, cfg.confusable_threshold]
    out = [Stage("detections", ("images",), cfg.detector.fingerprint(), lambda run: {"detections": run_detections(study, run)})]
    error_inputs = ("images", "references", "responses", "embeddings", "detections")
    if probed_models(study):

        def ask(run: StudyRun) -> dict[str, pa.Table]:
            first = first_probe_questions(study, run.table("images"), run.table("references"), run.table("responses"))
            return {"probes": run_probes(study, first, run)}

        # The effective wordings, defaults included: a new default question asks again.
        wordings = dataclasses.asdict(cfg.probes.templates())
        out.append(Stage("probes", ("images", "references", "responses"), [matching, wordings, api_budgets(study)], ask))
        error_inputs += ("probes",)

    def error_stats(run: StudyRun) -> dict[str, pa.Table]:
        run.ray()  # bootstrap blocks run as Ray tasks
        return compute_error_stats(study, run.table("errors"), run.table("scores"))

    hand_fp = None if hand is None else table_fingerprint(hand)
    out.append(Stage("errors", error_inputs, [matching, cfg.sde_n_sd, study.taxonomy_metric, hand_fp],
                     lambda run: compute_errors(study, run.table, hand), outputs=("errors", "spatial", "hand_agreement")))
    out.append(Stage("error_stats", ("errors", "scores"), [study.statistics.model_dump(), study.eras, study.taxonomy_metric], error_stats,
                     outputs=("error_stats", "error_comparisons", "impact_stats", "impact_comparisons")))
    return out
