"""The `vlm-decade` command line: demo, run, validate, report, masks.

Bad input ends with every problem listed (file, row, field) and exit status 2, before anything
is written.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from .errors import InputError, Problem

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Measure vision-language models against people.")
err = Console(stderr=True)

INPUT_ERROR_EXIT = 2


def _fail(exc: InputError) -> None:
    err.print(f"[bold red]{len(exc.problems)} problem(s) in the input; nothing was run or written:[/bold red]")
    for problem in exc.problems:
        err.print(f"  - {problem}", highlight=False, markup=False)
    raise typer.Exit(INPUT_ERROR_EXIT)


def _load(study_file: Path, out: Optional[Path], address: Optional[str]):
    from .config import load_study

    study = load_study(study_file, output=out)
    if address:
        study = study.model_copy(update={"runtime": study.runtime.model_copy(update={"address": address})})
    return study


@app.command()
def run(
    study_file: Path = typer.Argument(..., help="The study's YAML file."),
    out: Optional[Path] = typer.Option(None, "--out", help="Run folder (default: the study's `output`)."),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster to join (default: RAY_ADDRESS, else a local Ray)."),
) -> None:
    """Run a study; re-running resumes and skips every unchanged stage."""
    from .pipeline import run_study

    try:
        run_study(_load(study_file, out, address))
    except InputError as exc:
        _fail(exc)


@app.command()
def validate(study_file: Path = typer.Argument(..., help="The study's YAML file.")) -> None:
    """Check the config and the data and report every problem at once; runs nothing."""
    from .pipeline import check_study

    try:
        study = _load(study_file, None, None)
        data = check_study(study)
    except InputError as exc:
        _fail(exc)
    datasets = sorted(set(data.images.column("dataset").to_pylist()))
    err.print(
        f"[green]ok[/green] {study_file}: {data.images.num_rows} images in {len(datasets)} datasets "
        f"({', '.join(datasets)}), {data.references.num_rows} human descriptions, {len(study.models)} models; "
        f"gold standard by {', '.join(f'{d}: {m}' for d, m in sorted(data.ranking_method.items()))}"
    )


@app.command()
def demo(
    out: Path = typer.Option(Path("runs/demo"), "--out", help="Run folder."),
) -> None:
    """Run the bundled offline demo study (real photos; human data written for the demo)."""
    from .config import load_study
    from .demo import materialize
    from .pipeline import run_study

    try:
        study_file = materialize(out / "inputs")
        run_study(load_study(study_file, output=out))
    except InputError as exc:
        _fail(exc)


@app.command()
def report(run_dir: Path = typer.Argument(..., help="A run folder.")) -> None:
    """Write report.html again from a run folder's tables."""
    from .config import StudyConfig
    from .report import write_report
    from .runfolder import RunFolder

    run_folder = RunFolder(run_dir)
    manifest = run_folder.manifest()
    if "config" not in manifest:
        _fail(InputError([Problem(str(run_folder.manifest_path), "no run here (manifest.json missing or empty)")]))
    study = StudyConfig.model_validate(manifest["config"])
    names = ("images", "references", "responses", "scores", "stats", "comparisons")
    missing = [n for n in names if not run_folder.has(n)]
    if missing:
        err.print(f"[red]{run_dir}: tables missing: {', '.join(missing)}; run the study first[/red]")
        raise typer.Exit(INPUT_ERROR_EXIT)
    write_report(run_folder, study, {n: run_folder.read(n) for n in names})
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


def main() -> None:  # pragma: no cover - `python -m vlm_decade`
    sys.exit(app())
