"""Study B's viewer pages (`view.pages.Pages`) as queries: the gallery of labelled images with
each model's prediction, its TI/LI/SS/CS and outcome (filter by dataset, granularity, model, prompt,
outcome, label and predicted name; sort by CS), one image with its label's accepted names, its
metadata and every model's prediction under every prompt, one model with its estimates (about all
images, then each group's when the study groups its images), confusions and failed responses, and the
confusions (label -> the names predicted for it).

Where some label has accepted names, each metric's accepted-name form (`TI_accepted`, ...) is shown
beside it, and a confusion counts the predictions that name one of them. The statistics table's
prompt column is named once, `statistics.PROMPT`."""

from __future__ import annotations

from dataclasses import dataclass

from vlm_decade.studies.openworld.statistics import ALL, PROMPT
from vlm_decade.studies.openworld.statistics import GROUPS as GROUP_NAMES
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

OUTCOMES = ("correct", "granularity", "ambiguity", "confusion", "unjudged")
GRANULARITIES = ("prototypical", "fine-grained", "very fine-grained")
METRICS = ("TI", "LI", "SS", "CS")
ESTIMATES = tuple(name for m in METRICS for name in (m, f"{m}_accepted"))  # each beside its accepted-name form
STAT_GROUPS = (*GROUP_NAMES, ALL)  # the stats table's rows per granularity group, before its datasets'
PAGE_SIZE = 48
CONFUSION_PAGE_SIZE = 50  # labels per page of the confusion view
MODEL_CONFUSIONS = 20  # labels on a model page; the confusion view has them all
HEADER = "Study B: open-world classification"
LINKS = (("/confusions", "Confusions"),)


@dataclass(frozen=True)
class GalleryQuery(Query):
    """`model` narrows the cards to one model and is the model the outcome filter and the CS sort ask
    about; with none, the outcome filter keeps images where any model has it and the CS sort uses
    each image's lowest CS. `prompt` is the prompt whose predictions are shown (the study's first)."""

    dataset: str = ""
    granularity: str = ""
    model: str = ""
    prompt: str = ""
    outcome: str = ""
    label: str = ""  # the images with this label
    prediction: str = ""  # ... that the model (any model) named so under the prompt
    sort: str = "image"  # image or cs
    order: str = ""
    page: int = 1

    @classmethod
    def parse(cls, params, models: list[str], prompts: list[str]) -> GalleryQuery:
        def pick(name: str, allowed) -> str:
            value = params.get(name, "")
            return value if value in allowed else ""

        return cls(
            dataset=params.get("dataset", ""),
            granularity=pick("granularity", GRANULARITIES),
            model=pick("model", models),
            prompt=pick("prompt", prompts) or (prompts[0] if prompts else ""),
            outcome=pick("outcome", OUTCOMES),
            label=params.get("label", ""),
            prediction=params.get("prediction", ""),
            sort=pick("sort", ("image", "cs")) or "image",
            order=pick("order", ("asc", "desc")),
            page=page_number(params),
        )

    @property
    def direction(self) -> str:
        return self.order or "asc"


def prompts(view: RunView) -> list[str]:
    return [p.id for p in view.study.prompts]


def with_alternatives(view: RunView) -> bool:
    """Whether some label of the run has accepted names (then the accepted-name forms are shown)."""
    if "accepted" not in view.columns("labels"):
        return False
    return view.values("SELECT count(*) FROM labels WHERE len(accepted) > 0")[0] > 0


def accepted_names(view: RunView, labels: list[str]) -> dict[str, list[str]]:
    """Each of `labels` with the names accepted for it on any of its images, by name."""
    if not labels or "accepted" not in view.columns("labels"):
        return {}
    marks = ", ".join("?" for _ in labels)
    names: dict[str, set[str]] = {}
    for r in view.rows(f"SELECT label, accepted FROM labels WHERE label IN ({marks})", labels):
        names.setdefault(r["label"], set()).update(r["accepted"] or [])
    return {label: sorted(found) for label, found in names.items() if found}


def _labels(view: RunView) -> str:
    """The images with their label and granularity (empty when the run has no labels table)."""
    if view.has("labels"):
        return (
            "(SELECT i.image_id, i.dataset, l.label, l.granularity FROM images AS i "
            "LEFT JOIN labels AS l ON l.image_id = i.image_id)"
        )
    return "(SELECT image_id, dataset, NULL AS label, NULL AS granularity FROM images)"


def gallery_page(view: RunView, params) -> dict:
    """The gallery page's data: the query read from `params`, its page of images, and the filters' choices."""
    q = GalleryQuery.parse(params, view.models, prompts(view))
    return {
        "q": q,
        "result": gallery(view, q),
        "models": view.models,
        "prompts": prompts(view),
        "datasets": datasets(view),
        "granularities": GRANULARITIES,
        "outcomes": OUTCOMES,
        "outcome_counts": outcome_counts(view, q.prompt),
    }


def masks(view: RunView) -> list:
    """None: Study B shows its images unmasked."""
    return []


def gallery(view: RunView, q: GalleryQuery) -> dict:
    where = ["(? = '' OR i.dataset = ?)", "(? = '' OR i.granularity = ?)"]
    params: list = [q.dataset, q.dataset, q.granularity, q.granularity]
    has_predictions = view.has("predictions")
    if q.outcome and has_predictions:
        where.append(
            "i.image_id IN (SELECT image_id FROM predictions WHERE outcome = ? AND prompt_id = ? AND (? = '' OR subject = ?))"
        )
        params += [q.outcome, q.prompt, q.model, q.model]
    if q.label:
        where.append("i.label = ?")
        params.append(q.label)
    if q.prediction and has_predictions:
        where.append(
            "i.image_id IN (SELECT image_id FROM predictions "
            "WHERE prediction = ? AND prompt_id = ? AND (? = '' OR subject = ?))"
        )
        params += [q.prediction, q.prompt, q.model, q.model]
    joins, key = "", "i.image_id"
    join_params: list = []
    if q.sort == "cs" and has_predictions:
        joins = (
            " LEFT JOIN (SELECT image_id, min(CS) AS cs FROM predictions WHERE prompt_id = ? AND (? = '' OR subject = ?) "
            "GROUP BY image_id) AS p ON p.image_id = i.image_id"
        )
        join_params = [q.prompt, q.model, q.model]
        key = "p.cs"
    params = join_params + params
    base = f"FROM {_labels(view)} AS i{joins} WHERE {' AND '.join(where)}"
    total = view.values(f"SELECT count(*) {base}", params)[0]
    pages = page_count(total, PAGE_SIZE, q.page)
    direction = "DESC" if q.direction == "desc" else "ASC"
    rows = view.rows(
        f"SELECT i.image_id, i.dataset, i.label, i.granularity, {key} AS sort_value {base} "
        f"ORDER BY sort_value {direction} NULLS LAST, i.image_id LIMIT {PAGE_SIZE} OFFSET {(q.page - 1) * PAGE_SIZE}",
        params,
    )
    ids = [r["image_id"] for r in rows]
    predicted: dict[tuple[str, str], dict] = {}
    if ids and has_predictions:
        marks = ", ".join("?" for _ in ids)
        for p in view.rows(
            f"SELECT * FROM predictions WHERE prompt_id = ? AND image_id IN ({marks})", [q.prompt, *ids]
        ):
            predicted[(p["image_id"], p["subject"])] = p
    shown = [q.model] if q.model else view.models
    for r in rows:
        r["models"] = [{"name": m, "prediction": predicted.get((r["image_id"], m))} for m in shown]
    return {"rows": rows, "total": total, "pages": pages}


def outcome_counts(view: RunView, prompt: str) -> dict[str, int]:
    """Predictions per outcome under `prompt` (for the filter's labels)."""
    if not view.has("predictions"):
        return {}
    return {
        r["outcome"]: r["n"]
        for r in view.rows(
            "SELECT outcome, count(*) AS n FROM predictions WHERE prompt_id = ? GROUP BY outcome", [prompt]
        )
    }


def image_page(view: RunView, image_id: str) -> dict | None:
    rows = view.rows(
        f"SELECT i.*, l.label, l.granularity FROM images AS i JOIN {_labels(view)} AS l ON l.image_id = i.image_id "
        "WHERE i.image_id = ?",
        [image_id],
    )
    if not rows:
        return None
    predictions = (
        view.rows("SELECT * FROM predictions WHERE image_id = ?", [image_id]) if view.has("predictions") else []
    )
    responses = (
        view.rows("SELECT subject, prompt_id, text, status, error FROM responses WHERE image_id = ?", [image_id])
        if view.has("responses")
        else []
    )
    by = {(p["subject"], p["prompt_id"]): p for p in predictions}
    said = {(r["subject"], r["prompt_id"]): r for r in responses}
    table = [
        {"model": m, "prompt": p, "prediction": by.get((m, p)), "response": said.get((m, p))}
        for m in view.models
        for p in prompts(view)
        if (m, p) in by or (m, p) in said
    ]
    accepted = []
    if "accepted" in view.columns("labels"):
        accepted = view.values("SELECT accepted FROM labels WHERE image_id = ?", [image_id])
    return {
        "image": rows[0],
        "accepted": (accepted[0] or []) if accepted else [],
        "metadata": metadata(view, image_id),
        "with_alternatives": with_alternatives(view),
        "rows": table,
        "prompts": {p.id: p.text for p in view.study.prompts},
    }


@dataclass(frozen=True)
class ConfusionQuery(Query):
    """Which predictions the confusion view counts: one model's (every model's when empty) under one
    prompt, in one dataset or granularity group; `show` is `wrong` (the label not in the answer, TI 0)
    or `all`."""

    model: str = ""
    prompt: str = ""
    dataset: str = ""
    granularity: str = ""
    show: str = "wrong"
    page: int = 1

    @classmethod
    def parse(cls, params, models: list[str], prompts: list[str]) -> ConfusionQuery:
        model, prompt = params.get("model", ""), params.get("prompt", "")
        return cls(
            model=model if model in models else "",
            prompt=prompt if prompt in prompts else (prompts[0] if prompts else ""),
            dataset=params.get("dataset", ""),
            granularity=params.get("granularity", "") if params.get("granularity", "") in GRANULARITIES else "",
            show="all" if params.get("show") == "all" else "wrong",
            page=page_number(params),
        )

    def gallery(self, label: str, prediction: str) -> dict:
        """The gallery's query string for the images behind one count."""
        asked = {"label": label, "prediction": prediction, "model": self.model, "prompt": self.prompt}
        asked |= {"dataset": self.dataset, "granularity": self.granularity}
        return {k: v for k, v in asked.items() if v}


def confusions(view: RunView, q: ConfusionQuery) -> list[dict]:
    """Per label, the names predicted for it with how many predictions (model x image) gave each,
    most first, and of those how many name the label or an accepted name (TI_accepted 1; None
    where no label has accepted names); labels with the most such predictions first."""
    if not view.has("predictions"):
        return []
    counted = with_alternatives(view) and "TI_accepted" in view.columns("predictions")
    accepted = "count(*) FILTER (WHERE TI_accepted = 1)" if counted else "NULL"
    rows = view.rows(
        f"SELECT label, prediction, count(*) AS n, {accepted} AS accepted FROM predictions "
        "WHERE prompt_id = ? AND (? = '' OR subject = ?) "
        "AND (? = '' OR dataset = ?) AND (? = '' OR granularity = ?) AND label IS NOT NULL AND prediction IS NOT NULL "
        "AND (? OR TI = 0) GROUP BY label, prediction ORDER BY label, n DESC, prediction",
        [q.prompt, q.model, q.model, q.dataset, q.dataset, q.granularity, q.granularity, q.show == "all"],
    )
    by_label: dict[str, list[tuple[str, int, int | None]]] = {}
    for r in rows:
        by_label.setdefault(r["label"], []).append((r["prediction"], r["n"], r["accepted"]))
    out = [
        {
            "label": k,
            "total": sum(n for _, n, _ in v),
            "accepted": sum(a for _, _, a in v) if counted else None,
            "predictions": v,
        }
        for k, v in by_label.items()
    ]
    return sorted(out, key=lambda r: (-r["total"], r["label"]))


def _named(view: RunView, rows: list[dict]) -> list[dict]:
    """`rows` (confusions) with each label's accepted names."""
    names = accepted_names(view, [r["label"] for r in rows])
    return [{**r, "names": names.get(r["label"], [])} for r in rows]


def confusion_page(view: RunView, params) -> dict:
    """The confusion view's data: the query read from `params`, its page of labels, and the filters' choices."""
    q = ConfusionQuery.parse(params, view.models, prompts(view))
    found = confusions(view, q)
    pages = page_count(len(found), CONFUSION_PAGE_SIZE, q.page)
    start = (q.page - 1) * CONFUSION_PAGE_SIZE
    result = {
        "rows": _named(view, found[start : start + CONFUSION_PAGE_SIZE]),
        "labels": len(found),
        "total": sum(r["total"] for r in found),
        "pages": pages,
    }
    return {
        "q": q,
        "result": result,
        "with_alternatives": with_alternatives(view),
        "models": view.models,
        "prompts": prompts(view),
        "datasets": datasets(view),
        "granularities": GRANULARITIES,
    }


def _estimates(stats: list[dict], metrics: tuple[str, ...] | list[str], prompt_order: list[str]) -> dict:
    """`metrics` per (metadata group, prompt, dataset or granularity group) row: by metadata group
    (a grouped study's per-group rows; none for the rows about all images), then prompt, then the
    granularity groups first and the datasets by name."""
    cells: dict[tuple[str, str, str], dict[str, dict]] = {}
    for r in stats:
        if r["metric"] in metrics:
            cells.setdefault((r.get("group") or "", r[PROMPT], r["dataset"]), {})[r["metric"]] = r

    def order(key: tuple[str, str, str]):
        group, prompt, dataset = key
        at = prompt_order.index(prompt) if prompt in prompt_order else len(prompt_order)
        return (group, at, prompt, STAT_GROUPS.index(dataset) if dataset in STAT_GROUPS else len(STAT_GROUPS), dataset)

    shown = [m for m in metrics if any(m in row for row in cells.values())]
    rows = [
        {
            "of": g,
            "prompt": p,
            "dataset": d,
            "group": d in STAT_GROUPS,
            "cells": [(m, cells[(g, p, d)].get(m)) for m in shown],
        }
        for g, p, d in sorted(cells, key=order)
    ]
    return {"metrics": shown, "rows": rows}


def model_page(view: RunView, model: str, page: int = 1) -> dict | None:
    """One model: its estimates with CIs per prompt, granularity group and dataset (the stats
    table's rows about all images, then each group's when the study groups its images), the names
    it gave instead of the labels, and its failed responses (paged); None for a name the study does
    not have."""
    if model not in view.models:
        return None
    stats, grouped = [], []
    if view.has("stats"):
        stats = view.rows(f"SELECT * FROM stats WHERE subject = ? AND {all_images(view, 'stats')}", [model])
        grouped = by_group(view, "stats", "subject = ?", [model], "metric")
    order = prompts(view)
    outcome_metrics = [f"outcome:{o}" for o in OUTCOMES]
    failed_total, pages, failed = failed_responses(view, model, "prompt_id", page)
    confused = ConfusionQuery(model=model, prompt=order[0] if order else "")
    found = confusions(view, confused)
    return {
        "name": model,
        "config": next(m for m in view.study.models if m.name == model),
        "metrics": _estimates(stats, ESTIMATES, order),
        "outcomes": _estimates(stats, outcome_metrics, order),
        "grouped": [(variable, _estimates(rows, ESTIMATES, order)) for variable, rows in grouped],
        "confused": confused,
        "with_alternatives": with_alternatives(view),
        "confusions": _named(view, found[:MODEL_CONFUSIONS]),
        "confusion_labels": len(found),
        "failed": failed,
        "failed_total": failed_total,
        "page": page,
        "pages": pages,
    }
