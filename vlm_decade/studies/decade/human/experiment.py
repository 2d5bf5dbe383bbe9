"""The experiment folder as a jsPsych experiment: index.html, experiment.js and jsPsych itself.

`vlm-decade human design` writes what the experiment shows (design.csv, texts.csv, images/,
experiment.json); `build_experiment` turns that into the page a participant opens. The design is
checked first (every problem named by file, row and field), then read into one object: the trials of
each design participant, the texts of the options, the rating scale, the experiment id and the
completion code. index.html carries what every participant needs in a `<script type="application/json">`
block (the design participants, the example trial, the scale, the ids); each design participant's
trials and texts are `trials/<participant>.json`, fetched by the page once it knows the participant
(at the paper's ranking size the whole design is 11.6 MB, a participant's part a fiftieth of it).
experiment.js, the same for every experiment, builds jsPsych's timeline from them. jsPsych is copied
from the package's vendored copy (static/jspsych, its README names versions and licence), so the
folder runs from any static host, JATOS or `vlm-decade human serve` with nothing fetched from
elsewhere, and every URL in it is relative.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape

from vlm_decade.core.errors import Problems
from vlm_decade.core.files import safe_name, write_if_changed
from vlm_decade.studies.decade.human.design import DESIGN_COLUMNS, EXPERIMENTS, experiment_id

HERE = Path(__file__).parent
VENDORED = HERE / "static" / "jspsych"
PLUGINS = (
    "plugin-preload.js",
    "plugin-instructions.js",
    "plugin-survey-text.js",
    "plugin-html-button-response.js",
    "plugin-html-slider-response.js",
)
TITLES = {"describe": "Describing pictures", "rank": "Choosing descriptions", "rate": "Rating descriptions"}


def _csv_rows(path: Path) -> list[dict]:
    with open(path, encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(io.StringIO(fh.read())))


def _trial(row: dict) -> dict:
    """A design row as experiment.js reads it: the trial a number, the options a list."""
    cells = {key: row[key] for key in ("kind", "image_id", "image", "condition", "subject", "text", "gold", "answer")}
    return cells | {"trial": int(row["trial"]), "options": [o for o in row["options"].split(";") if o]}


def _check_row(problems: Problems, folder: Path, number: int, row: dict, experiment: str, texts: dict) -> None:
    """One design row's problems (row numbers as a spreadsheet shows them)."""
    name = str(folder / "design.csv")
    if not row["participant"] or safe_name(row["participant"]) != row["participant"]:
        problems.add(name, f"participant '{row['participant']}' is not a plain name", number, "participant")
    if row["experiment"] != experiment:
        problems.add(name, f"experiment '{row['experiment']}' in a '{experiment}' design", number, "experiment")
    if row["kind"] not in {experiment, "attention"}:
        problems.add(name, f"kind '{row['kind']}' is not '{experiment}' or 'attention'", number, "kind")
    if not row["trial"].isdigit() or int(row["trial"]) < 1:
        problems.add(name, f"trial '{row['trial']}' is not a whole number from 1", number, "trial")
    image = row["image"]
    if not image or Path(image).name != image or image.startswith(".") or not (folder / "images" / image).is_file():
        problems.add(name, f"image '{image}' is not a file in images/", number, "image")
    options = [o for o in row["options"].split(";") if o]
    if experiment == "rank" and not options:
        problems.add(name, "a rank trial shows no options", number, "options")
    for option in options:
        if option not in texts:
            problems.add(name, f"option '{option}' is not in texts.csv", number, "options")


def read_design(folder: Path) -> dict:
    """The experiment folder's design as the one object index.html carries; every problem with
    design.csv, texts.csv, images/ and experiment.json raised together (InputError)."""
    problems = Problems()
    meta_path, design_path, texts_path = folder / "experiment.json", folder / "design.csv", folder / "texts.csv"
    for path in (meta_path, design_path, texts_path):
        if not path.is_file():
            problems.add(path, "missing: write the folder with `vlm-decade human design`")
    problems.raise_if_any()
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except ValueError as exc:
        meta = f"not JSON: {exc}"
    if not isinstance(meta, dict):
        problems.add(meta_path, meta if isinstance(meta, str) else "not a JSON object")
        problems.raise_if_any()
    experiment = meta.get("experiment")
    if experiment not in EXPERIMENTS:
        problems.add(meta_path, f"experiment '{experiment}' is not one of {', '.join(EXPERIMENTS)}", field="experiment")
    if meta.get("experiment_id") != experiment_id(design_path.read_bytes()):
        problems.add(
            meta_path,
            "experiment_id is not design.csv's: the design changed after it was written",
            field="experiment_id",
        )
    scale = meta.get("scale") or {}
    if not (isinstance(scale.get("min"), int | float) and isinstance(scale.get("max"), int | float)) or not (
        scale["min"] < scale["max"] and scale.get("step", 0) > 0
    ):
        problems.add(meta_path, "scale needs numbers min < max and a step > 0", field="scale")
    if not meta.get("completion_code"):
        problems.add(meta_path, "no completion code", field="completion_code")
    texts = {row["description_id"]: row["text"] for row in _csv_rows(texts_path)}
    rows = _csv_rows(design_path)
    absent = [c for c in DESIGN_COLUMNS if rows and c not in rows[0]]
    if absent or not rows:
        problems.add(design_path, f"no trials or no column {absent}" if absent else "no trials")
    problems.raise_if_any()
    participants: dict[str, list[dict]] = {}
    for number, row in enumerate(rows, 2):
        _check_row(problems, folder, number, row, experiment, texts)
        participants.setdefault(row["participant"], []).append(row)
    problems.raise_if_any()
    trials = {p: sorted((_trial(r) for r in rs), key=lambda t: t["trial"]) for p, rs in participants.items()}
    for participant, listed in trials.items():
        numbers = [t["trial"] for t in listed]
        if len(set(numbers)) != len(numbers):
            problems.add(design_path, f"participant {participant} has a trial number twice", field="trial")
    problems.raise_if_any()
    used = {option for listed in trials.values() for t in listed for option in t["options"]}
    example = next(t for t in trials[min(trials)] if t["kind"] != "attention")
    return {
        "experiment": experiment,
        "experiment_id": meta["experiment_id"],
        "completion_code": meta["completion_code"],
        "scale": {"min": scale["min"], "max": scale["max"], "step": scale["step"], "labels": scale.get("labels", [])},
        "texts": {key: texts[key] for key in sorted(used)},
        "participants": trials,
        "example": example,
    }


def _texts_of(design: dict, trials: list[dict]) -> dict[str, str]:
    return {option: design["texts"][option] for option in sorted({o for t in trials for o in t["options"]})}


def page_data(design: dict) -> dict:
    """What index.html carries: the design without the trials, the example's texts beside it."""
    shared = {key: design[key] for key in ("experiment", "experiment_id", "completion_code", "scale", "example")}
    example_texts = _texts_of(design, [design["example"]])
    return shared | {"participants": sorted(design["participants"]), "example_texts": example_texts}


def participant_data(design: dict, participant: str) -> dict:
    """trials/<participant>.json: a design participant's trials and the texts they show."""
    trials = design["participants"][participant]
    return {"participant": participant, "trials": trials, "texts": _texts_of(design, trials)}


def render_index(design: dict) -> str:
    """index.html: jsPsych, its plugins, the page's part of the design as JSON, experiment.js."""
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]))
    title = TITLES[design["experiment"]]
    return env.get_template("index.html").render(title=title, plugins=PLUGINS, design=page_data(design))


def build_experiment(folder: str | Path) -> dict:
    """Write index.html, experiment.js, trials/ and jspsych/ into the experiment folder (each file only
    where it changed); returns the whole design."""
    folder = Path(folder)
    design = read_design(folder)
    write_if_changed(folder / "index.html", render_index(design).encode("utf-8"))
    write_if_changed(folder / "experiment.js", (HERE / "templates" / "experiment.js").read_bytes())
    for participant in design["participants"]:
        data = json.dumps(participant_data(design, participant), ensure_ascii=False, separators=(",", ":"))
        write_if_changed(folder / "trials" / f"{participant}.json", data.encode("utf-8"))
    for stale in (folder / "trials").glob("*.json"):  # a participant of an earlier design
        if stale.stem not in design["participants"]:
            stale.unlink()
    for vendored in sorted(VENDORED.iterdir()):
        write_if_changed(folder / "jspsych" / vendored.name, vendored.read_bytes())
    return design
