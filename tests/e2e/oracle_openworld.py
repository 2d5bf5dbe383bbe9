"""The page oracle's checks of a Study B run: the gallery, image pages, model pages, the confusions
(every model's and each model's) and the report's tables, each number against the test's own query
of the run's Parquet tables. Where some label has accepted names, each metric's accepted-name form
is checked beside it."""

from __future__ import annotations

from urllib.parse import quote

from .oracle import (
    Element,
    Tables,
    Tally,
    datasets,
    failed,
    headed_tables,
    image_facts,
    match_rows,
    missing,
    model_codes,
    squeeze,
    unread,
)

METRICS = ("TI", "LI", "SS", "CS")
GRANULARITY = ("prototypical", "fine-grained", "very fine-grained", "all")
OUTCOMES = ("correct", "granularity", "ambiguity", "confusion", "unjudged")
MODEL_CONFUSIONS = 20
# The pages' own words that hold digits.
LITERAL: dict[str, tuple[str, ...]] = {
    "gallery": ("TI and LI are 0 or 1",),
    "image": (),
    "model": ("95% bootstrap CI", "(TI 0)"),
    "confusions": ("(TI 0)", "(TI_accepted 1)"),
}


def accepted(t: Tables) -> bool:
    """Whether some label has accepted names (the pages then show the accepted-name forms)."""
    columns = t.values("SELECT column_name FROM (DESCRIBE labels)")
    return "accepted" in columns and t.values("SELECT count(*) FROM labels WHERE len(accepted) > 0")[0] > 0


def estimates(t: Tables) -> list[str]:
    return [name for m in METRICS for name in ((m, f"{m}_accepted") if accepted(t) else (m,))]


def gallery(main: Element, t: Tables, tally: Tally, config: dict) -> None:
    """The first page of the gallery as it opens: every image with its label, each model's prediction
    under the first prompt with TI, LI, SS, CS and the outcome; the outcome filter's counts."""
    prompt = config["prompts"][0]["id"]
    datasets(main, t, tally, "gallery")
    for count in main.iter("span", id="count"):  # the pager above the cards and below them
        tally.numbers("gallery", count, [t.values("SELECT count(*) FROM images")[0]], "images")
    counts = {
        r["outcome"]: r["n"]
        for r in t.rows("SELECT outcome, count(*) AS n FROM predictions WHERE prompt_id = ? GROUP BY outcome", [prompt])
    }
    for option in main.one("select", id="f-outcome").iter("option"):
        if option.attrs["value"]:
            tally.numbers("gallery", option, [counts.get(option.attrs["value"], 0)], option.attrs["value"])
    images = t.rows(
        "SELECT i.image_id, i.dataset, l.label, l.granularity FROM images AS i LEFT JOIN labels AS l USING (image_id) "
        "ORDER BY i.image_id LIMIT 48"
    )
    cards = list(main.iter("a", class_="card"))
    assert [c.attrs["data-image"] for c in cards] == [r["image_id"] for r in images]
    predicted = {
        (r["image_id"], r["subject"]): r for r in t.rows("SELECT * FROM predictions WHERE prompt_id = ?", [prompt])
    }
    for card, r in zip(cards, images):
        caption = f"{r['label'] or '(no label)'} {r['dataset']} {r['granularity'] or ''} {r['image_id']}"
        tally.text("gallery", card.one("div", class_="caption"), caption, r["image_id"])
        lines = list(card.iter("div", class_="line"))
        assert [line.attrs["data-model"] for line in lines] == [m["name"] for m in config["models"]]
        for line in lines:
            p = predicted.get((r["image_id"], line.attrs["data-model"]))
            assert squeeze(line.children[0]) == f"{line.attrs['data-model']}:"
            if p is None:
                tally.text("gallery", line.one("span", class_="note"), "(no prediction)")
            else:
                tally.text("gallery", line.one("i"), p["prediction"])
                tally.text("gallery", line.one("span", class_="badge"), p["outcome"])
                tally.numbers("gallery", line.one("span", class_="metrics"), [p[m] for m in METRICS], r["image_id"])
            line.checked = True


def image(main: Element, t: Tables, tally: Tally, image_id: str, config: dict) -> None:
    """One image page: its label and accepted names, size, path and metadata, and every model's
    prediction under every prompt with its metrics."""
    row = t.rows("SELECT * FROM images AS i LEFT JOIN labels AS l USING (image_id) WHERE image_id = ?", [image_id])[0]
    tally.text("image", main.one("h1", id="image-id"), f"{image_id} {row['dataset']} {row['granularity'] or ''}")
    names = list(row.get("accepted") or [])
    label = f"label: {row['label'] or '(none)'}" + (f" · also accepted: {', '.join(names)}" if names else "")
    tally.text("image", main.one("b", id="label").parent, label)
    image_facts(main, t, tally, row)
    shown = estimates(t)
    table = main.one("table", id="predictions")
    assert table.head()[3 : 3 + len(shown)] == shown
    predicted = {
        (r["subject"], r["prompt_id"]): r for r in t.rows("SELECT * FROM predictions WHERE image_id = ?", [image_id])
    }
    said = {(r["subject"], r["prompt_id"]): r for r in t.rows("SELECT * FROM responses WHERE image_id = ?", [image_id])}
    rows = set()
    for tr in table.body():
        key = (tr.attrs["data-model"], tr.attrs["data-prompt"])
        rows.add(key)
        cells, p, r = tr.cells(), predicted.get(key), said.get(key)
        tally.text("image", cells[0], key[0])
        tally.text("image", cells[1], key[1])
        if p is not None:
            answer = p["prediction"]
        elif r is not None and r["status"] != "ok":
            answer = f"{r['status']}: {r['error']}"
        else:
            answer = r["text"] if r is not None else ""
        tally.text("image", cells[2], answer)
        if p is None:
            tally.text("image", cells[3], "not scored")
        else:
            for cell, metric in zip(cells[3:], shown):
                assert cell.attrs["data-metric"] == metric
                tally.numbers("image", cell, [p[metric]], f"{key} {metric}")
            rest = cells[3 + len(shown) :]
            for cell, value in zip(rest, (p["best_concept"], p["judge_answer"], p["outcome"])):
                tally.text("image", cell, value or "")
        tr.checked = True
    assert rows == set(predicted) | set(said)
    prompts = "; ".join(f"{p['id']}: {p['text']}" for p in config["prompts"])
    tally.text("image", list(main.iter("p", class_="note"))[-1], f"Prompts: {prompts}")


def _stats_rows(t: Tables, where: str, params: list) -> dict[tuple, dict]:
    return {
        (r.get("group"), r["prompt_id"], r["dataset"], r["metric"]): r
        for r in t.rows(f"SELECT * FROM stats WHERE {where}", params)
    }


def _estimate_table(table: Element, rows: dict[tuple, dict], metrics: list[str], tally: Tally, grouped: bool) -> None:
    """A model page's table of estimates: per (group,) prompt and dataset, each metric's estimate [CI]."""
    wanted = {k for k in rows if k[3] in metrics}
    shown = set()
    for tr in table.body():
        group = tr.attrs.get("data-group") if grouped else None
        prompt, dataset = tr.attrs["data-prompt"], tr.attrs["data-dataset"]
        cells = tr.cells()
        for cell, text in zip(cells, ([group] if grouped else []) + [prompt, dataset]):
            tally.text("model", cell, text)
        for cell in cells[2 + grouped :]:
            key = (group, prompt, dataset, cell.attrs["data-metric"])
            r = rows.get(key)
            if r is None:
                tally.text("model", cell, "")
            else:
                shown.add(key)
                tally.numbers("model", cell, [r["estimate"], r["ci_low"], r["ci_high"]], str(key))
        tr.checked = True
    assert shown == wanted


def model(main: Element, t: Tables, tally: Tally, name: str, config: dict) -> None:
    """One model page: its estimates about all images, each group's, its outcome shares, its
    confusions under the first prompt and its failed responses."""
    model_codes(main, tally, name, config)
    shown = estimates(t)
    rows = _stats_rows(t, f"subject = ? AND {t.all_images('stats')}", [name])
    if rows:
        _estimate_table(main.one("table", id="stats"), rows, shown, tally, False)
    outcomes = [f"outcome:{o}" for o in OUTCOMES]
    if any(k[3] in outcomes for k in rows):
        _estimate_table(main.one("table", id="outcome-stats"), rows, outcomes, tally, False)
    grouped = {tb.attrs["data-group-by"]: tb for tb in main.iter("table", class_="grouped")}
    variables = t.values(
        f"SELECT DISTINCT group_by FROM stats WHERE subject = ? AND NOT {t.all_images('stats')}", [name]
    )
    assert set(grouped) == set(variables)
    for variable, table in grouped.items():
        _estimate_table(table, _stats_rows(t, "subject = ? AND group_by = ?", [name, variable]), shown, tally, True)
    found = confusions(t, config["prompts"][0]["id"], name)
    table = main.find("table", id="confusions")
    assert (table is None) == (not found)
    if table is not None:
        _confusion_rows(table, found[:MODEL_CONFUSIONS], t, tally, "model")
    for note in main.iter("p", class_="note"):
        if "labels with the most of" in note.text():
            tally.numbers("model", note, [MODEL_CONFUSIONS, len(found)], "confused labels", LITERAL["model"])
    failed(main, t, tally, name, "prompt_id", ["image_id", "prompt_id", "status", "error"])


def confusions(t: Tables, prompt: str, model: str = "") -> list[dict]:
    """Per label, the names predicted for it that miss it (TI 0) with their counts and how many
    of those name an accepted name; labels with the most such predictions first."""
    rows = t.rows(
        "SELECT label, prediction, count(*) AS n, count_if(TI_accepted = 1) AS accepted FROM predictions "
        "WHERE prompt_id = ? AND (? = '' OR subject = ?) AND TI = 0 AND label IS NOT NULL AND prediction IS NOT NULL "
        "GROUP BY label, prediction",
        [prompt, model, model],
    )
    names: dict[str, set] = {}
    if accepted(t):
        for r in t.rows("SELECT label, accepted FROM labels"):
            names.setdefault(r["label"], set()).update(r["accepted"] or [])
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["label"], []).append(r)
    out = [
        {
            "label": label,
            "names": sorted(names.get(label, ())),
            "total": sum(r["n"] for r in found),
            "accepted": sum(r["accepted"] for r in found),
            "predictions": sorted(found, key=lambda r: (-r["n"], r["prediction"])),
        }
        for label, found in by.items()
    ]
    return sorted(out, key=lambda r: (-r["total"], r["label"]))


def _confusion_rows(table: Element, expected: list[dict], t: Tables, tally: Tally, kind: str) -> None:
    with_names = accepted(t)
    rows = table.body()
    assert [r.attrs["data-label"] for r in rows] == [e["label"] for e in expected]
    for tr, e in zip(rows, expected):
        cells = tr.cells()
        label = e["label"] + (f" also accepted: {', '.join(e['names'])}" if e["names"] else "")
        tally.text(kind, cells[0], label)
        tally.numbers(kind, cells[1], [e["total"]], f"{e['label']} total")
        if with_names:
            tally.numbers(kind, cells[2], [e["accepted"]], f"{e['label']} accepted")
        links = list(cells[-1].iter("a", class_="predicted"))
        assert [a.attrs["data-prediction"] for a in links] == [p["prediction"] for p in e["predictions"]]
        for a, p in zip(links, e["predictions"]):
            text = f"{p['prediction']} {p['n']}" + (
                f" {p['accepted']} accepted" if with_names and p["accepted"] else ""
            )
            tally.text(kind, a, text)
        tr.checked = True


def more_pages(t: Tables, tally: Tally, config: dict) -> list:
    """The confusion view of every model, then of each."""
    prompt = config["prompts"][0]["id"]
    pages = [("confusions", "/confusions", lambda main: confusion_page(main, t, tally, prompt, ""))]
    for m in config["models"]:
        url = f"/confusions?model={quote(m['name'], safe='')}"
        pages.append(("confusions", url, lambda main, name=m["name"]: confusion_page(main, t, tally, prompt, name)))
    return pages


def confusion_page(main: Element, t: Tables, tally: Tally, prompt: str, model: str) -> None:
    datasets(main, t, tally, "confusions")
    found = confusions(t, prompt, model)
    tally.numbers("confusions", main.one("span", id="count"), [len(found)], "labels")
    total = sum(e["total"] for e in found)
    tally.numbers("confusions", main.one("p", id="confusion-total"), [total], "predictions")
    if found:
        _confusion_rows(main.one("table", id="confusions"), found[:50], t, tally, "confusions")


def _percent(r: dict | None) -> str:
    if r is None:
        return ""
    cells = [r["estimate"], r["ci_low"], r["ci_high"]]
    text = ["n/a" if missing(v) else f"{100 * v:.1f}" for v in cells]
    return f"{text[0]} [{text[1]}, {text[2]}]"


def _matrix(table: Element, t: Tables, tally: Tally, prompt: str, where: str, params: list) -> None:
    """A table of percent estimates: a row per model, a column per (group or dataset, metric)."""
    rows = {
        (r["subject"], r["dataset"], r["metric"]): r
        for r in t.rows(f"SELECT * FROM stats WHERE prompt_id = ? AND {where}", [prompt, *params])
    }
    head = table.head()[1:]
    columns = []
    for h in head:
        place, label = h.rsplit(" ", 1)
        metric = label if label in {k[2] for k in rows} else f"outcome:{label}"  # an outcome's name alone
        columns.append((place, metric))
    for tr in table.body():
        cells = tr.cells()
        subject = squeeze(cells[0].text())
        cells[0].checked = True
        for cell, (place, metric) in zip(cells[1:], columns):
            r = rows.get((subject, place, metric))
            tally.text("report", cell, _percent(r), f"{subject} {place} {metric}")
        tr.checked = True


def _shares(table: Element, t: Tables, tally: Tally, prompt: str) -> None:
    rows = {
        (r["subject"], r["dataset"], r["metric"]): r
        for r in t.rows(f"SELECT * FROM stats WHERE prompt_id = ? AND {t.all_images('stats')}", [prompt])
    }
    metrics = table.head()[2:]
    assert set(metrics) <= {k[2] for k in rows}  # metric names, ss@0.5 ... ss@avg, as the stats table has them
    table.one("thead").checked = True
    for tr in table.body():
        cells = tr.cells()
        subject, group = squeeze(cells[0].text()), squeeze(cells[1].text())
        assert any((subject, group, m) in rows for m in metrics)
        for cell, metric in zip(cells[2:], metrics):
            tally.text("report", cell, _percent(rows.get((subject, group, metric))), f"{subject} {group} {metric}")
        tr.checked = True


COMPARISONS = ["a", "b", "dataset", "metric", "prompt_id", "difference", "ci_low", "ci_high", "p", "q", "significant"]
FAMILIES = {
    "Model against model": "model-vs-model",
    "Prompt ablation: differences from the main prompt": "prompt-ablation",
}


def report(body: Element, t: Tables, tally: Tally, config: dict) -> None:
    """Every table of report.html: each number a value of the run's tables (percent where the page says so)."""
    main = config["prompts"][0]["id"]
    everything = t.all_images("stats")
    for headings, table in headed_tables(body):
        head = table.head()
        h2, h3, h4 = headings.get("h2", ""), headings.get("h3", ""), headings.get("h4", "")
        if head[0] == "model" and table.attrs.get("id") == "ss-thresholds":
            _shares(table, t, tally, main)
        elif head[0] == "model" and " = " in h4:
            variable, group = h4.split(" = ", 1)
            _matrix(table, t, tally, main, 'group_by = ? AND "group" = ?', [variable, group])
        elif head[0] == "model":
            prompt = h3 if h2 == "Prompt ablation" else main
            _matrix(table, t, tally, prompt, everything, [])
        elif head == COMPARISONS:
            rows = t.rows(f"SELECT * FROM comparisons WHERE family = ? AND {everything}", [FAMILIES[h2]])
            match_rows(tally, "report", table, rows, head)
        elif head == ["a", "b", "dataset", "metric", "difference", "ci_low", "ci_high", "p", "q"]:
            rows = t.rows(
                f"SELECT * FROM comparisons WHERE family = 'open-vs-closed' AND prompt_id = ? AND {everything}", [main]
            )
            match_rows(tally, "report", table, rows, head)
        elif head == ["a", "b", "dataset", "metric", "n_pairs", "a_only", "b_only", "p", "q", "significant"]:
            rows = t.rows(f"SELECT * FROM paired_tests WHERE {t.all_images('paired_tests')}")
            match_rows(tally, "report", table, rows, head)
        elif head[:2] == ["subject", "image_id"]:
            outcome = {"granularity error": "granularity", "label ambiguity": "ambiguity"}.get(
                h3.split(" (")[0], "confusion"
            )
            rows = t.rows("SELECT * FROM predictions WHERE outcome = ?", [outcome])
            match_rows(tally, "report", table, rows, head, every=False)
        elif "sample" in (table.attrs.get("class") or ""):
            _sample(table, t, tally, main)
        else:
            raise AssertionError(f"a table of the report the oracle does not know: {head}")
        assert not unread(table), f"{head}: numbers no check read: {unread(table)}"


def _sample(table: Element, t: Tables, tally: Tally, prompt: str) -> None:
    """A model's lowest or highest CS: the image, label, prediction, its metrics and outcome."""
    subject = table.attrs["data-model"]
    rows = {
        r["image_id"]: r
        for r in t.rows("SELECT * FROM predictions WHERE subject = ? AND prompt_id = ?", [subject, prompt])
    }
    for tr in table.body():
        cells = tr.cells()
        r = rows[squeeze(cells[1].children[0])]
        tally.text("report", cells[1], f"{r['image_id']} {r['dataset']}, {r['granularity'] or ''}")
        tally.text("report", cells[2], r["label"] or "")
        tally.text("report", cells[3], r["prediction"] or "")
        for cell, metric in zip(cells[4:8], METRICS):
            tally.numbers("report", cell, [r[metric]], f"{subject} {r['image_id']} {metric}")
        tally.text("report", cells[8], r["outcome"] or "")
