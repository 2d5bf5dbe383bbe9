"""The page oracle's checks of a Study A run: the gallery, image pages, model pages and the
report's tables, each number against the test's own query of the run's Parquet tables."""

from __future__ import annotations

import json

from .oracle import (
    NUMBERS,
    Element,
    Tables,
    Tally,
    datasets,
    failed,
    headed_tables,
    image_facts,
    match_rows,
    model_codes,
    printed,
    squeeze,
    unread,
)

TOP = "human:top"
ERROR_NAMES = {"scene_understanding": "scene understanding", "spatial_dependence": "SDE"}
ERROR_ORDER = ("detection", "recognition", "scene_understanding", "hallucination", "spatial_dependence")
# The pages' own words that hold digits.
LITERAL: dict[str, tuple[str, ...]] = {"model": ("95% bootstrap CI", "95% CI"), "image": (), "gallery": ()}


def gallery(main: Element, t: Tables, tally: Tally, config: dict) -> None:
    """The first page of the gallery as it opens: every image by id, the top humans' and each
    model's similarity on the full image in the first metric, each model's errors."""
    datasets(main, t, tally, "gallery")
    for count in main.iter("span", id="count"):  # the pager above the cards and below them
        tally.numbers("gallery", count, [t.values("SELECT count(*) FROM images")[0]], "images")
    ids = t.values("SELECT image_id FROM images ORDER BY image_id LIMIT 48")
    cards = list(main.iter("a", class_="card"))
    assert [c.attrs["data-image"] for c in cards] == ids
    metric = (t.values("SELECT min(metric) FROM scores") if t.has("scores") else [None])[0]
    scores = {
        (r["subject"], r["image_id"]): r["value"]
        for r in t.rows("SELECT subject, image_id, value FROM scores WHERE variant = 'full' AND metric = ?", [metric])
    }
    errors: dict[tuple[str, str], list[str]] = {}
    if t.has("errors"):
        for r in t.rows("SELECT subject, image_id, error_type FROM errors WHERE present"):
            errors.setdefault((r["subject"], r["image_id"]), []).append(r["error_type"])
    dataset = {r["image_id"]: r["dataset"] for r in t.rows("SELECT image_id, dataset FROM images")}
    for card in cards:
        image_id = card.attrs["data-image"]
        tally.text("gallery", card.one("div", class_="caption"), f"{image_id} {dataset[image_id]}", image_id)
        humans = card.find("div", class_="humans")
        assert (humans is None) == (scores.get((TOP, image_id)) is None)
        if humans is not None:
            tally.numbers("gallery", humans, [scores[(TOP, image_id)]], f"{image_id}: top humans")
        for line in card.iter("div", class_="line"):
            if "data-model" not in line.attrs:
                continue
            model = line.attrs["data-model"]
            tally.numbers("gallery", line.one("span", class_="value"), [scores.get((model, image_id))], model)
            shown = [b.attrs["class"].split()[1] for b in line.iter("span", class_="badge")]
            assert sorted(shown) == sorted(errors.get((model, image_id), []))
            assert squeeze(line.children[0]) == model
            line.checked = True


def image(main: Element, t: Tables, tally: Tally, image_id: str, config: dict) -> None:
    """One image page: its size and path, metadata, detector boxes, the human descriptions with
    their votes, every description and similarity, the error labels with their evidence, and the
    spatial dependence."""
    row = t.rows("SELECT * FROM images WHERE image_id = ?", [image_id])[0]
    tally.text("image", main.one("h1", id="image-id"), f"{image_id} {row['dataset']}")
    image_facts(main, t, tally, row)
    _detections(main, t, tally, image_id)
    _humans(main.one("section", id="humans"), t, tally, image_id)
    _descriptions(main.one("section", id="models"), t, tally, image_id)
    _errors(main.one("section", id="errors"), t, tally, image_id)
    _spatial(main.one("section", id="sde"), t, tally, image_id)


def _detections(main: Element, t: Tables, tally: Tally, image_id: str) -> None:
    found = t.rows("SELECT detections FROM detections WHERE image_id = ?", [image_id]) if t.has("detections") else []
    boxes = (found[0]["detections"] or []) if found else []
    shown = list(main.iter("div", class_="box"))
    assert len(shown) == len(boxes)
    for box, d in zip(shown, boxes):
        assert [float(v) for v in box.attrs["data-box"].split()] == [d["x0"], d["y0"], d["x1"], d["y1"]]
        tally.text("image", box.one("span"), f"{d['label']} {d['score']:.2f}")
    caption = main.find("section", class_="picture-row")
    for figcaption in caption.iter("figcaption") if caption else []:
        if boxes and "detector box" in figcaption.text():
            tally.numbers("image", figcaption, [len(boxes)], "boxes")


def _humans(section: Element, t: Tables, tally: Tally, image_id: str) -> None:
    refs = t.rows('SELECT * FROM "references" WHERE image_id = ?', [image_id]) if t.has("references") else []
    pool = [r for r in refs if r["condition"] == "full"]
    for row in section.iter("tr"):
        role = row.attrs.get("data-role")
        if role is None:
            continue
        cells = row.cells()
        found = next(r for r in pool if r["role"] == role and r["text"] == squeeze(cells[2].text()))
        pool.remove(found)
        # the gold standard's votes out of the times it was shown; the others', their votes
        expected = [found["votes"], found["shown"]] if role == "gold" and found["shown"] else [found["votes"]]
        tally.numbers("image", cells[1], expected, f"{role} votes")
        tally.text("image", cells[2], found["text"])
        row.checked = True
    others = [r for r in pool if r["role"] not in ("gold", "top", "bottom")]
    assert not [r for r in pool if r["role"] in ("gold", "top", "bottom")]
    masked: dict[str, list[str]] = {}
    for r in refs:
        if r["condition"] != "full":
            masked.setdefault(r["condition"], []).append(r["text"])
    for details in section.iter("details"):
        summary = details.one("summary")
        items = list(details.iter("li"))
        if "other description" in summary.text():
            tally.numbers("image", summary, [len(others)], "others")
            for li in items:
                found = next(r for r in others if li.text().startswith(r["text"]))
                others.remove(found)
                tally.text("image", li, f"{found['text']} ({found['votes']} votes)")
        else:
            condition = squeeze(summary.text()).rsplit(" ", 1)[1]
            tally.numbers("image", summary, [len(masked[condition])], condition)
            assert sorted(squeeze(li.text()) for li in items) == sorted(squeeze(x) for x in masked.pop(condition))
            for li in items:
                tally.text("image", li, li.text())
        details.checked = True
    assert not others and not masked


def _descriptions(section: Element, t: Tables, tally: Tally, image_id: str) -> None:
    said = {
        (r["subject"], r["variant"]): r
        for r in (t.rows("SELECT * FROM responses WHERE image_id = ?", [image_id]) if t.has("responses") else [])
    }
    scores = {
        (r["subject"], r["variant"], r["metric"]): r["value"]
        for r in (t.rows("SELECT * FROM scores WHERE image_id = ?", [image_id]) if t.has("scores") else [])
    }
    metrics = sorted({m for _, _, m in scores})
    own = {}
    for r in t.rows("SELECT * FROM spatial WHERE image_id = ?", [image_id]) if t.has("spatial") else []:
        own |= {(r["subject"], m): v for m, v in zip(r["mask_ids"] or [], r["model_profile"] or [])}
    table = section.find("table")
    if table is None:
        return
    head = table.head()
    assert head[3 : 3 + len(metrics)] == metrics
    profile = len(head) > 3 + len(metrics)
    shown = set()
    for row in table.iter("tr"):
        subject, variant = row.attrs.get("data-model"), row.attrs.get("data-variant")
        if subject is None:
            continue
        cells = row.cells()
        if "humans" in (row.attrs.get("class") or ""):
            values = cells[3 : 3 + len(metrics)]
            for cell, metric in zip(values, metrics):
                tally.numbers("image", cell, [scores.get((subject, "full", metric))], f"{subject} {metric}")
            row.checked = True
            shown.add((subject, "full"))
            continue
        cells = cells[-(2 + len(metrics) + profile) :]  # the model's name spans its rows
        response = said.get((subject, variant))
        if response is None:
            text = "(no response)"
        elif response["status"] != "ok":
            text = f"{response['status']}: {response['error']}"
        else:
            text = response["text"]
        tally.text("image", cells[1], text, f"{subject} {variant}")
        for cell, metric in zip(cells[2 : 2 + len(metrics)], metrics):
            tally.numbers("image", cell, [scores.get((subject, variant, metric))], f"{subject} {variant} {metric}")
        if profile:
            if variant == "full":
                tally.text("image", cells[-1], "")
            else:
                tally.numbers("image", cells[-1], [own.get((subject, variant))], f"{subject} {variant} own")
        row.checked = True
        shown.add((subject, variant))
    assert shown == set(said) | {(s, v) for s, v, _ in scores}


def _errors(section: Element, t: Tables, tally: Tally, image_id: str) -> None:
    rows = t.rows("SELECT * FROM errors WHERE image_id = ?", [image_id]) if t.has("errors") else []
    table = section.find("table", class_="errors")
    assert (table is None) == (not rows)
    by = {(r["subject"], r["error_type"]): r for r in rows}
    shown = set()
    for row in table.iter("tr") if table is not None else []:
        key = (row.attrs.get("data-model"), row.attrs.get("data-error"))
        if key[0] is None:
            continue
        r = by[key]
        cells = row.cells()
        state = "undecided" if r["present"] is None else ("yes" if r["present"] else "no")
        tally.text("image", cells[0], r["subject"])
        tally.text("image", cells[1], ERROR_NAMES.get(r["error_type"], r["error_type"]))
        tally.text("image", cells[2], state)
        tally.text("image", cells[3], r["method"])
        evidence = json.loads(r["evidence"]) if r["evidence"] else {}
        pre = cells[4].one("pre")
        assert json.loads(pre.text()) == evidence
        pre.checked = True
        leaves = _leaves(evidence)
        for token in NUMBERS.findall(_unchecked_text(cells[4])):
            assert any(printed(v, token) if not isinstance(v, str) else v == token for v in leaves), (
                f"{key}: evidence prints {token}, which its row does not hold"
            )
            tally.compared["image"] += 1
        row.checked = True
        shown.add(key)
    assert shown == set(by)
    probes = t.rows("SELECT * FROM probes WHERE image_id = ?", [image_id]) if t.has("probes") else []
    for block in section.iter("div", class_="probes"):
        mine = [p for p in probes if p["subject"] == block.attrs["data-model"]]
        for li in block.one("ol").elements():
            found = next(p for p in mine if squeeze(li.one("span", class_="q").text()) == squeeze(p["question"]))
            mine.remove(found)
            answer = found["answer"] if found["status"] == "ok" else f"{found['status']}: {found['error']}"
            tally.text(
                "image", li, f"round {found['round']}, {found['kind']}, {found['object']} {found['question']} {answer}"
            )


def _leaves(value) -> list:
    """Every number in a piece of evidence, and every number written in its texts."""
    if isinstance(value, dict):
        return [x for v in value.values() for x in _leaves(v)]
    if isinstance(value, list):
        return [x for v in value for x in _leaves(v)]
    if isinstance(value, str):
        return NUMBERS.findall(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [value]
    return []


def _unchecked_text(element: Element) -> str:
    return " ".join(
        c if isinstance(c, str) else _unchecked_text(c) for c in element.children if isinstance(c, str) or not c.checked
    )


def _spatial(section: Element, t: Tables, tally: Tally, image_id: str) -> None:
    rows = t.rows("SELECT * FROM spatial WHERE image_id = ?", [image_id]) if t.has("spatial") else []
    table = section.find("table", class_="spatial")
    assert (table is None) == (not rows)
    by = {r["subject"]: r for r in rows}
    for row in table.iter("tr") if table is not None else []:
        if "data-model" not in row.attrs:
            continue
        r = by.pop(row.attrs["data-model"])
        cells = row.cells()
        tally.text("image", cells[0], r["subject"])
        tally.text("image", cells[1], ", ".join(r["mask_ids"] or []))
        tally.numbers("image", cells[2], list(r["model_profile"] or []), "model profile")
        tally.numbers("image", cells[3], list(r["human_profile"] or []), "human profile")
        tally.numbers("image", cells[4], [r["model_r"]], "model r")
        tally.numbers("image", cells[5], [r["human_mean_r"], r["human_sd_r"]], "human r")
        tally.numbers("image", cells[6], [r["z"]], "z")
        sde = "yes" if r["sde"] else ("undecided" if r["sde"] is None else "no")
        tally.text("image", cells[7], f"{sde} {r['reason'] or ''}")
        row.checked = True
    assert not by


def model(main: Element, t: Tables, tally: Tally, name: str, config: dict) -> None:
    """One model page: its statistics about all images, each group's, its error rates, comparisons
    and failed responses."""
    model_codes(main, tally, name, config)
    if t.has("stats"):
        stats = t.rows(f"SELECT * FROM stats WHERE subject = ? AND {t.all_images('stats')}", [name])
        table = main.find("table", id="stats")
        columns = ["metric", "variant", "dataset", "estimate", None, "n_images", "n_resamples"]
        _rows_with_ci(tally, table, stats, columns, 4) if stats else None
        grouped = t.rows("SELECT * FROM stats WHERE subject = ? AND NOT " + t.all_images("stats"), [name])
        tables = {tb.attrs["data-group-by"]: tb for tb in main.iter("table", class_="grouped")}
        assert set(tables) == {r["group_by"] for r in grouped}
        for variable, table in tables.items():
            mine = [r for r in grouped if r["group_by"] == variable]
            columns = ["group", "metric", "variant", "dataset", "estimate", None, "n_images"]
            _rows_with_ci(tally, table, mine, columns, 5)
    if t.has("error_stats"):
        rates = t.rows("SELECT * FROM error_stats WHERE subject = ?", [name])
        for r in rates:
            r["name"] = ERROR_NAMES.get(r["metric"], r["metric"])
        table = main.find("table", id="error-stats")
        if rates:
            _rows_with_ci(tally, table, rates, ["name", "dataset", "estimate", None, "n_images"], 3)
    if t.has("comparisons"):
        rows = t.rows(
            f"SELECT * FROM comparisons WHERE (a = ? OR b = ?) AND {t.all_images('comparisons')}", [name, name]
        )
        table = main.find("table", id="comparisons")
        if rows:
            columns = ["family", "a", "b", "dataset", "metric", "difference", None, "p", "q"]
            _rows_with_ci(tally, table, rows, columns, 6)
    failed(main, t, tally, name, "variant, prompt_id", ["image_id", "variant", "prompt_id", "status", "error"])


def _rows_with_ci(tally: Tally, table: Element, rows: list[dict], columns: list, ci_at: int) -> None:
    """`table` shows `rows`, each once: `columns` by name, and the CI ([low, high]) in cell `ci_at`."""
    assert table is not None
    for r in rows:
        r["ci"] = f"[{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}]"
    columns = list(columns)
    columns[ci_at] = "ci"
    match_rows(tally, "model", table, rows, columns)


def _fmt(value) -> str:
    return "–" if value is None or value != value else f"{value:.3f}"


STATS = ["subject", "dataset", "metric", "variant", "estimate", "ci_low", "ci_high", "n_images"]
# The report's tables that print a run table's rows as they are: header -> (table, every row shown).
AS_STORED = {
    ("family", "a", "b", "dataset", "metric", "difference", "ci_low", "ci_high", "p", "q", "significant"): (
        "comparisons",
        False,  # an era of one model is that model: its repeats are left out
    ),
    ("label", "subset", "n_pairs", "spearman", "ci_low", "ci_high"): ("stsb", True),
    ("subject", "dataset", "metric", "estimate", "ci_low", "ci_high", "n_images"): ("error_stats", True),
    ("family", "a", "b", "dataset", "metric", "difference", "n_a", "n_b", "p", "q", "significant"): (
        "error_comparisons",
        False,
    ),
    ("subject", "estimate", "ci_low", "ci_high", "n_images", "n_pairs"): ("impact_stats", True),
    ("a", "b", "metric", "difference", "ci_low", "ci_high", "n_a", "n_b", "p", "q"): ("impact_comparisons", True),
    ("error_type", "kappa", "observed_agreement", "n"): ("hand_agreement", True),
}
VALIDATION = ["metric", "kind", "role", "estimate", "ci_low", "ci_high", "difference", "p", "q", "n_raters", "n_pairs"]


def more_pages(t: Tables, tally: Tally, config: dict) -> list:
    """None: Study A has no pages beyond the gallery, images and models."""
    return []


def report(body: Element, t: Tables, tally: Tally, config: dict) -> None:
    """Every table of report.html: each row a row of the run's tables (or a count of them), each shown once."""
    for headings, table in headed_tables(body):
        head = table.head()
        heading = headings.get("h4", "")
        if head == STATS and " = " in heading:
            variable, group = heading.split(" = ", 1)
            rows = t.rows('SELECT * FROM stats WHERE group_by = ? AND "group" = ?', [variable, group])
            match_rows(tally, "report", table, rows, head)
        elif head == STATS:
            match_rows(tally, "report", table, t.rows(f"SELECT * FROM stats WHERE {t.all_images('stats')}"), head)
        elif tuple(head) in AS_STORED:
            name, every = AS_STORED[tuple(head)]
            where = t.all_images(name) if name == "comparisons" else "TRUE"
            match_rows(tally, "report", table, t.rows(f'SELECT * FROM "{name}" WHERE {where}'), head, every)
        elif head[-len(VALIDATION) :] == VALIDATION:
            match_rows(tally, "report", table, t.rows("SELECT * FROM metric_validation"), head)
        elif head == ["subject", "images", "decided", "sde", "undecided", "why_undecided"]:
            match_rows(tally, "report", table, _sde_counts(t), head)
        elif head == ["dataset", "measure", "value", "participants", "items"]:
            match_rows(tally, "report", table, t.rows("SELECT * FROM reliability"), head)
        elif head == ["subject", "failed"]:
            rows = t.rows("SELECT subject, count(*) AS failed FROM responses WHERE status <> 'ok' GROUP BY subject")
            match_rows(tally, "report", table, rows, head)
        elif head == ["subject", "image_id", "variant", "error"]:
            rows = t.rows("SELECT * FROM responses WHERE status <> 'ok'")
            match_rows(tally, "report", table, rows, head, every=False)
        elif head[:4] == ["error", "image", "model", "objects"]:
            _error_examples(table, t, tally)
        elif "sample" in (table.attrs.get("class") or ""):
            _sample(table, t, tally, head[2])
        else:
            raise AssertionError(f"a table of the report the oracle does not know: {head}")
        assert not unread(table), f"{head}: numbers no check read: {unread(table)}"


def _sde_counts(t: Tables) -> list[dict]:
    rows = t.rows(
        "SELECT subject, count(*) AS images, count(sde) AS decided, count_if(sde) AS sde, "
        "count(*) - count(sde) AS undecided FROM spatial GROUP BY subject"
    )
    reasons = t.rows("SELECT subject, reason, count(*) AS n FROM spatial WHERE sde IS NULL GROUP BY subject, reason")
    for r in rows:
        mine = sorted((x for x in reasons if x["subject"] == r["subject"]), key=lambda x: (-x["n"], x["reason"]))
        r["why_undecided"] = "; ".join(f"{x['reason']} ({x['n']})" for x in mine)
    return rows


def _error_examples(table: Element, t: Tables, tally: Tally) -> None:
    """The error examples: a present label's image and model, what the model said, the gold standard."""
    said = {
        (r["subject"], r["image_id"]): r["text"]
        for r in t.rows("SELECT * FROM responses WHERE variant = 'full' AND status = 'ok'")
    }
    gold = {
        r["image_id"]: r["text"]
        for r in t.rows("SELECT * FROM \"references\" WHERE role = 'gold' AND condition = 'full'")
    }
    present = {(r["error_type"], r["image_id"], r["subject"]) for r in t.rows("SELECT * FROM errors WHERE present")}
    for row in table.body():
        cells = row.cells()
        error, image_id = squeeze(cells[0].text()), squeeze(cells[1].text())
        subject = squeeze(cells[2].children[0])
        assert (error, image_id, subject) in present
        for cell in cells[:3]:
            cell.checked = True
        tally.text("report", cells[4], said.get((subject, image_id), ""))
        tally.text("report", cells[5], gold.get(image_id, ""))


def _sample(table: Element, t: Tables, tally: Tally, metric: str) -> None:
    """A model's worst or best images: the image, its similarity, the model's and the gold's description."""
    subject = table.attrs["data-model"]
    scores = {
        r["image_id"]: r
        for r in t.rows(
            "SELECT s.*, i.dataset AS image_dataset FROM scores AS s JOIN images AS i USING (image_id) "
            "WHERE s.subject = ? AND s.metric = ? AND s.variant = 'full'",
            [subject, metric],
        )
    }
    said = {
        r["image_id"]: r["text"]
        for r in t.rows("SELECT * FROM responses WHERE subject = ? AND variant = 'full' AND status = 'ok'", [subject])
    }
    gold = {
        r["image_id"]: r["text"]
        for r in t.rows("SELECT * FROM \"references\" WHERE role = 'gold' AND condition = 'full'")
    }
    for row in table.body():
        cells = row.cells()
        image_id = squeeze(cells[1].children[0])
        r = scores[image_id]
        tally.text("report", cells[1], f"{image_id} {r['dataset']}")
        tally.numbers("report", cells[2], [r["value"]], f"{subject} {image_id}")
        tally.text("report", cells[3], said.get(image_id, "(no description)"))
        tally.text("report", cells[4], gold.get(image_id, ""))
