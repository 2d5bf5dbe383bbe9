"""The `vlm-decade` command line: demo, run, validate, estimate, report, masks.

Bad input ends with every problem listed (file, row, field) and exit status 2, before anything
is written.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from .errors import InputError, Problem

# Each stage shows its own progress; the model libraries' loading bars would only interleave with it.
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Measure vision-language models against people.")
err = Console(stderr=True)

INPUT_ERROR_EXIT = 2


def _fail(exc: InputError) -> None:
    err.print(f"[bold red]{len(exc.problems)} problem(s) in the input; nothing was run or written:[/bold red]")
    for problem in exc.problems:
        err.print(f"  - {problem}", highlight=False, markup=False)
    raise typer.Exit(INPUT_ERROR_EXIT)


def _load(study_file: Path, out: Optional[Path], address: Optional[str], cache_dir: Optional[Path] = None):
    from .config import load_study

    study = load_study(study_file, output=out)
    if address:
        study = study.model_copy(update={"runtime": study.runtime.model_copy(update={"address": address})})
    return _with_cache_dir(study, cache_dir)


def _with_cache_dir(study, cache_dir: Optional[Path]):
    if cache_dir is None:
        return study
    providers = study.providers.model_copy(update={"cache_dir": cache_dir.resolve()})
    return study.model_copy(update={"providers": providers})


CACHE_DIR_HELP = "API response cache shared across runs (default: the study's providers.cache_dir, else ~/.cache/vlm_decade/api)."


def _run(study) -> None:
    """Run a study of either kind; an API stage that stopped (a budget reached, a provider
    refusing) says why."""
    from .api.session import APIStopped
    from .config import StudyConfig
    from .openworld.pipeline import run_openworld
    from .pipeline import run_study

    try:
        (run_study if isinstance(study, StudyConfig) else run_openworld)(study)
    except InputError as exc:
        _fail(exc)
    except APIStopped as exc:
        err.print(f"[bold red]stopped:[/bold red] {exc}", highlight=False)
        raise typer.Exit(1)


@app.command()
def run(
    study_file: Path = typer.Argument(..., help="The study's YAML file."),
    out: Optional[Path] = typer.Option(None, "--out", help="Run folder (default: the study's `output`)."),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster to join (default: RAY_ADDRESS, else a local Ray)."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help=CACHE_DIR_HELP),
) -> None:
    """Run a study; re-running resumes and skips every unchanged stage."""
    try:
        study = _load(study_file, out, address, cache_dir)
    except InputError as exc:
        _fail(exc)
    _run(study)


@app.command()
def estimate(
    study_file: Path = typer.Argument(..., help="The study's YAML file."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help=CACHE_DIR_HELP),
) -> None:
    """Print the API requests, tokens and dollars a study would take, before spending any."""
    import pyarrow as pa

    from .api.estimate import estimate as estimate_study
    from .api.estimate import render
    from .config import StudyConfig
    from .openworld.pipeline import check_openworld
    from .pipeline import check_study

    try:
        study = _load(study_file, None, None, cache_dir)
        data = (check_study if isinstance(study, StudyConfig) else check_openworld)(study)
    except InputError as exc:
        _fail(exc)
    references = getattr(data, "references", pa.table({"text": pa.array([], pa.string())}))
    print(render(study, estimate_study(study, data.images, references)))


@app.command()
def validate(study_file: Path = typer.Argument(..., help="The study's YAML file.")) -> None:
    """Check the config and the data and report every problem at once; runs nothing."""
    from .config import StudyConfig
    from .openworld.pipeline import check_openworld
    from .pipeline import check_study

    try:
        study = _load(study_file, None, None)
        data = (check_study if isinstance(study, StudyConfig) else check_openworld)(study)
    except InputError as exc:
        _fail(exc)
    datasets = sorted(set(data.images.column("dataset").to_pylist()))
    if not isinstance(study, StudyConfig):
        from .openworld.judging import judge_unavailable

        no_judge = judge_unavailable(study)
        if no_judge:
            err.print(f"[yellow]LI will be skipped[/yellow]: {no_judge}", highlight=False)
        err.print(
            f"[green]ok[/green] {study_file}: Study B, {data.images.num_rows} labelled images in {len(datasets)} datasets "
            f"({', '.join(f'{d}: {data.granularity[d]}' for d in datasets)}), {len(study.models)} models, {len(study.prompts)} prompts"
        )
        return
    err.print(
        f"[green]ok[/green] {study_file}: {data.images.num_rows} images in {len(datasets)} datasets "
        f"({', '.join(datasets)}), {data.references.num_rows} human descriptions, {len(study.models)} models; "
        f"gold standard by {', '.join(f'{d}: {m}' for d, m in sorted(data.ranking_method.items()))}"
    )


@app.command()
def demo(
    out: Path = typer.Option(Path("runs/demo"), "--out", help="Run folder."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help=CACHE_DIR_HELP),
) -> None:
    """Run both bundled offline demo studies: Study A into OUT/decade, Study B into OUT/openworld."""
    from .api.checks import drop_unkeyed
    from .demo import demo_studies

    try:
        # The demo runs offline: API models whose key is missing are left out, and it says so.
        studies = [drop_unkeyed(_with_cache_dir(s, cache_dir)) for s in demo_studies(out)]
    except InputError as exc:
        _fail(exc)
    for study, notes in studies:
        for note in notes:
            err.print(f"[yellow]{note}[/yellow]", highlight=False)
        _run(study)


@app.command()
def report(run_dir: Path = typer.Argument(..., help="A run folder.")) -> None:
    """Write report.html again from a run folder's tables."""
    from .config import StudyConfig, study_from_dict
    from .openworld.report import REPORT_TABLES as OPENWORLD_TABLES
    from .openworld.report import write_openworld_report
    from .report import OPTIONAL_TABLES, REPORT_TABLES, write_report
    from .runfolder import RunFolder

    run_folder = RunFolder(run_dir)
    manifest = run_folder.manifest()
    if "config" not in manifest:
        _fail(InputError([Problem(str(run_folder.manifest_path), "no run here (manifest.json missing or empty)")]))
    study = study_from_dict(manifest["config"])
    required = REPORT_TABLES if isinstance(study, StudyConfig) else OPENWORLD_TABLES
    missing = [n for n in required if not run_folder.has(n)]
    if missing:
        err.print(f"[red]{run_dir}: tables missing: {', '.join(missing)}; run the study first[/red]")
        raise typer.Exit(INPUT_ERROR_EXIT)
    if isinstance(study, StudyConfig):
        names = list(REPORT_TABLES) + [n for n in OPTIONAL_TABLES if run_folder.has(n)]
        write_report(run_folder, study, {n: run_folder.read(n) for n in names})
    else:
        from .openworld.judging import judge_unavailable

        write_openworld_report(run_folder, study, {n: run_folder.read(n) for n in OPENWORLD_TABLES}, judge_unavailable(study))
    err.print(f"report: {run_dir / 'report.html'}")


@app.command()
def masks(
    image: Path = typer.Argument(..., help="An image file."),
    out: Path = typer.Option(..., "--out", help="Folder for the PNGs and masks.json."),
    study_file: Optional[Path] = typer.Option(None, "--study", help="Take the mask settings from this study."),
) -> None:
    """Write an image's masked variants as PNGs, to look at."""
    from .config import MaskConfig, load_study
    from .masks import write_previews

    try:
        cfg = load_study(study_file).masks if study_file else MaskConfig()
    except InputError as exc:
        _fail(exc)
    if not image.is_file():
        _fail(InputError([Problem(str(image), "no such image file")]))
    for path in write_previews(image, out, cfg):
        err.print(str(path))


@app.command("validate-metric")
def validate_metric(
    n_resamples: int = typer.Option(2000, "--resamples", help="Bootstrap resamples over sentence pairs."),
) -> None:
    """Check the offline metrics against people: Spearman with STS-B's human similarity ratings.

    Runs SBERT-SI and BERTScore (the packaged all-MiniLM-L6-v2) through the same metric code the
    studies use, on the STS-B test split and its photo-caption pairs; the last line is JSON.
    """
    import json

    from rich.table import Table

    from .stsb import run_stsb_check

    table, summary = run_stsb_check(n_resamples=n_resamples)
    view = Table(title="Spearman correlation with STS-B human ratings (95% bootstrap CI)")
    for column in ("metric", "subset", "pairs", "spearman", "CI"):
        view.add_column(column)
    for r in table.to_pylist():
        view.add_row(r["label"], r["subset"], str(r["n_pairs"]), f"{r['spearman']:.4f}", f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]")
    Console(stderr=True).print(view)
    print(json.dumps(summary))


def main() -> None:  # pragma: no cover - `python -m vlm_decade`
    sys.exit(app())
