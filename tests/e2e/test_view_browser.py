"""`vlm-decade view` on the demo's run folders, driven in a real headless Chromium: every page of
both studies with every picture loaded, no answer 5xx and no console error; the gallery and its
filters, an image page (the image, its variants, the descriptions, the error evidence), a model
page of each study against stats.parquet, Study B's gallery by outcome, its confusion view against
predictions.parquet, its report within a 1,400-pixel window, and requests for paths outside the run.
A screenshot of each page is saved under the demo run's temporary folder.

Chromium and chromedriver come from the system (Debian: chromium, chromium-driver; `make browser`);
without them these tests fail, they do not skip.
"""

from __future__ import annotations

import base64
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote, urlencode

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from vlm_decade.studies.openworld.statistics import PROMPT

from ..unit.view_runs import write
from .conftest import BIN, cli_env, vlm_decade

pytestmark = pytest.mark.e2e

# Headless, and nothing that reaches beyond this machine (background networking, updates, sync).
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
)
WAIT_S = 30


class Server:
    """`vlm-decade view RUN --port 0` (or another serving `command`) in a subprocess; `url` from the
    line it prints."""

    def __init__(self, run: Path, command: tuple[str, ...] = ("view",)):
        # stderr to a file, not a pipe: a server whose tracebacks filled an unread pipe would hang.
        self.log = tempfile.TemporaryFile("w+")
        self.process = subprocess.Popen(
            [str(BIN / "vlm-decade"), *command, str(run), "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=cli_env(),
        )
        line = self.process.stdout.readline()
        found = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        if not found:
            self.process.kill()
            self.process.wait()
            self.log.seek(0)
            raise AssertionError(f"no address printed: {line!r} {self.log.read()[-3000:]}")
        self.port = int(found.group(1))
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.process.stdout.close()
        self.log.close()


@pytest.fixture(scope="module")
def decade_server(demo_run):
    server = Server(demo_run[0] / "decade")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def openworld_server(demo_run):
    server = Server(demo_run[0] / "openworld")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def shots(demo_run) -> Path:
    folder = demo_run[0] / "screenshots"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not (chromium and driver_path):
        pytest.fail(
            "the view's browser tests need chromium and chromedriver: apt-get install chromium chromium-driver (make browser)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console, read by page_problems
    # The driver is named, so Selenium Manager (which would download one) never runs.
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    driver.set_page_load_timeout(WAIT_S)
    yield driver
    driver.quit()


def screenshot(driver, path: Path) -> None:
    """The whole page, not just the window."""
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 6000), "scale": 1}
    data = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    path.write_bytes(base64.b64decode(data["data"]))
    assert path.stat().st_size > 5_000


def wait_for(driver, condition, what: str):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S).until(lambda d: condition(d), message=what)


def cards(driver) -> list[str]:
    from selenium.webdriver.common.by import By

    return [c.get_attribute("data-image") for c in driver.find_elements(By.CSS_SELECTOR, "#gallery a.card")]


def choose(driver, select_id: str, value: str) -> None:
    """Pick a value in one of the filters; the page reloads with it in its address."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    old = driver.find_element(By.ID, "gallery")
    Select(driver.find_element(By.ID, select_id)).select_by_value(value)
    wait_for(driver, lambda d: _stale(old), f"the page to reload after choosing {value}")
    wait_for(driver, lambda d: d.execute_script("return document.readyState") == "complete", "the page to load")


def _stale(element) -> bool:
    from selenium.common.exceptions import StaleElementReferenceException

    try:
        element.is_enabled()
        return False
    except StaleElementReferenceException:
        return True


def images_loaded(driver, selector: str) -> bool:
    return driver.execute_script(
        "const xs = [...document.querySelectorAll(arguments[0])]; return xs.length > 0 && xs.every(i => i.complete && i.naturalWidth > 0);",
        selector,
    )


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=WAIT_S) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code


def page_problems(driver, url: str) -> list[str]:
    """Load `url` and say what went wrong: a picture that did not load (or came as the placeholder
    for a missing image), an answer 5xx (the page's or any of its requests'), a console error."""
    driver.get_log("browser")  # what earlier pages left
    driver.get(url)
    wait_for(driver, lambda d: d.execute_script("return document.readyState") == "complete", f"{url} to load")
    # Lazy pictures load as they come into view: scroll through the page a window at a time.
    height = driver.execute_script("return document.documentElement.scrollHeight")
    for y in range(0, height + 1, 600):
        driver.execute_script("window.scrollTo(0, arguments[0])", y)
    done = "return [...document.images].every(i => i.complete)"
    wait_for(driver, lambda d: d.execute_script(done), f"the pictures of {url}")
    problems = [
        f"picture not loaded: {src}"
        for src in driver.execute_script(
            "return [...document.images].filter(i => !(i.naturalWidth > 0)).map(i => i.src)"
        )
    ]
    sources = driver.execute_script("return [...document.images].map(i => i.src).filter(s => s.startsWith('http'))")
    for src in sorted(set(sources)):
        try:
            with urllib.request.urlopen(src, timeout=WAIT_S) as answer:
                if answer.headers.get_content_type() == "image/svg+xml":
                    problems.append(f"placeholder instead of the picture: {src}")
        except urllib.error.HTTPError as exc:
            problems.append(f"picture answered {exc.code}: {src}")
    problems += [
        f"answered {status}: {name}"
        for name, status in driver.execute_script(
            "return [...performance.getEntriesByType('navigation'), ...performance.getEntriesByType('resource')]"
            ".map(e => [e.name, e.responseStatus])"
        )
        if status >= 500
    ]
    problems += [f"console: {e['message']}" for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    return problems


def confusions_of(run: Path, prompt: str = "default", model: str = "") -> dict[tuple[str, str], int]:
    """(label, predicted name) -> predictions under `prompt` that miss the label (TI 0), from predictions.parquet."""
    counts: dict[tuple[str, str], int] = {}
    for r in pq.read_table(run / "predictions.parquet").to_pylist():
        if r["prompt_id"] == prompt and r["TI"] == 0 and model in ("", r["subject"]) and r["prediction"] is not None:
            counts[(r["label"], r["prediction"])] = counts.get((r["label"], r["prediction"]), 0) + 1
    return counts


def every_page(server: Server, run: Path) -> list[str]:
    """Every page type of a study's viewer on a run: the gallery, each image, each model and the
    report; for Study B also the confusion view and the gallery of one of its confusions."""
    images = sorted(pq.read_table(run / "images.parquet").column("image_id").to_pylist())
    models = [r["subject"] for r in pq.read_table(run / "responses.parquet").select(["subject"]).to_pylist()]
    pages = ["/", *(f"/image/{quote(i, safe='')}" for i in images), "/run/report.html"]
    pages += [f"/model/{quote(m, safe='')}" for m in sorted(set(models))]
    if (run / "labels.parquet").exists():
        label, name = min(confusions_of(run))
        pages += ["/confusions", "/?" + urlencode({"label": label, "prediction": name, "prompt": "default"})]
    return pages


@pytest.mark.parametrize("study", ["decade", "openworld"])
def test_every_page_shows_its_pictures_without_errors(browser, request, demo_run, study):
    server = request.getfixturevalue(f"{study}_server")
    pages = every_page(server, demo_run[0] / study)
    assert len(pages) > 3 and any(p.startswith("/model/") for p in pages)
    answers = {page: status_of(server.url + page) for page in pages}
    assert set(answers.values()) == {200}, answers
    problems = {page: found for page in pages if (found := page_problems(browser, server.url + page))}
    assert problems == {}


def test_the_gallery_lists_the_images_and_a_filter_narrows_it(browser, decade_server, demo_run, shots):
    run = demo_run[0] / "decade"
    images = pq.read_table(run / "images.parquet")
    browser.get(decade_server.url + "/")
    assert cards(browser) == sorted(images.column("image_id").to_pylist())
    wait_for(browser, lambda d: images_loaded(d, "#gallery a.card:nth-child(-n+4) img"), "the first thumbnails")
    screenshot(browser, shots / "decade-gallery.png")

    choose(browser, "f-dataset", "specialist")
    specialist = images.filter(pc.equal(images.column("dataset"), "specialist")).column("image_id").to_pylist()
    assert "dataset=specialist" in browser.current_url and cards(browser) == sorted(specialist)
    assert 0 < len(specialist) < images.num_rows

    # Then one model's detection errors: exactly the images errors.parquet labels so.
    choose(browser, "f-model", "ssd-template")
    choose(browser, "f-error", "detection")
    errors = pq.read_table(run / "errors.parquet").to_pylist()
    expected = sorted(
        {
            r["image_id"]
            for r in errors
            if r["present"]
            and r["subject"] == "ssd-template"
            and r["error_type"] == "detection"
            and r["image_id"] in specialist
        }
    )
    assert cards(browser) == expected
    screenshot(browser, shots / "decade-gallery-filtered.png")

    # Sorted by the model's similarity, worst first, as scores.parquet has it.
    browser.get(decade_server.url + "/?sort=similarity:ssd-template&metric=SBERT-SI")
    scores = [
        r
        for r in pq.read_table(run / "scores.parquet").to_pylist()
        if r["subject"] == "ssd-template" and r["metric"] == "SBERT-SI" and r["variant"] == "full"
    ]
    assert cards(browser) == [r["image_id"] for r in sorted(scores, key=lambda r: (r["value"], r["image_id"]))]


def test_an_image_page_shows_the_image_its_variants_descriptions_and_evidence(browser, decade_server, demo_run, shots):
    from selenium.webdriver.common.by import By

    run = demo_run[0] / "decade"
    detections = {r["image_id"]: r["detections"] for r in pq.read_table(run / "detections.parquet").to_pylist()}
    image_id = max(sorted(detections), key=lambda i: len(detections[i]))  # the image with the most boxes
    browser.get(f"{decade_server.url}/image/{image_id}")
    assert browser.find_element(By.ID, "image-id").text.startswith(image_id)
    wait_for(
        browser,
        lambda d: images_loaded(d, "#main-image, #variants img, #heatmap"),
        "the image, its variants and heat map",
    )
    variants = [f.get_attribute("data-variant") for f in browser.find_elements(By.CSS_SELECTOR, "#variants figure")]
    assert variants == ["full", "m1", "m2", "m3"]
    # The detector's boxes, drawn over the image where they are.
    boxes = browser.find_elements(By.CSS_SELECTOR, "#boxed .box")
    assert len(boxes) == len(detections[image_id]) > 0
    picture = browser.find_element(By.ID, "main-image").rect
    first, d = boxes[0].rect, detections[image_id][0]
    assert first["x"] - picture["x"] == pytest.approx(d["x0"] * picture["width"], abs=2)
    assert first["width"] == pytest.approx((d["x1"] - d["x0"]) * picture["width"], abs=2)
    # The gold standard and the ranked humans, every model's description of every variant.
    references = pq.read_table(run / "references.parquet").to_pylist()
    gold = next(r for r in references if r["image_id"] == image_id and r["role"] == "gold" and r["condition"] == "full")
    assert browser.find_element(By.CSS_SELECTOR, "tr.gold td:last-child").text == gold["text"]
    tops = browser.find_elements(By.CSS_SELECTOR, "tr[data-role='top']")
    assert len(tops) == sum(r["image_id"] == image_id and r["role"] == "top" for r in references)
    responses = [r for r in pq.read_table(run / "responses.parquet").to_pylist() if r["image_id"] == image_id]
    for r in responses:
        row = browser.find_element(By.CSS_SELECTOR, f"tr[data-model='{r['subject']}'][data-variant='{r['variant']}']")
        assert r["text"] in row.text
    # Every error label with its evidence.
    errors = [r for r in pq.read_table(run / "errors.parquet").to_pylist() if r["image_id"] == image_id]
    rows = browser.find_elements(By.CSS_SELECTOR, "table.errors tbody > tr")
    assert len(rows) == len(errors)
    for r in errors:
        row = browser.find_element(
            By.CSS_SELECTOR, f"table.errors tr[data-model='{r['subject']}'][data-error='{r['error_type']}']"
        )
        assert ("yes" if r["present"] else ("undecided" if r["present"] is None else "no")) in row.text
    toggle = browser.find_element(By.ID, "toggle-boxes")
    toggle.click()
    assert not boxes[0].is_displayed()
    toggle.click()
    screenshot(browser, shots / "decade-image.png")


def test_the_model_page_shows_the_numbers_of_stats_parquet(browser, decade_server, demo_run, shots):
    from selenium.webdriver.common.by import By

    run = demo_run[0] / "decade"
    browser.get(f"{decade_server.url}/model/demo-imported")
    stats = [r for r in pq.read_table(run / "stats.parquet").to_pylist() if r["subject"] == "demo-imported"]
    rows = browser.find_elements(By.CSS_SELECTOR, "#stats tbody tr")
    assert len(rows) == len(stats) > 0
    shown = {}
    for row in rows:
        cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
        shown[(cells[0], cells[1], cells[2])] = (cells[3], cells[4], float(row.get_attribute("data-estimate")))
    for r in stats:
        text, ci, exact = shown[(r["metric"], r["variant"], r["dataset"])]
        assert (
            text == f"{r['estimate']:.3f}"
            and ci == f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]"
            and exact == r["estimate"]
        )
    error_stats = [r for r in pq.read_table(run / "error_stats.parquet").to_pylist() if r["subject"] == "demo-imported"]
    rates = {
        (row.get_attribute("data-metric"), row.get_attribute("data-dataset")): float(row.get_attribute("data-estimate"))
        for row in browser.find_elements(By.CSS_SELECTOR, "#error-stats tbody tr")
    }
    assert rates == {(r["metric"], r["dataset"]): r["estimate"] for r in error_stats}
    screenshot(browser, shots / "decade-model.png")


def test_study_b_gallery_filters_by_outcome(browser, openworld_server, demo_run, shots):
    from selenium.webdriver.common.by import By

    run = demo_run[0] / "openworld"
    images = pq.read_table(run / "images.parquet").column("image_id").to_pylist()
    browser.get(openworld_server.url + "/")
    assert cards(browser) == sorted(images)
    wait_for(browser, lambda d: images_loaded(d, "#gallery a.card:nth-child(-n+4) img"), "the first thumbnails")
    screenshot(browser, shots / "openworld-gallery.png")
    # The demo has no judge, so every prediction is unjudged and none is correct.
    choose(browser, "f-outcome", "correct")
    assert cards(browser) == [] and "No image matches" in browser.find_element(By.ID, "gallery").text
    choose(browser, "f-outcome", "unjudged")
    assert cards(browser) == sorted(images)
    choose(browser, "f-sort", "cs")
    predictions = [r for r in pq.read_table(run / "predictions.parquet").to_pylist() if r["prompt_id"] == "default"]
    lowest = {}
    for r in predictions:
        lowest[r["image_id"]] = min(lowest.get(r["image_id"], 1e9), r["CS"])
    assert cards(browser) == sorted(lowest, key=lambda i: (lowest[i], i))


def test_study_b_model_page_shows_the_numbers_of_stats_parquet_and_its_confusions(
    browser, openworld_server, demo_run, shots
):
    from selenium.webdriver.common.by import By

    run = demo_run[0] / "openworld"
    model = "efficientnet-lite3-imagenet"
    browser.get(f"{openworld_server.url}/model/{model}")
    stats = {
        (r[PROMPT], r["dataset"], r["metric"]): r["estimate"]
        for r in pq.read_table(run / "stats.parquet").to_pylist()
        if r["subject"] == model and r["metric"] in ("TI", "LI", "SS", "CS") and r["estimate"] is not None
    }
    shown = {
        (row.get_attribute("data-prompt"), row.get_attribute("data-dataset"), cell.get_attribute("data-metric")): float(
            cell.get_attribute("data-estimate")
        )
        for row in browser.find_elements(By.CSS_SELECTOR, "#stats tbody tr")
        for cell in row.find_elements(By.CSS_SELECTOR, "td[data-estimate]")
        if cell.get_attribute("data-estimate")
    }
    assert shown == stats and len(stats) > 3
    names = {
        (a.find_element(By.XPATH, "ancestor::tr").get_attribute("data-label"), a.get_attribute("data-prediction")): int(
            a.get_attribute("data-count")
        )
        for a in browser.find_elements(By.CSS_SELECTOR, "#confusions a.predicted")
    }
    expected = confusions_of(run, model=model)
    labels = sorted(
        {label for label, _ in expected}, key=lambda k: (-sum(n for (a, _), n in expected.items() if a == k), k)
    )
    assert names == {k: n for k, n in expected.items() if k[0] in labels[:20]} and names
    screenshot(browser, shots / "openworld-model.png")


def test_the_confusion_view_counts_predictions_and_opens_their_images(browser, openworld_server, demo_run, shots):
    from selenium.webdriver.common.by import By

    run = demo_run[0] / "openworld"
    browser.get(f"{openworld_server.url}/confusions")
    links = browser.find_elements(By.CSS_SELECTOR, "#confusions a.predicted")
    shown = {
        (a.find_element(By.XPATH, "ancestor::tr").get_attribute("data-label"), a.get_attribute("data-prediction")): int(
            a.get_attribute("data-count")
        )
        for a in links
    }
    assert shown == confusions_of(run)
    screenshot(browser, shots / "openworld-confusions.png")
    label, name = (
        links[0].find_element(By.XPATH, "ancestor::tr").get_attribute("data-label"),
        links[0].get_attribute("data-prediction"),
    )
    links[0].click()
    wait_for(browser, lambda d: "prediction=" in d.current_url, "the gallery of one confusion")
    predictions = pq.read_table(run / "predictions.parquet").to_pylist()
    assert cards(browser) == sorted(
        {
            r["image_id"]
            for r in predictions
            if r["prompt_id"] == "default" and r["label"] == label and r["prediction"] == name
        }
    )
    assert cards(browser)


def test_study_b_report_fits_a_1400_pixel_window(browser, openworld_server):
    from selenium.webdriver.common.by import By

    browser.get(f"{openworld_server.url}/run/report.html")
    width = browser.execute_script("return window.innerWidth")
    table = browser.find_element(By.ID, "ss-thresholds")
    assert width <= 1400 and browser.execute_script("return document.documentElement.scrollWidth") <= width
    assert table.rect["x"] + table.rect["width"] <= width
    shown = browser.execute_script("return [...document.images].map(i => i.getAttribute('src'))")
    assert {
        "figures/openworld_metrics.png",
        "figures/openworld_ss_thresholds.png",
        "figures/openworld_outcomes.png",
    } <= set(shown)


def test_study_b_gallery_filters_a_judged_run_by_outcome(browser, demo_run, tmp_path, shots):
    """The same run with LI set from text inclusion, a stand-in judge, and the outcomes that follow."""
    from vlm_decade.studies.openworld.outcomes import outcome

    run = tmp_path / "judged"
    shutil.copytree(demo_run[0] / "openworld", run, ignore=shutil.ignore_patterns(".view"))
    table = pq.read_table(run / "predictions.parquet")
    rows = table.to_pylist()
    for r in rows:
        r["LI"] = r["TI"]
        r["outcome"] = outcome(r["CS"], r["LI"])
    write(run, "predictions", rows, table.schema)  # as the stage writes it, so the view verifies it
    server = Server(run)
    try:
        for name in ("granularity", "confusion", "correct"):
            browser.get(f"{server.url}/")
            choose(browser, "f-outcome", name)
            assert cards(browser) == sorted({r["image_id"] for r in rows if r["outcome"] == name}), name
            if name == "confusion":
                screenshot(browser, shots / "openworld-gallery-confusion.png")
        browser.get(f"{server.url}/?outcome=correct&model=efficientnet-lite3-imagenet")
        assert cards(browser) == sorted(
            {r["image_id"] for r in rows if r["outcome"] == "correct" and r["subject"] == "efficientnet-lite3-imagenet"}
        )
    finally:
        server.stop()


def raw_get(port: int, target: str, host: str = "127.0.0.1") -> tuple[int, bytes]:
    """A request with its target sent exactly as written (no client normalises the dots away)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data


@pytest.mark.parametrize(
    "target",
    [
        "/../etc/passwd",
        "/run/../../../../etc/passwd",
        "/run/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        "/run//etc/passwd",
        "/run/%2Fetc%2Fpasswd",
        "/run/inputs/../../../../../etc/passwd",
        "/static/../../../../../etc/passwd",
        "/static/%2e%2e/%2e%2e/%2e%2e/cli.py",
        "/picture/original/../../../etc/passwd",
        "/picture/original/%2Fetc%2Fpasswd",
        "//etc/passwd",
        "/etc/passwd",
        "http://127.0.0.1/etc/passwd",
    ],
)
def test_paths_outside_the_run_are_not_found(decade_server, target):
    status, body = raw_get(decade_server.port, target)
    assert status == 404, body[:300]
    assert b"root:" not in body and b"from __future__" not in body


@pytest.mark.parametrize(
    "target, host, status",
    [
        ("/run/%00/etc/passwd", "127.0.0.1", 400),
        ("/?page=9223372036854775807", "127.0.0.1", 400),
        ("/image/%ff", "127.0.0.1", 404),
        ("/run/manifest.json", "attacker.example.com", 400),
    ],
)
def test_bad_requests_are_4xx_through_the_server(decade_server, target, host, status):
    answer, body = raw_get(decade_server.port, target, host)
    assert answer == status, body[:300]
    assert b"nosniff" in body and b"frame-ancestors 'none'" in body and b'"config"' not in body


def test_a_request_line_that_is_not_ascii_is_refused_by_the_server(decade_server):
    assert raw_get(decade_server.port, "/image/\u00ff\u00fe")[0] == 400


def test_the_run_folders_own_files_are_served(decade_server):
    assert raw_get(decade_server.port, "/run/report.html")[0] == 200
    assert raw_get(decade_server.port, "/run/figures/similarity_SBERT-SI.png")[0] == 200


def test_not_a_run_folder_is_a_clear_message(tmp_path):
    for folder in (tmp_path, tmp_path / "absent"):
        started = time.monotonic()
        done = vlm_decade("view", str(folder), "--port", "0", timeout=120)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert ("no run here" if folder.exists() else "no such folder") in " ".join(done.stderr.split())
        assert time.monotonic() - started < 120
