"""Study B's pages as queries: the gallery of labelled images with each model's prediction, its
TI/LI/SS/CS and outcome (filter by dataset, granularity, model, prompt and outcome; sort by CS),
and one image with every model's prediction under every prompt."""

from __future__ import annotations

from dataclasses import dataclass

from vlm_decade.view.gallery import Query, page_count, page_number
from vlm_decade.view.runs import RunView

OUTCOMES = ("correct", "granularity", "ambiguity", "confusion", "unjudged")
GRANULARITIES = ("prototypical", "fine-grained", "very fine-grained")
METRICS = ("TI", "LI", "SS", "CS")
PAGE_SIZE = 48


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
            sort=pick("sort", ("image", "cs")) or "image",
            order=pick("order", ("asc", "desc")),
            page=page_number(params),
        )

    @property
    def direction(self) -> str:
        return self.order or "asc"


def prompts(view: RunView) -> list[str]:
    return [p.id for p in view.study.prompts]


def _labels(view: RunView) -> str:
    """The images with their label and granularity (empty when the run has no labels table)."""
    if view.has("labels"):
        return (
            "(SELECT i.image_id, i.dataset, l.label, l.granularity FROM images AS i "
            "LEFT JOIN labels AS l ON l.image_id = i.image_id)"
        )
    return "(SELECT image_id, dataset, NULL AS label, NULL AS granularity FROM images)"


def gallery(view: RunView, q: GalleryQuery) -> dict:
    where = ["(? = '' OR i.dataset = ?)", "(? = '' OR i.granularity = ?)"]
    params: list = [q.dataset, q.dataset, q.granularity, q.granularity]
    has_predictions = view.has("predictions")
    if q.outcome and has_predictions:
        where.append(
            "i.image_id IN (SELECT image_id FROM predictions WHERE outcome = ? AND prompt_id = ? AND (? = '' OR subject = ?))"
        )
        params += [q.outcome, q.prompt, q.model, q.model]
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
    return {"image": rows[0], "rows": table, "prompts": {p.id: p.text for p in view.study.prompts}}
