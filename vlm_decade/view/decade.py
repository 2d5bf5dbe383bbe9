"""Study A's viewer pages (`view.pages.Pages`) as queries: the gallery (filter, sort, page), one image with everything the run
knows about it, and one model with its statistics, error rates and failed rows.

Each function takes a RunView and returns plain data for a template; SQL does the filtering,
sorting and paging, so a page costs the same at 100 images and at a million score rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from vlm_decade.view.gallery import (
    Query,
    all_images,
    by_group,
    datasets,
    failed_responses,
    metadata,
    page_count,
    page_number,
)
from vlm_decade.view.runs import RunView

FULL = "full"
TOP_HUMANS = "human:top"  # the reference for the model-human gap
ERROR_TYPES = ("detection", "recognition", "scene_understanding", "hallucination", "spatial_dependence")
ERROR_NAMES = {
    "detection": "detection",
    "recognition": "recognition",
    "scene_understanding": "scene understanding",
    "hallucination": "hallucination",
    "spatial_dependence": "SDE",
}
ROLE_ORDER = ("gold", "top", "bottom", "other")
PAGE_SIZE = 48
HEADER = "Study A: descriptions against people"
LINKS: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class GalleryQuery(Query):
    """The gallery's filters and sort, as read from the page's query string.

    `model` narrows the cards to one model and is the model the error and SDE filters ask about (any
    model when empty). `sort` is `image`, `similarity:<model>` (that model's similarity to the gold
    standard on the full image, in `metric`) or `gap:<model>` (top-ranked humans' similarity minus
    the model's, same metric and image: how far the model falls behind people).
    """

    dataset: str = ""
    model: str = ""
    error: str = ""
    sde: str = ""  # "", "yes" or "no"
    metric: str = ""
    sort: str = "image"
    order: str = ""  # "asc" or "desc"; empty: the sort's natural order
    page: int = 1

    @classmethod
    def parse(cls, params, metrics: list[str], models: list[str]) -> GalleryQuery:
        """Read the query string; unknown filter values fall back to the defaults rather than fail, a
        page that is not a whole number from 1 is a BadRequest."""

        def pick(name: str, allowed) -> str:
            value = params.get(name, "")
            return value if value in allowed else ""

        sorts = {"image"} | {f"{kind}:{m}" for kind in ("similarity", "gap") for m in models}
        return cls(
            dataset=params.get("dataset", ""),
            model=pick("model", models),
            error=pick("error", ERROR_TYPES),
            sde=pick("sde", ("yes", "no")),
            metric=pick("metric", metrics) or (metrics[0] if metrics else ""),
            sort=params.get("sort", "image") if params.get("sort", "image") in sorts else "image",
            order=pick("order", ("asc", "desc")),
            page=page_number(params),
        )

    @property
    def direction(self) -> str:
        """Similarity ascending (worst first); gap descending (largest gap first); ids ascending."""
        return self.order or ("desc" if self.sort.startswith("gap:") else "asc")


def metrics(view: RunView) -> list[str]:
    return view.values("SELECT DISTINCT metric FROM scores ORDER BY metric") if view.has("scores") else []


def gallery_page(view: RunView, params) -> dict:
    """The gallery page's data: the query read from `params`, its page of images, and the filters' choices."""
    found = metrics(view)
    q = GalleryQuery.parse(params, found, view.models)
    return {
        "q": q,
        "result": gallery(view, q),
        "models": view.models,
        "metrics": found,
        "datasets": datasets(view),
        "error_types": [(t, ERROR_NAMES[t]) for t in ERROR_TYPES],
    }


def gallery(view: RunView, q: GalleryQuery) -> dict:
    """One page of images with each shown model's similarity and errors, and the total count."""
    where, params = ["(? = '' OR i.dataset = ?)"], [q.dataset, q.dataset]
    if q.error and view.has("errors"):
        where.append(
            "i.image_id IN (SELECT image_id FROM errors WHERE present AND error_type = ? AND (? = '' OR subject = ?))"
        )
        params += [q.error, q.model, q.model]
    if q.sde and view.has("spatial"):
        with_sde = "SELECT image_id FROM spatial WHERE sde AND (? = '' OR subject = ?)"
        if q.sde == "yes":
            where.append(f"i.image_id IN ({with_sde})")
            params += [q.model, q.model]
        else:  # decided, and no SDE for the model (or for any model)
            where.append(
                f"i.image_id IN (SELECT image_id FROM spatial WHERE sde IS NOT NULL AND (? = '' OR subject = ?)) "
                f"AND i.image_id NOT IN ({with_sde})"
            )
            params += [q.model, q.model, q.model, q.model]
    joins, key = "", "i.image_id"
    kind, _, sort_model = q.sort.partition(":")
    if kind in ("similarity", "gap") and view.has("scores"):
        score = "(SELECT image_id, value FROM scores WHERE subject = ? AND metric = ? AND variant = 'full')"
        joins = f" LEFT JOIN {score} AS m ON m.image_id = i.image_id"
        params_join = [sort_model, q.metric]
        key = "m.value"
        if kind == "gap":
            joins += f" LEFT JOIN {score} AS h ON h.image_id = i.image_id"
            params_join += [TOP_HUMANS, q.metric]
            key = "h.value - m.value"
        params = params_join + params
    # A sort the run cannot give (no scores) falls back to image ids, ascending unless asked otherwise.
    direction = "DESC" if (q.direction if joins else q.order) == "desc" else "ASC"
    base = f"FROM images AS i{joins} WHERE {' AND '.join(where)}"
    total = view.values(f"SELECT count(*) {base}", params)[0]
    pages = page_count(total, PAGE_SIZE, q.page)
    rows = view.rows(
        f"SELECT i.image_id, i.dataset, {key} AS sort_value {base} ORDER BY sort_value {direction} NULLS LAST, i.image_id "
        f"LIMIT {PAGE_SIZE} OFFSET {(q.page - 1) * PAGE_SIZE}",
        params,
    )
    shown = [q.model] if q.model else view.models
    ids = [r["image_id"] for r in rows]
    scores = _page_scores(view, ids, q.metric)
    errors = _page_errors(view, ids)
    for r in rows:
        r["models"] = [
            {"name": m, "value": scores.get((r["image_id"], m)), "errors": errors.get((r["image_id"], m), [])}
            for m in shown
        ]
        r["humans"] = scores.get((r["image_id"], TOP_HUMANS))
    return {"rows": rows, "total": total, "pages": pages, "sort_kind": kind}


def _in_list(ids: list[str]) -> str:
    return ", ".join("?" for _ in ids)


def _page_scores(view: RunView, ids: list[str], metric: str) -> dict[tuple[str, str], float]:
    if not ids or not view.has("scores"):
        return {}
    rows = view.rows(
        f"SELECT image_id, subject, value FROM scores WHERE variant = 'full' AND metric = ? AND image_id IN ({_in_list(ids)})",
        [metric, *ids],
    )
    return {(r["image_id"], r["subject"]): r["value"] for r in rows}


def _page_errors(view: RunView, ids: list[str]) -> dict[tuple[str, str], list[str]]:
    if not ids or not view.has("errors"):
        return {}
    out: dict[tuple[str, str], list[str]] = {}
    rows = view.rows(
        f"SELECT image_id, subject, error_type FROM errors WHERE present AND image_id IN ({_in_list(ids)})", ids
    )
    for r in sorted(
        rows, key=lambda r: ERROR_TYPES.index(r["error_type"]) if r["error_type"] in ERROR_TYPES else len(ERROR_TYPES)
    ):
        out.setdefault((r["image_id"], r["subject"]), []).append(r["error_type"])
    return out


def masks(view: RunView) -> list:
    """The study's mask specs: the masked variants the pictures show."""
    from vlm_decade.imaging.masks import mask_specs

    return mask_specs(view.study.masks)


def variants_of(view: RunView) -> list[str]:
    """full and the mask ids of the study, in order."""
    from vlm_decade.imaging.masks import mask_ids

    return [FULL, *mask_ids(view.study.masks)]


def image_page(view: RunView, image_id: str) -> dict | None:
    """Everything the run knows about one image, or None when the run does not list it."""
    image = view.image(image_id)
    if image is None:
        return None
    one = [image_id]
    references = _references(view, one)
    described = _descriptions(view, one)
    errors = _errors(view, one)
    spatial = described["spatial"]
    return {
        "image": image,
        "metadata": metadata(view, image_id),
        **references,
        **described,
        "errors": errors,
        **_detections(view, one, errors),
        "probes": _probes(view, one),
        "has_heatmap": any(r["sde"] is not None for r in spatial),
        "profile_metric": view.study.taxonomy_metric if spatial else None,
    }


def _references(view: RunView, one: list[str]) -> dict:
    """The image's human descriptions: the full image's by role (best-voted first), the masked ones by mask."""
    references = view.rows('SELECT * FROM "references" WHERE image_id = ?', one) if view.has("references") else []
    full_refs = sorted(
        (r for r in references if r["condition"] == FULL),
        key=lambda r: (ROLE_ORDER.index(r["role"]) if r["role"] in ROLE_ORDER else len(ROLE_ORDER), -(r["votes"] or 0)),
    )
    masked_refs: dict[str, list[dict]] = {}
    for r in references:
        if r["condition"] != FULL:
            masked_refs.setdefault(r["condition"], []).append(r)
    return {
        "gold": [r for r in full_refs if r["role"] == "gold"],
        "top": [r for r in full_refs if r["role"] == "top"],
        "bottom": [r for r in full_refs if r["role"] == "bottom"],
        "others": [r for r in full_refs if r["role"] not in ("gold", "top", "bottom")],
        "masked_refs": dict(sorted(masked_refs.items())),
    }


def _descriptions(view: RunView, one: list[str]) -> dict:
    """Each model's descriptions of the image's variants with their similarities, the human groups'
    scores, and the spatial dependence rows (the models' SDE profiles)."""
    responses = (
        view.rows("SELECT subject, variant, prompt_id, text, status, error FROM responses WHERE image_id = ?", one)
        if view.has("responses")
        else []
    )
    scores = (
        view.rows("SELECT subject, variant, metric, value FROM scores WHERE image_id = ?", one)
        if view.has("scores")
        else []
    )
    metric_names = sorted({s["metric"] for s in scores})
    score_of = {(s["subject"], s["variant"], s["metric"]): s["value"] for s in scores}
    said = {(r["subject"], r["variant"]): r for r in responses}
    variant_ids = variants_of(view)
    spatial = (
        view.rows(
            "SELECT subject, mask_ids, model_profile, human_profile, model_r, human_mean_r, human_sd_r, z, sde, reason "
            "FROM spatial WHERE image_id = ? ORDER BY subject",
            one,
        )
        if view.has("spatial")
        else []
    )
    # A masked description's similarity to the model's own full-image one (the SDE profile).
    own = {
        (r["subject"], mask): value
        for r in spatial
        for mask, value in zip(r["mask_ids"] or [], r["model_profile"] or [])
    }
    model_rows = [
        {
            "name": model,
            "variants": [
                {
                    "variant": v,
                    "response": said.get((model, v)),
                    "scores": [(m, score_of.get((model, v, m))) for m in metric_names],
                    "own": own.get((model, v)),
                }
                for v in variant_ids
                if (model, v) in said or any((model, v, m) in score_of for m in metric_names)
            ],
        }
        for model in view.models
    ]
    humans = [
        {"name": s, "scores": [(m, score_of.get((s, FULL, m))) for m in metric_names]}
        for s in sorted({s["subject"] for s in scores if s["subject"].startswith("human:")})
    ]
    return {
        "variants": variant_ids,
        "metrics": metric_names,
        "models": model_rows,
        "humans": humans,
        "spatial": spatial,
    }


def _errors(view: RunView, one: list[str]) -> list[dict]:
    """The image's error labels with their evidence, by subject and error type."""
    if not view.has("errors"):
        return []
    errors = []
    for r in view.rows("SELECT subject, error_type, present, method, evidence FROM errors WHERE image_id = ?", one):
        r["evidence"] = _json(r["evidence"])
        errors.append(r)
    errors.sort(
        key=lambda r: (r["subject"], ERROR_TYPES.index(r["error_type"]) if r["error_type"] in ERROR_TYPES else 99)
    )
    return errors


def _detections(view: RunView, one: list[str], errors: list[dict]) -> dict:
    """The detector's boxes on the image, each with the error labels that cite it, and how the detector fared."""
    detections, detector_status = [], None
    if view.has("detections"):
        found = view.rows("SELECT status, error, detections FROM detections WHERE image_id = ?", one)
        if found:
            detector_status = (
                found[0]["status"] if found[0]["status"] == "ok" else f"{found[0]['status']}: {found[0]['error']}"
            )
            detections = found[0]["detections"] or []
    cited = _cited_boxes(errors)
    for d in detections:
        d["cited"] = cited.get(_box_key(d["label"], (d["x0"], d["y0"], d["x1"], d["y1"])))
    return {"detections": detections, "detector_status": detector_status}


def _probes(view: RunView, one: list[str]) -> dict[str, list[dict]]:
    """The taxonomy's probe questions about the image and their answers, per subject."""
    probes: dict[str, list[dict]] = {}
    if view.has("probes"):
        for r in view.rows(
            "SELECT subject, round, kind, object, question, answer, status, error FROM probes WHERE image_id = ? "
            "ORDER BY subject, round, object",
            one,
        ):
            probes.setdefault(r["subject"], []).append(r)
    return probes


def _json(text: str | None):
    try:
        return json.loads(text) if text else {}
    except ValueError:
        return {"unreadable evidence": text}


def _box_key(label: str, box) -> tuple:
    return (label, *(round(float(v), 3) for v in box))


def _cited_boxes(errors: list[dict]) -> dict[tuple, list[str]]:
    """The detector boxes that error labels cite as evidence, with the labels that cite them."""
    cited: dict[tuple, list[str]] = {}
    for e in errors:
        for finding in e["evidence"].get("findings", []) if isinstance(e["evidence"], dict) else []:
            det = finding.get("detection") if isinstance(finding, dict) else None
            if isinstance(det, dict) and "box" in det:
                cited.setdefault(_box_key(det["label"], det["box"]), []).append(
                    f"{e['subject']}: {ERROR_NAMES.get(e['error_type'], e['error_type'])}"
                )
    return cited


def model_page(view: RunView, model: str, page: int = 1) -> dict | None:
    """One model: its statistics and error rates as the stats tables hold them (those about all
    images, then each group's when the study groups its images), its comparisons and its failed
    responses (paged); None for a name the study does not have."""
    if model not in view.models:
        return None
    stats, grouped = [], []
    if view.has("stats"):
        stats = view.rows(
            f"SELECT * FROM stats WHERE subject = ? AND {all_images(view, 'stats')} ORDER BY metric, variant, dataset",
            [model],
        )
        grouped = by_group(view, "stats", "subject = ?", [model], "metric, variant, dataset")
    error_stats = (
        view.rows("SELECT * FROM error_stats WHERE subject = ? ORDER BY metric, dataset", [model])
        if view.has("error_stats")
        else []
    )
    comparisons = (
        view.rows(
            f"SELECT * FROM comparisons WHERE (a = ? OR b = ?) AND {all_images(view, 'comparisons')} "
            "ORDER BY family, metric, dataset",
            [model, model],
        )
        if view.has("comparisons")
        else []
    )
    failed_total, pages, failed = failed_responses(view, model, "variant, prompt_id", page)
    config = next(m for m in view.study.models if m.name == model)
    return {
        "name": model,
        "config": config,
        "stats": stats,
        "grouped": grouped,
        "error_stats": error_stats,
        "comparisons": comparisons,
        "failed": failed,
        "failed_total": failed_total,
        "page": page,
        "pages": pages,
    }
