"""The `vlm-decade human` commands: the people's side of Study A, run as the paper ran it.

`design` writes an experiment folder (the design table, the texts and images it shows, its
parameters), `serve` runs it on 127.0.0.1 for lab sessions, `import` turns the data jsPsych saved
into the descriptions, votes and ratings tables the study reads, and `plan` says from pilot data how
many participants a stable gold standard and a narrow rating interval need (docs/human.md walks
them). The group is built by `commands`, from the command line's own app class, so every command
runs inside the same handler as the others: bad input ends with exit status 2 naming file, record
and field, never a traceback.
"""

from __future__ import annotations

from pathlib import Path

import typer

from vlm_decade.core.errors import STUDY_FILE, InputError, Problem

EXPERIMENT_HELP = "describe (free descriptions), rank (choose the best description) or rate (similarity to the gold)."


def _experiment(name: str) -> str:
    if name not in ("describe", "rank", "rate"):
        raise InputError(
            [Problem("command line", f"unknown experiment '{name}': describe, rank or rate", field="EXPERIMENT")]
        )
    return name


def _study_a(study_file: Path):
    """The Study A config of `study_file`; another study is refused."""
    from vlm_decade.studies import load_study

    study = load_study(study_file)
    if study.study != "decade":
        raise InputError([Problem(STUDY_FILE, "human experiments are Study A's (study: decade)", field="study")])
    return study


def _default_folder(study_file: Path, experiment: str) -> Path:
    """Where an experiment's folder lies by default: `human/<experiment>/` beside the study file."""
    return study_file.parent / "human" / experiment


def design(
    study_file: Path = typer.Argument(..., help="The Study A study file whose images (and descriptions) to use."),
    experiment: str = typer.Argument(..., help=EXPERIMENT_HELP),
    out: Path | None = typer.Option(
        None, "--out", help="The experiment folder (default: human/<experiment>/ beside the study file)."
    ),
    seed: int = typer.Option(0, "--seed", help="The seed every random choice of the design is drawn from."),
    per_image: int = typer.Option(20, "--per-image", help="describe: descriptions of each image (and of each mask)."),
    per_participant: int = typer.Option(50, "--per-participant", help="describe: images a participant describes."),
    masks: bool = typer.Option(False, "--masks", help="describe: the study's masks as further conditions."),
    shown: int = typer.Option(5, "--shown", help="rank: the image's own descriptions a trial shows."),
    distractors: int = typer.Option(2, "--distractors", help="rank: descriptions of other images a trial shows."),
    splits: int | None = typer.Option(
        None, "--splits", help="rank: groups of an image's descriptions a participant sees (default: all of them)."
    ),
    participants: int = typer.Option(50, "--participants", help="rank: participants."),
    raters: int = typer.Option(16, "--raters", help="rate: raters."),
    per_rater: int | None = typer.Option(None, "--per-rater", help="rate: pairs a rater rates (default: all)."),
    run_folder: Path | None = typer.Option(
        None, "--run", help="rate: the finished run whose responses are rated (default: the study's output)."
    ),
    attention: float = typer.Option(
        0.05, "--attention", help="Attention checks, as a share of each participant's trials."
    ),
) -> None:
    """Design an experiment and write its folder: design.csv, texts.csv, images/, experiment.json."""
    from vlm_decade.studies.decade.human.design import study_design, study_images, write_experiment
    from vlm_decade.studies.decade.human.experiment import build_experiment

    experiment = _experiment(experiment)
    study = _study_a(study_file)
    counts = {
        "describe": {"per_image": per_image, "per_participant": per_participant, "masks": masks},
        "rank": {"shown": shown, "distractors": distractors, "splits": splits, "participants": participants},
        "rate": {"raters": raters, "per_rater": per_rater},
    }[experiment]
    try:
        built = study_design(study, experiment, {**counts, "attention_rate": attention}, seed, run_folder)
    except ValueError as exc:
        raise InputError([Problem("command line", str(exc))]) from None
    folder = out or _default_folder(study_file, experiment)
    _, files = study_images(study)
    meta = write_experiment(built, files, folder, seed)
    build_experiment(folder)  # index.html, experiment.js, jspsych/: the folder runs as it is
    c = meta["counts"]
    print(
        f"{folder}: {c['participants']} participants, {c['trials']} trials ({c['attention']} attention checks), "
        f"{c['images']} images; experiment {meta['experiment_id']}, completion code {meta['completion_code']}"
    )


def serve(
    folder: Path = typer.Argument(..., help="The experiment folder (written by `vlm-decade human design`)."),
    port: int = typer.Option(8766, "--port", help="Port to listen on (0: any free port).", min=0, max=65535),
) -> None:
    """Run the experiment on 127.0.0.1 for lab sessions, saving each participant's trials in
    data/<participant>.json as they arrive."""
    from vlm_decade.studies.decade.human.serve import create_app
    from vlm_decade.studies.decade.human.serve import serve as run_app
    from vlm_decade.view.app import bind

    app = create_app(folder)
    try:
        sock = bind("127.0.0.1", port)
    except OSError as exc:
        raise InputError(
            [Problem("command line", f"cannot listen on port {port}: {exc.strerror or exc}", field="--port")]
        ) from None
    bound = sock.getsockname()[1]
    # The one line on stdout: the address (tests read the port from it); progress goes to stderr.
    print(f"vlm-decade human serve: http://127.0.0.1:{bound}/?participant=ID ({folder}); Ctrl-C to stop", flush=True)
    try:
        run_app(app, sock)
    except KeyboardInterrupt:
        pass


def import_(
    study_file: Path = typer.Argument(..., help="The Study A study file whose images the data must name."),
    experiment: str = typer.Argument(..., help=EXPERIMENT_HELP),
    data: list[Path] = typer.Argument(
        None, help="jsPsych's JSON or CSV files, JATOS exports, or folders of them (default: the experiment's data/)."
    ),
    folder: Path | None = typer.Option(
        None, "--experiment", help="The experiment folder (default: human/<experiment>/ beside the study file)."
    ),
    out: Path | None = typer.Option(None, "--out", help="Where the tables go (default: the experiment folder)."),
    attention_failures: int = typer.Option(
        0, "--max-attention-failures", help="Exclude a participant failing more attention checks than this."
    ),
    distractor_rate: float = typer.Option(
        0.2,
        "--max-distractor-rate",
        help="rank: exclude a participant choosing distractors in more than this share of trials.",
    ),
    median_rt_ms: float = typer.Option(
        1000.0, "--min-median-rt", help="Exclude a participant whose median response time (ms) is under this."
    ),
    keep_unfinished: bool = typer.Option(False, "--keep-unfinished", help="Keep sessions with no end record."),
    trial_rt_ms: float = typer.Option(
        0.0, "--min-trial-rt", help="Leave out a kept participant's trials answered faster than this (ms)."
    ),
) -> None:
    """Turn the data jsPsych saved into the study's descriptions, votes or ratings table, and participants.csv."""
    from vlm_decade.studies.decade.human.importing import Exclusions, import_experiment

    experiment = _experiment(experiment)
    study = _study_a(study_file)
    folder = folder or _default_folder(study_file, experiment)
    rules = Exclusions(attention_failures, distractor_rate, median_rt_ms, not keep_unfinished, trial_rt_ms)
    written = import_experiment(study, folder, list(data or [folder / "data"]), rules, out or folder)
    field = {"describe": "data.descriptions", "rank": "data.votes", "rate": "data.ratings"}[experiment]
    print(f"{experiment}: {written[experiment]} (name it as {field} in the study file)")
    print(f"participants: {written['participants']}")


def plan(
    study_file: Path = typer.Argument(..., help="The Study A study file whose pilot votes and ratings to read."),
    votes: Path | None = typer.Option(None, "--votes", help="Pilot votes (default: the study's data.votes)."),
    ratings: Path | None = typer.Option(None, "--ratings", help="Pilot ratings (default: the study's data.ratings)."),
    rate: float = typer.Option(0.9, "--rate", help="The gold standard's stability to reach (share of resamples)."),
    half_width: float = typer.Option(0.25, "--half-width", help="The rating CI half-width to reach (scale units)."),
    sizes: str = typer.Option("5,10,20,30,50,75,100", "--sizes", help="Participant counts to try, comma-separated."),
    n_resamples: int = typer.Option(1000, "--resamples", help="Resamples per participant count."),
    seed: int = typer.Option(0, "--seed", help="The seed the resamples are drawn from."),
) -> None:
    """From pilot data: gold stability, Krippendorff's alpha, and the participants a study needs."""
    from rich.table import Table

    from vlm_decade.core.progress import console
    from vlm_decade.studies.decade.human.reliability import gold_stability, needed, ratings_alpha
    from vlm_decade.studies.decade.human.reliability import plan as planned

    study = _study_a(study_file)
    try:
        counts = sorted({int(s) for s in sizes.split(",") if s.strip()})
    except ValueError:
        counts = []
    if not counts or counts[0] < 1:
        raise InputError(
            [Problem("command line", f"--sizes '{sizes}': positive whole numbers, comma-separated", field="--sizes")]
        )
    data, rated = _pilot(study, votes or study.data.votes, ratings or study.data.ratings)
    rows = planned(data, rated, counts, n_resamples=n_resamples, seed=seed, ranking_seed=study.ranking.seed)
    view = Table(title="participants needed (resampling the pilot's participants)")
    for column in ("participants", "gold stability", "rating CI half-width"):
        view.add_column(column, justify="right")
    for r in rows:
        stable = "" if r.gold_stability is None else f"{r.gold_stability:.3f}"
        width = "" if r.rating_half_width is None else f"{r.rating_half_width:.3f}"
        view.add_row(str(r.participants), stable, width)
    console().print(view)
    gold_n, width_n = needed(rows, rate, half_width)
    if data is not None:
        shares = gold_stability(data, n_resamples, seed, study.ranking.seed)
        print(
            f"pilot: {len(data.raters)} ranking participants; gold stability {sum(shares.values()) / len(shares):.3f} "
            f"(lowest image {min(shares.values()):.3f}); >= {rate:g} needs {gold_n or f'more than {counts[-1]}'}"
        )
    if rated:
        print(
            f"pilot: {len({r['rater_id'] for r in rated})} raters; Krippendorff's alpha (interval) "
            f"{ratings_alpha(rated):.3f}; CI half-width <= {half_width:g} needs {width_n or f'more than {counts[-1]}'}"
        )


def _pilot(study, votes: Path | None, ratings: Path | None):
    """The pilot's vote matrices and ratings rows, read and checked as the study reads them."""
    from vlm_decade.core.errors import Problems
    from vlm_decade.core.tables import read_table
    from vlm_decade.studies.decade.data import VOTE_COLUMNS
    from vlm_decade.studies.decade.human.design import study_images
    from vlm_decade.studies.decade.human.reliability import vote_matrices
    from vlm_decade.studies.decade.metric_validation import load_ratings

    if votes is None and ratings is None:
        raise InputError(
            [Problem(STUDY_FILE, "no pilot data: give --votes or --ratings (or data.votes / data.ratings)")]
        )
    images = set(study_images(study)[0])
    data = rated = None
    if votes is not None:
        problems = Problems()
        table = read_table(Path(votes), VOTE_COLUMNS, problems, lists=("shown",))
        problems.raise_if_any()
        own = {}
        for row in _full_descriptions(study):
            own.setdefault(row["image_id"], []).append(row["description_id"])
        data = vote_matrices(table.columns.to_pylist(), own)
    if ratings is not None:
        rated = load_ratings(ratings, [m.name for m in study.models], images).to_pylist()
    return data, rated


def _full_descriptions(study) -> list[dict]:
    from vlm_decade.studies.decade.data import load_study_data

    refs = load_study_data(study.data.model_copy(update={"votes": None}), study.ranking, study.masks).references
    return [r for r in refs.select(["image_id", "description_id", "condition"]).to_pylist() if r["condition"] == "full"]


def commands(app_type: type[typer.Typer]) -> typer.Typer:
    """The `human` group, as an `app_type` (the command line's, whose commands run in its handler)."""
    human = app_type(no_args_is_help=True, help="Design, serve, import and plan the human experiments of Study A.")
    human.command("serve")(serve)
    human.command("design")(design)
    human.command("import")(import_)
    human.command("plan")(plan)
    return human
