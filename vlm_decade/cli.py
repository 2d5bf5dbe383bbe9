"""The `vlm-decade` command line: demo, run, validate, estimate, report, export, view, masks, schema, validate-metric.

Bad input ends with every problem listed (file, row, field) and exit status 2, before anything
is written (a problem on many rows is shown a few times and counted; `validate --all` lists every
one). Every command runs inside one handler (`_handled`), which turns each
expected error into a message and an exit status, never a traceback: 2 for the input (tables, the
study file, a path given on the command line), 1 for the environment (a full disk, too little
memory, a local Ray that would not start); a run that finished with failed rows ends with 3. A run
stopped with Ctrl-C ends with 130, saying what it kept and the command that goes on from there
(docs/cli.md lists them all).
"""

from __future__ import annotations

import functools
import os
import shlex
import sys
from pathlib import Path

import typer

from vlm_decade.cli_human import commands as human_commands
from vlm_decade.core.errors import ENVIRONMENT_EXIT, INPUT_EXIT, RUN_FAILED_EXIT, InputError, Problem, os_failure
from vlm_decade.core.progress import console, counted, problem_lines

# Each stage shows its own progress; the model libraries' loading bars would only interleave with it.
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

err = console()
INTERRUPTED_EXIT = 130  # as a shell reports a command stopped by SIGINT


def _fail(exc: InputError, study_file: Path | None = None, every: bool = False) -> None:
    """Every problem and exit status 2; one problem on many rows is shown a few times and counted
    (`every`: all of them). Nothing is written: a refused command leaves no file behind."""
    if study_file is not None:
        exc = exc.located(study_file)
    shown = problem_lines(exc.problems, every)
    err.print(
        f"[bold red]{counted(len(exc.problems), 'problem')} in the input; nothing was run or written:[/bold red]",
        highlight=False,
    )
    for line in shown:
        err.print(line, highlight=False, markup=False)
    if len(shown) < len(exc.problems):
        listing = f"vlm-decade validate {shlex.quote(str(study_file))} --all" if study_file else "validate --all"
        err.print(f"every one of them: {listing}", highlight=False, markup=False)
    raise typer.Exit(INPUT_EXIT)


def _exit(status: int, message: str) -> None:
    err.print(
        f"[bold red]{'error in the input' if status == INPUT_EXIT else 'stopped'}:[/bold red] {message}",
        highlight=False,
    )
    raise typer.Exit(status)


def _handled(command):
    """The one top-level handler: a command's expected errors become a message and an exit status."""

    @functools.wraps(command)
    def handled(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except InputError as exc:
            _fail(exc, kwargs.get("study_file"))
        except OSError as exc:  # a path that cannot be used, a full disk
            _exit(*os_failure(exc))
        except MemoryError:
            _exit(
                ENVIRONMENT_EXIT, "out of memory: give the run more memory, or fewer actors (runtime.actors_per_model)"
            )
        except Exception as exc:
            from vlm_decade.core.runtime import RayStartFailed  # imported here: it loads the config models

            if not isinstance(exc, RayStartFailed):
                raise
            _exit(ENVIRONMENT_EXIT, str(exc))

    return handled


class _Commands(typer.Typer):
    """A typer app whose every command runs inside `_handled`."""

    def command(self, *args, **kwargs):
        register = super().command(*args, **kwargs)
        return lambda function: register(_handled(function))


# An unexpected error's traceback: rich's boxed one on a terminal; in a log or a pipe, Python's plain
# one (rich would draw it 80 columns wide, breaking paths and lines mid-word).
app = _Commands(
    add_completion=False,
    no_args_is_help=True,
    help="Measure vision-language models against people.",
    pretty_exceptions_enable=sys.stderr.isatty(),
)


def _say_version(asked: bool) -> None:
    if asked:
        from vlm_decade import __version__

        print(f"vlm-decade {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False, "--version", callback=_say_version, is_eager=True, help="Print the version and exit."
    ),
    verbose: bool = typer.Option(
        False, "--verbose", help="Show Ray's own lines (its warnings, its workers' output) as Ray prints them."
    ),
) -> None:
    """Measure vision-language models against people."""
    if verbose:  # read where Ray starts; otherwise those lines go to the run folder's logs/ray.log
        from vlm_decade.core.runtime import VERBOSE_ENV

        os.environ[VERBOSE_ENV] = "1"


def _load(
    study_file: Path,
    out: str | None,
    address: str | None,
    cache_dir: Path | None = None,
    wait: bool = True,
    limit: int | None = None,
):
    """The study, with the command line's overrides (its run folder, `--out` or `output`, checked
    alike by `load_study`; a smoke run's `limit`, whose run folder is by default the study's with
    `-smokeN` added)."""
    from vlm_decade.studies import load_study

    study = load_study(study_file, output=out)
    if limit is not None:
        if out is None:
            study = load_study(study_file, output=_smoke_output(study, limit))
        study = study.model_copy(update={"limit": limit})
    if address:
        study = study.model_copy(update={"runtime": study.runtime.model_copy(update={"address": address})})
    if not wait:
        study = study.model_copy(update={"providers": study.providers.model_copy(update={"batch_wait": False})})
    return _with_cache_dir(study, cache_dir)


def _smoke_output(study, limit: int) -> str:
    """The default run folder of a smoke run of `study`: its own (a path, or the URI of a bucket's)
    named `-smokeN`."""
    from vlm_decade.core.smoke import smoke_folder
    from vlm_decade.core.storage import Mirror

    mirror = Mirror.of(study.output)
    return smoke_folder(mirror.uri if mirror is not None else str(Path(study.output).absolute()), limit)


def _with_cache_dir(study, cache_dir: Path | None):
    if cache_dir is None:
        return study
    providers = study.providers.model_copy(update={"cache_dir": cache_dir.resolve()})
    return study.model_copy(update={"providers": providers})


CACHE_DIR_HELP = (
    "API response cache shared across runs (default: the study's providers.cache_dir, else ~/.cache/vlm_decade/api)."
)


def _run(study) -> list:
    """Run a study of either kind; an API stage that stopped (a budget reached, a provider
    refusing) says why. Returns the failed rows the run left (`core.runner.Failed`)."""
    from vlm_decade.core.dispatch import Stalled
    from vlm_decade.core.runfolder import RunFolderBusy
    from vlm_decade.core.runner import run_failures
    from vlm_decade.models.api.session import APIStopped, BatchesPending
    from vlm_decade.studies import pipeline_of

    try:
        folder = pipeline_of(study).run(study)
    except BatchesPending as exc:  # submitted, not finished: the stages after wait for a later run
        err.print(
            f"[yellow]waiting for batches:[/yellow] {exc}; the stages that need them did not start", highlight=False
        )
        return []
    except (APIStopped, RunFolderBusy, Stalled) as exc:
        err.print(f"[bold red]stopped:[/bold red] {exc}", highlight=False)
        _say_unfinished(study.output)
        raise typer.Exit(1) from None
    except OSError as exc:  # the run folder is known here: a full disk says what it kept
        _exit(*os_failure(exc, Path(study.output)))
    except KeyboardInterrupt:
        _say_interrupted(Path(study.output))
        raise typer.Exit(INTERRUPTED_EXIT) from None
    failed = run_failures(folder.manifest())
    # Failed rows are said once, after the report (`_end`); here only the others (skipped).
    _say_unfinished(study.output, frozenset({"error"}) if failed else frozenset())
    return failed


ALLOW_FAILURES_HELP = "Exit 0 even when a model or stage left failed rows (else exit status 3, docs/cli.md)."


def _end(failed: list, allow_failures: bool) -> None:
    """After the report: per model its failed rows and most common error; exit status 3 unless allowed."""
    if not failed:
        return
    status = "exit status 0 (--allow-failures)" if allow_failures else f"exit status {RUN_FAILED_EXIT}"
    err.print(
        f"[bold red]failed rows[/bold red] (the next run retries just these), named at the top of the report too; "
        f"{status}:",
        highlight=False,
    )
    for failure in failed:
        err.print(f"  {failure.line()}", highlight=False, markup=False)
    if not allow_failures:
        raise typer.Exit(RUN_FAILED_EXIT)


def _say_interrupted(run_dir: Path) -> None:
    """A run stopped with Ctrl-C: what it kept (`studies.status.kept_lines`) and the command that
    goes on from there."""
    from vlm_decade.studies.status import kept_lines

    err.print("[bold yellow]stopped (Ctrl-C)[/bold yellow]", highlight=False)
    for line in kept_lines(run_dir):
        err.print(line, highlight=False, markup=False)
    err.print(f"to go on from there: vlm-decade {shlex.join(sys.argv[1:])}", highlight=False, markup=False)


def _say_unfinished(run_dir: Path, left_out: frozenset[str] = frozenset()) -> None:
    """The run's last lines: the rows it left unfinished (`studies.status.unfinished_lines`), but for
    those whose status is in `left_out`."""
    from vlm_decade.studies.status import unfinished_lines

    lines = unfinished_lines(run_dir, left_out)
    if lines:
        err.print("[yellow]rows not finished (the next run retries just these):[/yellow]", highlight=False)
        for line in lines:
            err.print(line, highlight=False, markup=False)


def _checked(study_file: Path, cache_dir: Path | None = None):
    """The study and its checked data, or every problem and exit status 2."""
    from vlm_decade.studies import pipeline_of

    study = _load(study_file, None, None, cache_dir)
    return study, pipeline_of(study).check(study)


@app.command()
def run(
    study_file: Path = typer.Argument(..., help="The study's YAML file."),
    out: str | None = typer.Option(
        None, "--out", help="Run folder, a path or an s3:// or gs:// URI (default: the study's `output`)."
    ),
    address: str | None = typer.Option(
        None, "--address", help="Ray cluster to join (default: RAY_ADDRESS, else a local Ray)."
    ),
    cache_dir: Path | None = typer.Option(None, "--cache-dir", help=CACHE_DIR_HELP),
    rehash: bool = typer.Option(
        False,
        "--rehash",
        help="Read and hash every image and table file again, instead of trusting the run folder's record of unchanged files.",
    ),
    wait: bool = typer.Option(
        True,
        "--wait/--no-wait",
        help="Batch mode: wait for the batches, or submit them and exit (a later run collects).",
    ),
    limit: int | None = typer.Option(
        None,
        "--limit",
        min=1,
        help="A smoke run: only the first N images of each dataset, into its own run folder (default: the "
        "study's with -smokeN added), marked as one in the manifest, the report and `status`.",
    ),
    allow_failures: bool = typer.Option(False, "--allow-failures", help=ALLOW_FAILURES_HELP),
) -> None:
    """Run a study; re-running resumes and skips every unchanged stage."""
    study = _load(study_file, out, address, cache_dir, wait=wait, limit=limit)
    if rehash:
        study = study.model_copy(update={"runtime": study.runtime.model_copy(update={"rehash": True})})
    _end(_run(study), allow_failures)


@app.command()
def estimate(
    study_file: Path = typer.Argument(..., help="The study's YAML file."),
    cache_dir: Path | None = typer.Option(None, "--cache-dir", help=CACHE_DIR_HELP),
) -> None:
    """Print the API requests, tokens and dollars a study would take, before spending any."""
    from vlm_decade.studies import pipeline_of
    from vlm_decade.studies.estimate import render

    study, data = _checked(study_file, cache_dir)
    print(render(study, *pipeline_of(study).estimate(study, data)))


@app.command()
def validate(
    study_file: Path = typer.Argument(..., help="The study's YAML file."),
    strict: bool = typer.Option(
        False, "--strict", help="Warnings (e.g. an imported file lacking rows) are errors: exit status 2."
    ),
    every: bool = typer.Option(
        False,
        "--all",
        help="List every problem (by default one problem on many rows is shown a few times and counted).",
    ),
) -> None:
    """Check the config and the data and report every problem at once; runs nothing."""
    from vlm_decade.studies import pipeline_of

    try:
        study, data = _checked(study_file)
    except InputError as exc:
        _fail(exc, study_file, every)
    text, warnings = pipeline_of(study).summary(study, data)
    if strict and warnings:
        _fail(
            InputError([Problem(str(study_file), f"(--strict) {warning}") for warning in warnings]), study_file, every
        )
    for warning in warnings:
        err.print(f"[yellow]{warning}[/yellow]", highlight=False)
    err.print(f"[green]ok[/green] {study_file}: {text}", highlight=False)


@app.command()
def demo(
    out: str = typer.Option("runs/demo", "--out", help="Run folder (a local path)."),
    cache_dir: Path | None = typer.Option(None, "--cache-dir", help=CACHE_DIR_HELP),
    allow_failures: bool = typer.Option(False, "--allow-failures", help=ALLOW_FAILURES_HELP),
) -> None:
    """Run both bundled offline demo studies: Study A into OUT/decade, Study B into OUT/openworld."""
    from vlm_decade.core.config import output_problems
    from vlm_decade.core.storage import is_uri
    from vlm_decade.demo import demo_studies, drop_unkeyed

    if is_uri(out):
        raise InputError(
            [Problem(out, "the demo writes its inputs and runs to a local folder: give a path", field="--out")]
        )
    problems = output_problems(out, "--out")
    if problems:
        raise InputError(problems)
    out = Path(out)
    # The demo runs offline: API models whose key is missing are left out, and it says so.
    studies = [drop_unkeyed(_with_cache_dir(s, cache_dir)) for s in demo_studies(out)]
    failed = []
    for study, notes in studies:
        for note in notes:
            err.print(f"[yellow]{note}[/yellow]", highlight=False)
        failed += _run(study)
    _end(failed, allow_failures)


RUN_DIR_HELP = "A run folder: a path, or the s3:// or gs:// URI a run wrote to."


@app.command()
def report(run_dir: str = typer.Argument(..., help=RUN_DIR_HELP)) -> None:
    """Write report.html again from a run folder's tables."""
    from vlm_decade.core.runfolder import open_run_folder
    from vlm_decade.studies import pipeline_of, recorded_study

    folder, manifest = open_run_folder(run_dir)
    study = recorded_study(manifest, str(folder.manifest_path))
    missing = pipeline_of(study).redraw_report(folder, study)
    if missing:
        err.print(f"[red]{run_dir}: tables missing: {', '.join(missing)}; run the study first[/red]")
        raise typer.Exit(INPUT_EXIT)
    if folder.mirror is not None:
        folder.mirror.push()
    # As `run` says it: a folder's absolute path, whatever path the command was given.
    where = folder.location if folder.mirror is not None else folder.root.absolute()
    err.print(f"report: {where}/report.html")


@app.command()
def export(
    run_dir: str = typer.Argument(..., help=RUN_DIR_HELP),
    fmt: str = typer.Option("parquet", "--format", help="parquet or csv."),
    out: Path | None = typer.Option(
        None, "--out", help="The file to write (default: <run folder's name>-export.<format> in this folder)."
    ),
) -> None:
    """One tidy table of a run: a row per model x image x variant (Study A) or prompt (Study B), with
    the image's metadata, the response, each metric's score and the error labels or the outcome."""
    from vlm_decade.core.runfolder import open_run_folder
    from vlm_decade.studies import pipeline_of, recorded_study
    from vlm_decade.studies.export import FORMATS, write_export

    if fmt not in FORMATS:
        raise InputError(
            [Problem("command line", f"unknown format '{fmt}'; known: {', '.join(FORMATS)}", field="--format")]
        )
    folder, manifest = open_run_folder(run_dir)
    study = recorded_study(manifest, str(folder.manifest_path))
    table = pipeline_of(study).export(folder, study)
    path = out if out is not None else Path(f"{folder.root.name}-export.{fmt}")
    write_export(table, path, fmt)
    err.print(f"export: {path} ({table.num_rows} rows, {table.num_columns} columns)")


@app.command()
def view(
    run_dir: str = typer.Argument(..., help=RUN_DIR_HELP),
    port: int = typer.Option(8765, "--port", help="Port to listen on (0: any free port).", min=0, max=65535),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on; only this machine by default."),
    allow_host: list[str] = typer.Option([], "--allow-host", help="Another name the viewer answers for (repeatable)."),
) -> None:
    """Look at a run's images and results in the browser: a local web app over its tables."""
    from vlm_decade.view.access import Access
    from vlm_decade.view.app import bind, serve
    from vlm_decade.view.runs import open_run

    run_view = open_run(run_dir)
    try:
        sock = bind(host, port)
    except OSError as exc:
        _fail(
            InputError(
                [Problem("command line", f"cannot listen on {host}:{port}: {exc.strerror or exc}", field="--port")]
            )
        )
    bound_host, bound_port = sock.getsockname()[:2]
    access = Access.bound(bound_host, bound_port, allow_host)
    # The one line on stdout: the address (tests read the port from it).
    address = access.url(bound_host, bound_port)
    print(f"vlm-decade view: {address} ({run_view.kind} run {run_view.root}); Ctrl-C to stop", flush=True)
    try:
        serve(run_view, sock, access)
    except KeyboardInterrupt:
        pass


@app.command()
def status(run_dir: str = typer.Argument(..., help=RUN_DIR_HELP)) -> None:
    """Where a run folder stands: its stages in pipeline order, and per API provider its batches,
    spend and rows."""
    from vlm_decade.core.runfolder import open_run_folder
    from vlm_decade.studies import recorded_study
    from vlm_decade.studies.status import status_lines

    folder, manifest = open_run_folder(run_dir)
    for line in status_lines(folder, manifest, recorded_study(manifest, str(folder.manifest_path))):
        print(line)
    _say_unfinished(folder.root)


@app.command()
def cancel(
    run_dir: str = typer.Argument(..., help=RUN_DIR_HELP),
    provider: str | None = typer.Option(None, "--provider", help="openai or gemini (default: both)."),
) -> None:
    """Cancel the run folder's pending batches. What they answered before the provider stopped them
    is kept (cache, spend); the rest is sent by the next run, in the mode its study then says."""
    from vlm_decade.core.runfolder import RunFolderBusy, open_run_folder
    from vlm_decade.models.api.session import cancel_batches
    from vlm_decade.studies import recorded_study

    if provider not in (None, "openai", "gemini"):
        raise InputError(
            [Problem("command line", f"unknown provider '{provider}'; known: openai, gemini", field="--provider")]
        )
    folder, manifest = open_run_folder(run_dir)
    providers = recorded_study(manifest, str(folder.manifest_path)).providers
    try:
        with folder.lock():  # no run may collect (and resubmit) the batches while they are cancelled
            for name in [provider] if provider else ["openai", "gemini"]:
                done = cancel_batches(providers, folder, name)
                if done is None:
                    print(f"{name}: no batch pending")
                    continue
                print(
                    f"{name}: {done['batches']} batches cancelled; {done['answered']} answers kept, {done['dropped']} requests "
                    "left for the next run"
                    + (f"; {done['unknown']} batches not found in the cache folder" if done["unknown"] else "")
                )
    except RunFolderBusy as exc:
        _exit(1, str(exc))


@app.command()
def masks(
    image: Path = typer.Argument(..., help="An image file."),
    out: Path = typer.Option(..., "--out", help="Folder for the PNGs and masks.json."),
    study_file: Path | None = typer.Option(None, "--study", help="Take the mask settings from this study."),
) -> None:
    """Write an image's masked variants as PNGs, to look at."""
    from vlm_decade.imaging.masks import MaskConfig, write_previews
    from vlm_decade.studies import load_study

    cfg = load_study(study_file).masks if study_file else MaskConfig()
    for path in write_previews(image, out, cfg):
        err.print(str(path))


@app.command()
def schema(
    study: str = typer.Argument("decade", help="decade (Study A) or openworld (Study B)."),
    as_json: bool = typer.Option(False, "--json", help="The JSON Schema instead of the table of fields."),
) -> None:
    """Every field of a study file: its type, default and meaning (docs/study-file.md shows the same)."""
    import json

    from vlm_decade.core.names import did_you_mean
    from vlm_decade.studies import STUDIES, schema_json, schema_markdown

    if study not in STUDIES:
        raise InputError(
            [
                Problem(
                    "command line",
                    f"unknown study '{study}'{did_you_mean(study, STUDIES)}; known: {', '.join(STUDIES)}",
                    field="STUDY",
                )
            ]
        )
    print(json.dumps(schema_json(study), indent=2) if as_json else schema_markdown(study), end="\n" if as_json else "")


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

    from vlm_decade.studies.decade.stsb import run_stsb_check

    table, summary = run_stsb_check(n_resamples=n_resamples)
    view = Table(title="Spearman correlation with STS-B human ratings (95% bootstrap CI)")
    for column in ("metric", "subset", "pairs", "spearman", "CI"):
        view.add_column(column)
    for r in table.to_pylist():
        view.add_row(
            r["label"],
            r["subset"],
            str(r["n_pairs"]),
            f"{r['spearman']:.4f}",
            f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]",
        )
    err.print(view)
    print(json.dumps(summary))


app.add_typer(human_commands(_Commands), name="human")


def main() -> None:  # pragma: no cover - `python -m vlm_decade`
    sys.exit(app())
