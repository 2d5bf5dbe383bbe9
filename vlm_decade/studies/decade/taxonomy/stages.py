"""The error taxonomy's stages (`stages`): detections, probes, errors and error_stats, the glue
between the run's tables and the pure taxonomy functions (objects, rules, probes, spatial,
analysis). Loading spaCy and the object matcher happens here, once per stage."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.fingerprints import table_fingerprint
from vlm_decade.core.reuse import INPUTS, reuse, unit_inputs
from vlm_decade.core.runner import Stage, StudyRun
from vlm_decade.imaging.masks import mask_specs
from vlm_decade.models.backends import backend_class
from vlm_decade.models.encoders import text_key
from vlm_decade.stages.describe.plan import api_budgets
from vlm_decade.stats import METHOD_VERSION, ShardSums, analyse
from vlm_decade.stats.shard_sums import keep_shard_sums, kept_shard_sums
from vlm_decade.studies.decade.config import StudyConfig
from vlm_decade.studies.decade.score import cosine, encoder_vectors
from vlm_decade.studies.decade.taxonomy import analysis, existence, probes
from vlm_decade.studies.decade.taxonomy.detect import detections_of, run_detections
from vlm_decade.studies.decade.taxonomy.locate import locations_of, run_locations
from vlm_decade.studies.decade.taxonomy.objects import ObjectExtractor, ObjectMatcher
from vlm_decade.studies.decade.taxonomy.probing import PROBES_SCHEMA, VERIFIER_PREFIX, run_probes, transcripts
from vlm_decade.studies.decade.taxonomy.spatial import spatial_dependence, spatial_table

# Part of the taxonomy stages' settings: bump it when the labelling rules change, so existing runs label again.
LABELS_FORMAT = 2
# Likewise for the error statistics (what is compared, how pairs are weighted).
STATS_FORMAT = 2


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
    gold = {
        r["image_id"]: r["text"] for r in references.to_pylist() if r["role"] == "gold" and r["condition"] == "full"
    }
    gold_ids = sorted(gold)
    relevant = dict(zip(gold_ids, extractor.objects_many([gold[i] for i in gold_ids])))
    mentioned = dict(zip([(s, i) for s, i, _, _ in pairs], extractor.objects_many([t for *_, t in pairs])))
    return relevant, mentioned


def human_objects(references: pa.Table) -> dict[str, tuple[tuple[str, ...], ...]]:
    """Per image, the objects each of its human descriptions of the full image names (every worker,
    the gold included): what people saw, beside the gold."""
    extractor = ObjectExtractor()
    full = sorted(
        (r for r in references.to_pylist() if r["condition"] == "full"),
        key=lambda r: (r["image_id"], r["description_id"]),
    )
    found: dict[str, list[tuple[str, ...]]] = {}
    for r, objs in zip(full, extractor.objects_many([r["text"] for r in full])):
        found.setdefault(r["image_id"], []).append(tuple(m.name for m in objs))
    return {i: tuple(names) for i, names in found.items()}


def verifier_answers(table: pa.Table | None) -> dict[str, dict[str, tuple[str, str]]]:
    """image_id -> object -> (question, answer) of the verifier model, from the `probes` table."""
    out: dict[str, dict[str, tuple[str, str]]] = {}
    for r in [] if table is None else table.to_pylist():
        if r["subject"].startswith(VERIFIER_PREFIX) and r["status"] == "ok":
            out.setdefault(r["image_id"], {})[r["object"]] = (r["question"], r["answer"])
    return out


def evidence_for(
    study: StudyConfig, humans: dict, located: dict | None, answers: dict | None
) -> dict[str, existence.ImageEvidence]:
    """Per image, what `existence.check` reads: the human objects, and the verifier's finds."""
    verifier = study.taxonomy.verifier
    by_locator = verifier is not None and verifier.kind == "locator"
    by_model = verifier is not None and verifier.kind == "model"
    out = {}
    for image_id, described in humans.items():
        boxes = (located or {}).get(image_id) if by_locator else None
        out[image_id] = existence.ImageEvidence(
            humans=described,
            min_humans=study.taxonomy.min_humans,
            located=None if not by_locator else tuple(boxes or ()),
            locator_failed=by_locator and located is not None and boxes is None,
            min_score=study.taxonomy.locator.min_score if by_locator else 0.0,
            verifier=(answers or {}).get(image_id, {}) if by_model else None,
            verifier_name=verifier.model_id or "locator" if verifier else "",
        )
    return out


def verdicts_for(
    pairs, relevant: dict, mentioned: dict, evidence: dict, matcher
) -> dict[tuple[str, str], dict[str, dict]]:
    """(subject, image_id) -> name -> the existence verdict of each mention outside the gold."""
    return {
        (s, i): {
            name: existence.check(name, evidence.get(i, existence.ImageEvidence()), matcher)
            for name in existence.candidates(relevant.get(i, []), mentioned[(s, i)], matcher)
        }
        for s, i, _, _ in pairs
    }


def unconfirmed_mentions(pairs, relevant: dict, mentioned: dict, evidence: dict, matcher) -> dict[str, list[str]]:
    """Per image, the mentions outside the gold (of every model) that neither the humans nor the
    locator found: what the verifier model is asked about."""
    out: dict[str, list[str]] = {}
    for (_, image_id), verdicts in verdicts_for(pairs, relevant, mentioned, evidence, matcher).items():
        for name, verdict in verdicts.items():
            if not any(c["found"] for c in verdict["checks"]):
                out.setdefault(image_id, []).append(name)
    return {i: list(dict.fromkeys(names)) for i, names in out.items()}


def absent(verdicts: dict[str, dict]) -> list[str]:
    return [name for name, v in verdicts.items() if v["present"] is False]


def probe_transcripts(
    study: StudyConfig, table: pa.Table, pairs, relevant: dict, mentioned: dict, verdicts: dict, matcher
) -> dict:
    """(subject, image_id) -> the answered questions of each probed pair. A pair whose description
    names every relevant object and nothing absent had nothing to ask: its empty transcript decides
    "no error", where a pair whose questions all failed stays undecided."""
    found = transcripts(table)
    templates = study.taxonomy.probes.templates()
    for subject, image_id, _, _ in pairs:
        key = (subject, image_id)
        if key not in found and not probes.first_round(
            relevant.get(image_id, []), mentioned[key], matcher, templates, absent(verdicts[key])
        ):
            found[key] = []
    return found


def existence_inputs(study: StudyConfig, tables, pairs, relevant, mentioned, matcher):
    """The existence verdicts of every pair's mentions outside the gold, and the objects known to be
    in each image (gold and human-named)."""
    humans = human_objects(tables("references"))
    located = locations_of(tables("locations")) if study.taxonomy.locator is not None else None
    has_answers = study.taxonomy.verifier is not None and study.taxonomy.verifier.kind == "model"
    evidence = evidence_for(study, humans, located, verifier_answers(tables("probes")) if has_answers else None)
    verdicts = verdicts_for(pairs, relevant, mentioned, evidence, matcher)
    present = {
        i: list(dict.fromkeys([m.name for m in relevant.get(i, [])] + [n for names in described for n in names]))
        for i, described in humans.items()
    }
    return verdicts, present, located


def compute_errors(study: StudyConfig, tables, hand: pa.Table | None) -> dict[str, pa.Table]:
    """The `errors`, `spatial` and `hand_agreement` tables."""
    images, references, responses = tables("images"), tables("references"), tables("responses")
    pairs = model_texts(study, images, responses)
    relevant, mentioned = objects(references, pairs)
    probed = probed_models(study)
    matcher = matcher_for(study)
    verdicts, present, located = existence_inputs(study, tables, pairs, relevant, mentioned, matcher)
    locator = study.taxonomy.locator
    probed_pairs = [p for p in pairs if p[0] in probed]
    answered = (
        probe_transcripts(study, tables("probes"), probed_pairs, relevant, mentioned, verdicts, matcher)
        if probed
        else {}
    )
    rows = analysis.object_labels(
        pairs,
        relevant,
        mentioned,
        detections_of(tables("detections")),
        answered,
        probed,
        matcher,
        study.taxonomy.confusable_threshold,
        verdicts,
        present,
        located,
        locator.min_score if locator else 0.0,
        locator.iou if locator else 0.5,
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


def probe_inputs(study: StudyConfig, run: StudyRun, settings, pairs) -> pa.Table:
    """Per image: image_id and `inputs_sha256`, the hash of the probe `settings`, the probed models,
    the image's file, its human descriptions, every model's description of it (`pairs`) and its
    locator row: everything its questions and their answers come from."""
    images, references = run.table("images"), run.table("references")
    humans: dict[str, list] = {}
    for r in sorted(references.to_pylist(), key=lambda r: (r["image_id"], r["description_id"])):
        if r["condition"] == "full":
            humans.setdefault(r["image_id"], []).append([r["role"], r["text"]])
    described: dict[str, list] = {}
    for subject, image_id, _, text in sorted(pairs):
        described.setdefault(image_id, []).append([subject, text])
    located = {}
    if study.taxonomy.locator is not None:
        located = {r["image_id"]: [r["status"], r["queries"], r["boxes"]] for r in run.table("locations").to_pylist()}
    ids = images.column("image_id").to_pylist()
    return pa.table(
        {
            "image_id": images.column("image_id"),
            INPUTS: unit_inputs(
                [settings, sorted(probed_models(study))],
                images.column("sha256"),
                [humans.get(i, []) for i in ids],
                [described.get(i, []) for i in ids],
                [located.get(i) for i in ids],
            ),
        }
    )


def compute_probes(study: StudyConfig, run: StudyRun, settings) -> pa.Table:
    """The verifier model's questions (mentions outside the gold that neither the humans nor the
    locator found), then each API model's first-round questions, which need the verdicts; asked
    only about the images whose inputs (`probe_inputs`) changed since the last run, the others' rows
    kept (`core.reuse`). An image with nothing to ask has no rows to keep: it is looked at again."""
    tables = run.table
    all_pairs = model_texts(study, tables("images"), tables("responses"))

    def ask(todo: pa.Table) -> pa.Table:
        wanted = set(todo.column("image_id").to_pylist())
        pairs = [p for p in all_pairs if p[1] in wanted]
        references = tables("references").filter(pc.is_in(tables("references").column("image_id"), todo["image_id"]))
        relevant, mentioned = objects(references, pairs)
        matcher, templates = matcher_for(study), study.taxonomy.probes.templates()
        humans = human_objects(references)
        located = locations_of(tables("locations")) if study.taxonomy.locator is not None else None
        verifier = study.taxonomy.verifier
        asks = {}
        if verifier is not None and verifier.kind == "model":
            before = evidence_for(study, humans, located, None)
            unconfirmed = unconfirmed_mentions(pairs, relevant, mentioned, before, matcher)
            asks = {i: probes.presence_questions(names, templates) for i, names in unconfirmed.items()}
        probed = probed_models(study)
        probed_pairs = [p for p in pairs if p[0] in probed]

        def first_questions(answers: dict) -> dict[tuple[str, str], list[probes.Question]]:
            evidence = evidence_for(study, humans, located, answers)
            verdicts = verdicts_for(probed_pairs, relevant, mentioned, evidence, matcher)
            return {
                (s, i): probes.first_round(
                    relevant.get(i, []), mentioned[(s, i)], matcher, templates, absent(verdicts[(s, i)])
                )
                for s, i, _, _ in probed_pairs
            }

        return run_probes(study, run, asks, first_questions).drop_columns([INPUTS])

    # Sorted stably: each image's rows keep the order they were asked in (the transcripts read them so).
    table, _ = reuse(
        run.folder.previous("probes"),
        probe_inputs(study, run, settings, all_pairs),
        ["image_id"],
        ask,
        PROBES_SCHEMA,
        ["image_id"],
    )
    return table


def locator_queries(study: StudyConfig, tables) -> dict[str, list[str]]:
    """Per image, the names the locator looks for: the objects known to be there (the gold's and
    those any human named, so a local model's boxes can be read at their places), and, when it is the
    verifier, the mentions outside the gold that no human named."""
    humans = human_objects(tables("references"))
    relevant, _ = objects(tables("references"), [])
    queries = {
        i: [m.name for m in relevant.get(i, [])] + [n for names in described for n in names]
        for i, described in humans.items()
    }
    verifier = study.taxonomy.verifier
    if verifier is not None and verifier.kind == "locator":
        pairs = model_texts(study, tables("images"), tables("responses"))
        relevant, mentioned = objects(tables("references"), pairs)
        evidence = evidence_for(study, humans, None, None)
        for image_id, names in unconfirmed_mentions(pairs, relevant, mentioned, evidence, matcher_for(study)).items():
            queries.setdefault(image_id, []).extend(names)
    return {i: list(dict.fromkeys(names)) for i, names in queries.items()}


def compute_error_stats(
    study: StudyConfig, errors: pa.Table, scores: pa.Table, shard_sums: ShardSums | None = None
) -> dict[str, pa.Table]:
    """Error rates (per model and dataset, with the era and dataset comparisons) and error impact;
    `shard_sums`: a huge study's Poisson shards kept (`bootstrap_study`)."""
    settings = {**study.statistics.model_dump(), "min_images": study.taxonomy.min_images, "shard_sums": shard_sums}
    model_eras = {m.name: m.era for m in study.models}
    error_stats, error_comparisons = analyse(analysis.error_scores(errors), model_eras, **settings)
    impact = analysis.impact_scores(errors, scores, study.taxonomy_metric)
    if impact.num_rows:
        impact_stats, impact_comparisons = analyse(impact, {}, **settings, families=[analysis.impact_family(impact)])
        pairs = analysis.impact_pairs(impact)
        impact_stats = impact_stats.append_column(
            "n_pairs", pa.array([pairs[s] for s in impact_stats.column("subject").to_pylist()], pa.int64())
        )
    else:
        impact_stats = error_stats.schema.append(pa.field("n_pairs", pa.int64())).empty_table()
        impact_comparisons = error_comparisons.schema.empty_table()
    return {
        "error_stats": error_stats,
        "error_comparisons": error_comparisons,
        "impact_stats": impact_stats,
        "impact_comparisons": impact_comparisons,
    }


def stages(study: StudyConfig, hand: pa.Table | None) -> list[Stage]:
    """Detections, locations (with a locator), probes (API models, or a verifier model), error labels
    with spatial dependence, and their statistics."""
    cfg = study.taxonomy
    matching = [cfg.matcher.fingerprint(), cfg.match_threshold, cfg.confusable_threshold, LABELS_FORMAT]
    checking = [
        None if cfg.locator is None else cfg.locator.fingerprint(),
        None if cfg.verifier is None else cfg.verifier.fingerprint(),
        cfg.min_humans,
    ]
    out = [
        Stage(
            "detections",
            ("images",),
            cfg.detector.fingerprint(),
            lambda run: {"detections": run_detections(study, run)},
        )
    ]
    error_inputs = ("images", "references", "responses", "embeddings", "detections")
    if cfg.locator is not None:

        def locate(run: StudyRun) -> dict[str, pa.Table]:
            return {"locations": run_locations(study, run, locator_queries(study, run.table))}

        out.append(Stage("locations", ("images", "references", "responses"), [matching, checking], locate))
        error_inputs += ("locations",)
    if probed_models(study) or (cfg.verifier is not None and cfg.verifier.kind == "model"):
        # The effective wordings, defaults included: a new default question asks again.
        wordings = dataclasses.asdict(cfg.probes.templates())
        probe_tables = ("images", "references", "responses") + (("locations",) if cfg.locator is not None else ())
        probe_settings = [matching, checking, wordings, api_budgets(study)]
        out.append(
            Stage(
                "probes",
                probe_tables,
                probe_settings,
                lambda run: {"probes": compute_probes(study, run, probe_settings)},
            )
        )
        error_inputs += ("probes",)

    def error_stats(run: StudyRun) -> dict[str, pa.Table]:
        run.ray()  # bootstrap blocks run as Ray tasks
        kept = kept_shard_sums(run.folder.root, "error_stats")
        tables = compute_error_stats(study, run.table("errors"), run.table("scores"), kept)
        keep_shard_sums(run.folder.root, "error_stats", kept)
        return tables

    hand_fp = None if hand is None else table_fingerprint(hand)
    out.append(
        Stage(
            "errors",
            error_inputs,
            [matching, checking, cfg.sde_n_sd, study.taxonomy_metric, hand_fp],
            lambda run: compute_errors(study, _with_optional(run, error_inputs), hand),
            outputs=("errors", "spatial", "hand_agreement"),
        )
    )
    out.append(
        Stage(
            "error_stats",
            ("errors", "scores"),
            [
                study.statistics.model_dump(),
                study.eras,
                study.taxonomy_metric,
                cfg.min_images,
                STATS_FORMAT,
                METHOD_VERSION,
            ],
            error_stats,
            outputs=("error_stats", "error_comparisons", "impact_stats", "impact_comparisons"),
        )
    )
    return out


def _with_optional(run: StudyRun, inputs: tuple[str, ...]):
    """run.table, giving None for the optional tables this study does not make (probes, locations)."""
    return lambda name: run.table(name) if name in inputs else None
