"""The view's pages over hand-built run folders: what the gallery lists for each filter and sort,
what an image page and a model page show, and how it meets bad input (not a run, missing tables,
a moved image, a path outside the run)."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from starlette.testclient import TestClient

from tests.figures import assert_drawn
from vlm_decade.core import runfolder
from vlm_decade.core.errors import InputError
from vlm_decade.stats.groups import with_group
from vlm_decade.view import decade
from vlm_decade.view.app import create_app
from vlm_decade.view.runs import open_run

from .view_runs import (
    BOX,
    FAILED_B,
    IMAGES,
    LABELS,
    OPENWORLD_STATS,
    PREDICTIONS,
    PRESENT,
    PROBE_QUESTION,
    SIMILARITY,
    STATS,
    decade_run,
    openworld_run,
    write,
)


def client(root) -> TestClient:
    return TestClient(create_app(open_run(root)), base_url="http://127.0.0.1:8765", raise_server_exceptions=True)


def listed(page: str) -> list[str]:
    return re.findall(r'<a class="card[^"]*" href="[^"]+" data-image="([^"]+)"', page)


@pytest.fixture(scope="module")
def run_a(tmp_path_factory):
    return decade_run(tmp_path_factory.mktemp("view") / "run")


@pytest.fixture(scope="module")
def app_a(run_a):
    return client(run_a)


def test_gallery_lists_every_image_in_id_order(app_a):
    page = app_a.get("/")
    assert page.status_code == 200
    assert listed(page.text) == sorted(IMAGES)
    assert '<span id="count">6 images</span>' in page.text


@pytest.mark.parametrize(
    "params, expected",
    [
        ({"dataset": "ds-b"}, ["b1", "b2", "b3"]),
        ({"error": "detection"}, sorted({i for m, i, t in PRESENT if t == "detection"})),
        ({"error": "detection", "model": "alpha"}, ["a1", "b1"]),
        ({"error": "detection", "model": "beta", "dataset": "ds-b"}, []),
        ({"sde": "yes"}, ["a2", "b1"]),
        ({"sde": "yes", "model": "beta"}, ["a2", "b1"]),
        ({"sde": "no", "model": "alpha"}, ["a1", "a3", "b1", "b2", "b3"]),
        ({"sde": "no"}, ["a1", "a3", "b2", "b3"]),
    ],
)
def test_gallery_filters(app_a, params, expected):
    assert listed(app_a.get("/", params=params).text) == expected


def test_sort_by_similarity_puts_the_worst_first_and_unscored_last(app_a):
    alpha = sorted((v[0], i) for i, v in SIMILARITY.items() if v[0] is not None)
    assert listed(app_a.get("/", params={"sort": "similarity:alpha"}).text) == [i for _, i in alpha] + ["b3"]
    descending = listed(app_a.get("/", params={"sort": "similarity:alpha", "order": "desc"}).text)
    assert descending == [i for _, i in reversed(alpha)] + ["b3"]


def test_sort_by_gap_puts_the_largest_model_human_gap_first(app_a):
    gap = sorted(((v[2] - v[1], i) for i, v in SIMILARITY.items()), reverse=True)
    assert listed(app_a.get("/", params={"sort": "gap:beta"}).text) == [i for _, i in gap]


def test_gallery_cards_show_the_models_similarity_and_errors(app_a):
    page = app_a.get("/", params={"model": "alpha", "dataset": "ds-a"}).text
    card = page[page.index('data-image="a3"') : page.index('data-image="a3"') + 1500]
    assert "0.500" in card and "recognition" in card and 'data-model="beta"' not in card
    assert 'top humans <span class="value">0.900</span>' in card


def test_paging(app_a, monkeypatch):
    monkeypatch.setattr(decade, "PAGE_SIZE", 4)
    first = app_a.get("/").text
    assert listed(first) == ["a1", "a2", "a3", "b1"] and "page 1 of 2" in first
    assert listed(app_a.get("/", params={"page": 2}).text) == ["b2", "b3"]


def test_unknown_filter_values_fall_back_to_defaults(app_a):
    page = app_a.get("/", params={"sort": "nonsense", "model": "<script>", "error": "bogus"})
    assert page.status_code == 200 and listed(page.text) == sorted(IMAGES)
    assert "<script>" not in page.text


def test_image_page_shows_descriptions_scores_errors_and_evidence(app_a):
    page = app_a.get("/image/a3")
    assert page.status_code == 200
    text = page.text
    # The gold standard (escaped), the top- and bottom-ranked humans with their votes.
    assert html.escape("gold description of a3 <b>bold</b>") in text and "<b>bold</b>" not in text
    assert re.search(r'data-role="top"><td>top-ranked</td><td>5</td><td>top description of a3', text)
    assert re.search(r'data-role="bottom"><td>bottom-ranked</td><td>1</td><td>bottom description of a3', text)
    assert "masked description of a3" in text
    # Every model's description per variant, with its similarity.
    for model in ("alpha", "beta"):
        for variant in ("full", "m1", "m2", "m3"):
            assert f'data-model="{model}" data-variant="{variant}"' in text and f"{model} says a3 {variant}" in text
    row = text[text.index('data-model="alpha" data-variant="full"') :]
    assert '<td class="value">0.500</td>' in row[: row.index("</tr>")]
    # A masked variant: its similarity to the model's own full description, from the SDE profile.
    row = text[text.index('data-model="beta" data-variant="m3"') :]
    assert '<td class="value">0.900</td>' in row[: row.index("</tr>")] and "SIM to own full" in text
    # The recognition label with its evidence and the detector box it cites, drawn in red.
    assert "named as <b>bowl</b>" in text and "similarity 0.610" in text
    assert f'data-box="{BOX[0]} {BOX[1]} {BOX[2]} {BOX[3]}"' in text
    assert re.search(r'class="box cited"[^>]*title="cup 0.88: evidence for alpha: recognition"', text)
    # The probe transcript of the API model, in the evidence and as asked.
    assert text.count(PROBE_QUESTION) >= 2 and "No." in text
    # Masks: the variants, the SDE table and the heat map.
    for variant in ("full", "m1", "m2", "m3"):
        assert f'src="/picture/{variant}/a3"' in text
    assert 'id="heatmap"' in text


def test_pictures_are_made_on_demand_and_cached_in_the_run(app_a, run_a):
    thumb = app_a.get("/picture/thumb/a1")
    assert (
        thumb.status_code == 200 and thumb.headers["content-type"] == "image/jpeg" and thumb.content[:2] == b"\xff\xd8"
    )
    assert list((run_a / ".view" / "thumbs").glob("*.jpg"))
    masked = app_a.get("/picture/m2/a1")
    assert masked.status_code == 200 and masked.headers["content-type"] == "image/jpeg"
    heat = app_a.get("/heatmap/a1")
    assert heat.status_code == 200 and heat.content[:4] == b"\x89PNG"
    assert_drawn(heat.content)
    assert app_a.get("/picture/m9/a1").status_code == 404
    assert app_a.get("/picture/thumb/nope").status_code == 404


def test_model_page_numbers_are_the_stats_tables(app_a):
    page = app_a.get("/model/beta").text
    rows = re.findall(
        r'<tr data-metric="SIM" data-variant="full" data-dataset="([^"]+)"\s+data-estimate="([^"]*)" '
        r'data-ci-low="([^"]*)" data-ci-high="([^"]*)">',
        page,
    )
    assert {d: tuple(None if v == "" else float(v) for v in values) for d, *values in rows} == {
        d: values for (m, d), values in STATS.items() if m == "beta"
    }
    assert '<td class="value">0.483</td>' in page and "[0.200, 0.650]" in page
    assert "[–, –]" in page  # the estimate a budget stop left out
    assert "1 failed response." in page and "RateLimitError: budget reached" in page
    assert app_a.get("/model/gamma").status_code == 404


def test_a_moved_image_gets_a_placeholder_not_an_error(tmp_path):
    root = decade_run(tmp_path / "run")
    (root / "inputs" / "b2.png").unlink()
    app = client(root)
    page = app.get("/image/b2")
    assert page.status_code == 200 and 'id="missing-image"' in page.text and "b2.png" in page.text
    for url in ("/picture/thumb/b2", "/picture/full/b2", "/picture/m1/b2", "/picture/original/b2", "/heatmap/b2"):
        answer = app.get(url)
        assert answer.status_code == 200 and answer.headers["content-type"] == "image/svg+xml", url
        assert b"image not found" in answer.content
    assert listed(app.get("/").text) == sorted(IMAGES)


def test_a_table_is_checked_once_and_again_when_it_changes(tmp_path, monkeypatch):
    root = decade_run(tmp_path / "run")
    hashed = []
    real = runfolder.file_sha256
    monkeypatch.setattr(runfolder, "file_sha256", lambda path: hashed.append(Path(path).name) or real(path))
    app = client(root)
    for _ in range(3):
        assert listed(app.get("/").text) == sorted(IMAGES)
    assert app.get("/image/a3").status_code == 200
    assert "images.parquet" not in hashed and len(hashed) == len(set(hashed))  # as written: trusted by size and time
    # The same rows in a file the run did not write: noticed at the next request, and no data shown.
    pq.write_table(pq.read_table(root / "images.parquet"), root / "images.parquet", compression="snappy")
    answer = app.get("/")
    assert answer.status_code == 409 and "images.parquet does not match the hash recorded" in answer.text
    assert listed(answer.text) == [] and app.get("/picture/thumb/a1").status_code == 409
    assert app.get("/run/images.parquet").status_code == 409 and app.get("/run/responses.parquet").status_code == 200


def test_a_page_number_is_a_whole_number_from_1_to_the_last_page(app_a):
    for bad in ("x", "0", "-1", "1.5", "9223372036854775808", "1e3", "\uff11"):
        answer = app_a.get("/", params={"page": bad})
        assert answer.status_code == 400 and "must be a whole number from 1" in answer.text, bad
    assert app_a.get("/", params={"page": 2}).status_code == 404  # 6 images fill one page
    assert app_a.get("/model/beta", params={"page": 2}).status_code == 404
    assert app_a.get("/model/beta", params={"page": "-3"}).status_code == 400


def test_a_run_with_only_its_images_table_still_shows(tmp_path):
    app = client(decade_run(tmp_path / "run", tables=("images",)))
    assert listed(app.get("/").text) == sorted(IMAGES)
    assert listed(app.get("/", params={"error": "detection", "sort": "gap:alpha"}).text) == sorted(IMAGES)
    page = app.get("/image/a1")
    assert page.status_code == 200 and "no error labels" in page.text and "no human descriptions" in page.text
    assert app.get("/model/alpha").status_code == 200
    assert app.get("/heatmap/a1").status_code == 404


def test_not_a_run_folder_is_a_clear_input_error(tmp_path):
    with pytest.raises(InputError, match="no such folder"):
        open_run(tmp_path / "absent")
    with pytest.raises(InputError, match="no run here"):
        open_run(tmp_path)
    (tmp_path / "manifest.json").write_text("{broken")
    with pytest.raises(InputError, match="not readable as JSON"):
        open_run(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"config": {"study": "decade", "name": "x"}}))
    with pytest.raises(InputError, match="config.data"):
        open_run(tmp_path)
    root = decade_run(tmp_path / "run")
    (root / "images.parquet").unlink()
    with pytest.raises(InputError, match="no images table"):
        open_run(root)


@pytest.mark.parametrize("url", ["/run/manifest.json", "/run/inputs/a1.png"])
def test_files_inside_the_run_are_served(app_a, url):
    assert app_a.get(url).status_code == 200


@pytest.mark.parametrize(
    "url",
    [
        "/run/%2Fetc%2Fpasswd",
        "/run/..%2F..%2Fetc%2Fpasswd",
        "/run/inputs/..%2F..%2F..%2Fetc%2Fpasswd",
        "/static/..%2F..%2Fcli.py",
        "/picture/original/..%2F..%2Fetc%2Fpasswd",
        "/run/",
        "/run/inputs",
    ],
)
def test_nothing_outside_the_run_is_served(app_a, url):
    assert app_a.get(url).status_code == 404


def test_a_link_out_of_the_run_is_not_followed(tmp_path):
    root = decade_run(tmp_path / "run")
    secret = tmp_path / "secret.txt"
    secret.write_text("private")
    (root / "link.txt").symlink_to(secret)
    assert client(root).get("/run/link.txt").status_code == 404


@pytest.fixture(scope="module")
def app_b(tmp_path_factory):
    return client(openworld_run(tmp_path_factory.mktemp("view-b") / "run"))


@pytest.mark.parametrize(
    "params, expected",
    [
        ({}, sorted(LABELS)),
        ({"outcome": "correct"}, sorted({i for (m, i), p in PREDICTIONS.items() if p[3] == "correct"})),
        ({"outcome": "confusion", "model": "alpha"}, ["a3", "b2"]),
        ({"outcome": "granularity", "dataset": "ds-b"}, ["b1"]),
        ({"granularity": "prototypical"}, ["a2", "b1", "b3"]),
        ({"outcome": "unjudged", "prompt": "specific"}, sorted(LABELS)),
        ({"outcome": "correct", "prompt": "specific"}, []),
    ],
)
def test_openworld_gallery_filters(app_b, params, expected):
    assert listed(app_b.get("/", params=params).text) == expected


def test_openworld_gallery_sorts_by_cs(app_b):
    alpha = sorted((p[2], i) for (m, i), p in PREDICTIONS.items() if m == "alpha")
    assert listed(app_b.get("/", params={"sort": "cs", "model": "alpha"}).text) == [i for _, i in alpha]
    lowest = sorted((min(PREDICTIONS[(m, i)][2] for m in ("alpha", "beta")), i) for i in LABELS)
    assert listed(app_b.get("/", params={"sort": "cs", "order": "desc"}).text) == [i for _, i in reversed(lowest)]


def test_openworld_card_and_image_page_show_every_prediction(app_b):
    page = app_b.get("/", params={"dataset": "ds-a"}).text
    card = page[page.index('data-image="a1"') : page.index('data-image="a2"')]
    assert "dalmatian" in card and 'data-model="beta" data-outcome="correct"' in card and "CS 0.95" in card
    image = app_b.get("/image/a2").text
    assert 'id="label">cat<' in image
    for model in ("alpha", "beta"):
        for prompt in ("default", "specific"):
            assert f'data-model="{model}" data-prompt="{prompt}"' in image
    assert "kitten" in image and "ambiguity" in image


def hand_confusions(model: str = "", prompt: str = "default") -> dict[str, dict[str, int]]:
    """label -> name -> predictions, counted from view_runs' PREDICTIONS: those that miss the label."""
    counts: dict[str, dict[str, int]] = {}
    for (m, i), (name, *_) in PREDICTIONS.items():
        label = LABELS[i][0]
        if model in ("", m) and label not in name and (m, i, prompt) != FAILED_B:
            counts.setdefault(label, {}).setdefault(name, 0)
            counts[label][name] += 1
    return counts


def shown_confusions(page: str) -> dict[str, dict[str, int]]:
    rows = re.findall(r'<tr data-label="([^"]+)">(.*?)</tr>', page, re.S)
    return {
        label: {n: int(c) for n, c in re.findall(r'data-prediction="([^"]+)" data-count="(\d+)"', cells)}
        for label, cells in rows
    }


@pytest.mark.parametrize("model", ["", "alpha", "beta"])
def test_confusion_view_counts_each_label_s_wrong_names_by_hand(app_b, model):
    page = app_b.get("/confusions", params={"model": model}).text
    assert shown_confusions(page) == hand_confusions(model)
    if not model:  # both models said tent for the yurt, the most confused label comes first
        assert shown_confusions(page)["yurt"] == {"tent": 2}
        assert re.findall(r'<tr data-label="([^"]+)">', page)[0] == "yurt"
        assert "7 predictions." in page


def test_confusion_view_filters_and_shows_every_prediction_when_asked(app_b):
    assert shown_confusions(app_b.get("/confusions", params={"dataset": "ds-b", "model": "alpha"}).text) == {
        "spoonbill": {"heron": 1}
    }
    everything = shown_confusions(app_b.get("/confusions", params={"show": "all", "model": "alpha"}).text)
    assert everything == {LABELS[i][0]: {p[0]: 1} for (m, i), p in PREDICTIONS.items() if m == "alpha"}
    assert (
        "No prediction matches"
        in app_b.get("/confusions", params={"granularity": "fine-grained", "dataset": "ds-x"}).text
    )


def test_a_confusion_opens_the_images_with_that_label_and_prediction(app_b):
    page = app_b.get("/confusions").text
    link = html.unescape(re.search(r'data-prediction="tent" data-count="2" href="([^"]+)"', page).group(1))
    assert link == "/?label=yurt&prediction=tent&prompt=default"
    gallery = app_b.get(link).text
    assert listed(gallery) == ["a3"] and 'name="label" value="yurt"' in gallery
    assert listed(app_b.get("/", params={"label": "dog", "prediction": "animal", "model": "alpha"}).text) == []
    assert listed(app_b.get("/", params={"label": "dog", "prediction": "animal", "model": "beta"}).text) == ["b1"]
    assert listed(app_b.get("/", params={"prediction": "dog"}).text) == ["a1", "b1"]


def test_openworld_model_page_shows_its_estimates_confusions_and_failures(app_b):
    page = app_b.get("/model/alpha").text
    cells = re.findall(
        r'<tr data-prompt="([^"]+)" data-dataset="([^"]+)"[^>]*>(.*?)</tr>',
        page[: page.index('id="outcome-stats"')],
        re.S,
    )
    shown = {}
    for prompt, dataset, row in cells:
        for metric, values in re.findall(r'data-metric="([^"]+)"((?: data-[a-z-]+="[^"]*")*)>', row):
            found = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', values))
            if found:
                shown[(prompt, dataset, metric)] = tuple(
                    None if found[k] == "" else float(found[k]) for k in ("estimate", "ci-low", "ci-high")
                )
    assert shown == {k[1:]: v for k, v in OPENWORLD_STATS.items() if k[0] == "alpha" and k[3] in ("TI", "CS")}
    # Groups before datasets, prompts in the study's order; the estimate a budget stop left out reads –.
    assert [(p, d) for p, d, _ in cells] == [
        ("default", "prototypical"),
        ("default", "all"),
        ("default", "ds-a"),
        ("specific", "all"),
    ]
    assert '0.943 <span class="ci">[0.900, 0.980]</span>' in page and '– <span class="ci">[–, –]</span>' in page
    assert 'data-metric="outcome:confusion" data-estimate="0.3333333333333333"' in page
    assert shown_confusions(page) == hand_confusions("alpha")
    assert "0 failed responses." in page
    beta = app_b.get("/model/beta").text
    assert "1 failed response." in beta and "TimeoutError: no answer in 60 s" in beta
    assert shown_confusions(beta) == hand_confusions("beta")
    assert app_b.get("/model/gamma").status_code == 404
    assert app_b.get("/model/alpha", params={"page": "2"}).status_code == 404


def grouped(root: Path, estimate: float) -> None:
    """The run's stats as a study grouped by `category` writes them: the rows about all images, and
    group `hard`'s, the same but for every estimate, which is `estimate`."""
    stats = pq.read_table(root / "stats.parquet")
    group = stats.set_column(
        stats.schema.get_field_index("estimate"), "estimate", pa.array([estimate] * stats.num_rows, pa.float64())
    )
    table = pa.concat_tables([with_group(stats, None, None), with_group(group, "category", "hard")])
    write(root, "stats", table.to_pylist(), table.schema)


def test_a_grouped_run_s_model_page_shows_the_rows_about_all_images_then_each_group(tmp_path):
    root = decade_run(tmp_path / "run")
    grouped(root, 0.0123)
    write(root, "metadata", [{"image_id": i, "category": "hard" if i < "b" else "easy"} for i in IMAGES])
    app = client(root)
    page = app.get("/model/beta").text
    main = page[page.index('id="stats"') : page.index("<h2>By group</h2>")]
    assert "0.483" in main and "0.012" not in main
    group = page[page.index("<h2>By group</h2>") : page.index("<h2>Error rates</h2>")]
    assert 'data-group-by="category"' in group and re.search(r'<tr data-group="hard" data-metric="SIM"', group)
    assert "0.012" in group and "0.483" not in group
    image = app.get("/image/a1").text
    assert '<td data-column="category">hard</td>' in image


def test_study_b_pages_show_accepted_names_groups_and_metadata(tmp_path):
    root = openworld_run(tmp_path / "run")
    grouped(root, 0.0123)
    labels = pq.read_table(root / "labels.parquet")
    names = [["kitty"] if label == "cat" else [] for label in labels["label"].to_pylist()]
    write(root, "labels", labels.append_column("accepted", pa.array(names, pa.list_(pa.string()))).to_pylist())
    write(root, "metadata", [{"image_id": i, "source": f"camera {i}"} for i in IMAGES])
    predictions = pq.read_table(root / "predictions.parquet")
    for m in ("TI", "LI", "SS", "CS"):  # the accepted-name forms: the single-label values, a2's TI 1
        value = predictions[m]
        if m == "TI":
            value = pc.if_else(pc.equal(predictions["image_id"], "a2"), 1.0, value)
        predictions = predictions.append_column(f"{m}_accepted", value)
    write(root, "predictions", predictions.to_pylist())
    app = client(root)
    page = app.get("/model/alpha").text
    main = page[page.index('id="stats"') : page.index("<h2>By group</h2>")]
    assert "0.012" not in main and 'data-metric="TI_accepted"' not in main  # the stats hold no TI_accepted
    assert "0.012" in page[page.index("<h2>By group</h2>") :]
    image = app.get("/image/a2").text
    assert 'also accepted: <span id="accepted"><b>kitty</b></span>' in image
    assert '<td data-column="source">camera a2</td>' in image
    assert "<th>TI</th><th>TI_accepted</th>" in image and 'data-metric="TI_accepted">1</td>' in image
    confusions = app.get("/confusions", params={"model": "beta", "show": "all"}).text
    assert re.search(
        r'data-label="cat"><td><a [^>]+>cat</a> <span class="note accepted-names">also accepted: kitty', confusions
    )
    assert 'data-prediction="kitten" data-count="1" data-accepted="1"' in confusions
