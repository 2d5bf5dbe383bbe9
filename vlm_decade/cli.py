"""The `vlm-decade` command line: demo, run, validate, estimate, report, view, masks, schema, validate-metric.

Bad input ends with every problem listed (file, row, field) and exit status 2, before anything
is written. Every command runs inside one handler (`_handled`), which turns each expected error
into a message and an exit status, never a traceback: 2 for the input (tables, the study file, a
path given on the command line), 1 for the environment (a full disk, too little memory).
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from vlm_decade.core.errors import ENVIRONMENT_EXIT, INPUT_EXIT, InputError, Problem, os_failure

# Each stage shows its own progress; the model libraries' loading bars would only interleave with it.
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

err = Console(stderr=True)


def _fail(exc: InputError, study_file: Optional[Path] = None) -> None:
    if study_file is not None:
        exc = exc.located(study_file)
    err.print(f"[bold red]{len(exc.problems)} problem(s) in the input; nothing was run or written:[/bold red]")
    for problem in exc.problems:
        err.print(f"  - {problem}", highlight=False, markup=False)
    raise typer.Exit(INPUT_EXIT)


def _exit(status: int, message: str) -> None:
    err.print(f"[bold red]{'error in the input' if status == INPUT_EXIT else 'stopped'}:[/bold red] {message}", highlight=False)
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
            _exit(ENVIRONMENT_EXIT, "out of memory: give the run more memory, or fewer actors (runtime.actors_per_model)")

    return handled


class _Commands(typer.Typer):
    """A typer app whose every command runs inside `_handled`."""

    def command(self, *args, **kwargs):
        register = super().command(*args, **kwargs)
        return lambda function: register(_handled(function))


app = _Commands(add_completion=False, no_args_is_help=True, help="Measure vision-language models against people.")


def _load(study_file: Path, out: Optional[str], address: Optional[str], cache_dir: Optional[Path] = None, writes: bool = False,
          wait: bool = True):
    """The study, with the command line's overrides; `writes`: its run folder must be writable."""
    from vlm_decade.core.config import output_problems
    from vlm_decade.studies import load_study

    study = load_study(study_file, output=out)
    if address:
        study = study.model_copy(update={"runtime": study.runtime.model_copy(update={"address": address})})
    if writes:
        problems = output_problems(study.output, "--out" if out is not None else "output")
        if problems:
            raise InputError(problems)
    if not wait:
        study = study.model_copy(update={"providers": study.providers.model_copy(update={"batch_wait": False})})
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
    from vlm_decade.core.dispatch import Stalled
    from vlm_decade.core.runfolder import RunFolderBusy
    from vlm_decade.models.api.session import APIStopped, BatchesPending
    from vlm_decade.studies import pipeline_of

    try:
        pipeline_of(study).run(study)
    except BatchesPending as exc:  # submitted, not finished: the stages after wait for a later run
        err.print(f"[yellow]waiting for batches:[/yellow] {exc}; the stages that need them did not start", highlight=False)
        return
    except (APIStopped, RunFolderBusy, Stalled) as exc:
        err.print(f"[bold red]stopped:[/bold red] {exc}", highlight=False)
        _say_unfinished(study.output)
        raise typer.Exit(1)
    except OSError as exc:  # the run folder is known here: a full disk says what it kept
        _exit(*os_failure(exc, Path(study.output)))
    _say_unfinished(study.output)


def _say_unfinished(run_dir: Path) -> None:
    """The run's last lines: per table and model, the rows still not ok (error, skipped) and the
    most common error, read from the run folder's tables (the next run retries just those)."""
    from collections import Counter, defaultdict

    import pyarrow.parquet as pq

    lines = []
    for path in sorted(Path(run_dir).glob("*.parquet")):
        names = pq.read_schema(path).names
        if "status" not in names:
            continue
        counts, errors = defaultdict(Counter), defaultdict(Counter)
        for row in pq.read_table(path, columns=[c for c in ("subject", "status", "error") if c in names]).to_pylist():
            if row["status"] != "ok":
                who = row.get("subject") or "judge"
                counts[who][row["status"]] += 1
                errors[who][row.get("error") or ""] += 1
        for who in sorted(counts):
            said = ", ".join(f"{n} {status}" for status, n in sorted(counts[who].items()))
            lines.append(f"  {path.stem} {who}: {said}; most common: {errors[who].most_common(1)[0][0]}")
    if lines:
        err.print("[yellow]rows not finished (the next run retries just these):[/yellow]", highlight=False)
        for line in lines:
            err.print(line, highlight=False, markup=False)


def _checked(study_file: Path, cache_dir: Optional[Path] = None):
    """The study and its checked data, or every problem and exit status 2."""
    from vlm_decade.studies import pipeline_of

    study = _load(study_file, None, None, cache_dir)
    return study, pipeline_of(study).check(study)


@app.command()
def run(
    study_file: Path = typer.Argument(..., help="The study's YAML file."),
    out: Optional[str] = typer.Option(None, "--out", help="Run folder, a path or an s3:// or gs:// URI (default: the study's `output`)."),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster to join (default: RAY_ADDRESS, else a local Ray)."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help=CACHE_DIR_HELP),
    rehash: bool = typer.Option(False, "--rehash", help="Read and hash every image again, instead of trusting the run folder's record of unchanged files."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Batch mode: wait for the batches, or submit them and exit (a later run collects)."),
) -> None:
    """Run a study; re-running resumes and skips every unchanged stage."""
    study = _load(study_file, out, address, cache_dir, writes=True, wait=wait)
    if rehash:
        study = study.model_copy(update={"runtime": study.runtime.model_copy(update={"rehash": True})})
    _run(study)


@app.command()
def estimate(
    study_file: Path = typer.Argument(..., help="The study's YAML file."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help=CACHE_DIR_HELP),
) -> None:
    """Print the API requests, tokens and dollars a study would take, before spending any."""
    from vlm_decade.stages.estimate import render
    from vlm_decade.studies import pipeline_of

    study, data = _checked(study_file, cache_dir)
    print(render(study, *pipeline_of(study).estimate(study, data)))


@app.command()
def validate(
    study_file: Path = typer.Argument(..., help="The study's YAML file."),
    strict: bool = typer.Option(False, "--strict", help="Warnings (e.g. an imported file lacking rows) are errors: exit status 2."),
) -> None:
    """Check the config and the data and report every problem at once; runs nothing."""
    from vlm_decade.studies import pipeline_of

    study, data = _checked(study_file)
    text, warnings = pipeline_of(study).summary(study, data)
    if strict and warnings:
        _fail(InputError([Problem(str(study_file), f"(--strict) {warning}") for warning in warnings]))
    for warning in warnings:
        err.print(f"[yellow]{warning}[/yellow]", highlight=False)
    err.print(f"[green]ok[/green] {study_file}: {text}", highlight=False)


@app.command()
def demo(
    out: str = typer.Option("runs/demo", "--out", help="Run folder (a local path)."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help=CACHE_DIR_HELP),
) -> None:
    """Run both bundled offline demo studies: Study A into OUT/decade, Study B into OUT/openworld."""
    from vlm_decade.core.config import output_problems
    from vlm_decade.core.storage import is_uri
    from vlm_decade.demo import demo_studies, drop_unkeyed

    if is_uri(out):
        raise InputError([Problem(out, "the demo writes its inputs and runs to a local folder: give a path", field="--out")])
    problems = output_problems(out, "--out")
    if problems:
        raise InputError(problems)
    out = Path(out)
    # The demo runs offline: API models whose key is missing are left out, and it says so.
    studies = [drop_unkeyed(_with_cache_dir(s, cache_dir)) for s in demo_studies(out)]
    for study, notes in studies:
        for note in notes:
            err.print(f"[yellow]{note}[/yellow]", highlight=False)
        _run(study)


def _run_dir(text: str) -> Path:
    """A run folder named on the command line; one in a bucket is first brought into its local
    working copy (`core.storage`)."""
    from vlm_decade.core.storage import Mirror, is_uri, uri_problem, working_copy

    if not is_uri(text):
        return Path(text)
    problem = uri_problem(text)
    if problem is not None:
        raise InputError([Problem(text, problem, field="RUN_DIR")])
    folder = working_copy(text)
    Mirror(folder).pull()
    return folder


RUN_DIR_HELP = "A run folder: a path, or the s3:// or gs:// URI a run wrote to."


@app.command()
def report(run_dir: str = typer.Argument(..., help=RUN_DIR_HELP)) -> None:
    """Write report.html again from a run folder's tables."""
    from pydantic import ValidationError

    from vlm_decade.core.runfolder import RunFolder
    from vlm_decade.studies import config_problems, pipeline_of, study_from_dict

    folder = RunFolder(_run_dir(run_dir))
    where = str(folder.manifest_path)
    try:
        manifest = folder.manifest()
    except (ValueError, UnicodeDecodeError) as exc:  # not JSON: cut short or overwritten
        raise InputError([Problem(where, f"damaged: {exc}")]) from None
    if not isinstance(manifest, dict) or "config" not in manifest:
        raise InputError([Problem(where, "no run here (manifest.json missing, empty or without the study's config)")])
    try:
        study = study_from_dict(manifest["config"])
    except ValidationError as exc:
        raise InputError(config_problems(where, exc)) from None
    except AttributeError:  # `config` is not a mapping
        raise InputError([Problem(where, "damaged: the study's config is not a mapping", field="config")]) from None
    missing = pipeline_of(study).redraw_report(folder, study)
    if missing:
        err.print(f"[red]{run_dir}: tables missing: {', '.join(missing)}; run the study first[/red]")
        raise typer.Exit(INPUT_EXIT)
    if folder.mirror is not None:
        folder.mirror.push()
    err.print(f"report: {folder.location}/report.html")


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

    try:
        run_view = open_run(_run_dir(run_dir))
    except InputError as exc:
        _fail(exc)
    try:
        sock = bind(host, port)
    except OSError as exc:
        _fail(InputError([Problem("command line", f"cannot listen on {host}:{port}: {exc.strerror or exc}", field="--port")]))
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
    """Where a run folder stands: its stages, and per API provider its batches, spend and rows."""
    from vlm_decade.core.runfolder import RunFolder
    from vlm_decade.models.api.batch import run_batches
    from vlm_decade.models.backends import api_provider
    from vlm_decade.stages.describe import response_states

    run_dir = _run_dir(run_dir)
    folder = RunFolder(run_dir)
    manifest = folder.manifest()
    if "config" not in manifest:
        _fail(InputError([Problem(str(run_dir / "manifest.json"), "no run here (manifest.json missing or empty)")]))
    for name, record in manifest.get("stages", {}).items():
        print(f"stage {name:<18} {record['state']}")
    batches = run_batches(run_dir)
    provider_of = {m["name"]: api_provider(m["backend"]) for m in manifest["config"].get("models", [])}
    rows = response_states(folder)
    for provider in sorted(set(manifest.get("spend_usd", {})) | set(batches)):
        counts = ", ".join(_batch_counts(kind, tally) for kind, tally in sorted(batches.get(provider, {}).items())) or "none"
        by_mode = ", ".join(f"{mode} ${usd:.4f}" for mode, usd in manifest.get("spend_by_mode_usd", {}).get(provider, {}).items())
        unresolved = manifest.get("spend_unresolved_usd", {}).get(provider, 0.0)
        print(f"{provider}: batches {counts}; spent ${manifest.get('spend_usd', {}).get(provider, 0.0):.4f}"
              + (f" ({by_mode})" if by_mode else "") + (f", up to ${unresolved:.4f} more in flight or pending" if unresolved else ""))
        for subject in sorted(s for s, p in provider_of.items() if p == provider and s in rows):
            said = ", ".join(f"{n} {state}" for state, n in sorted(rows[subject].items()))
            print(f"  responses {subject}: {rows[subject]['ok']} of {sum(rows[subject].values())} done ({said})")
    _say_unfinished(run_dir)


@app.command()
def cancel(
    run_dir: str = typer.Argument(..., help=RUN_DIR_HELP),
    provider: Optional[str] = typer.Option(None, "--provider", help="openai or gemini (default: both)."),
) -> None:
    """Cancel the run folder's pending batches. What they answered before the provider stopped them
    is kept (cache, spend); the rest is sent by the next run, in the mode its study then says."""
    from vlm_decade.core.config import ProvidersConfig
    from vlm_decade.core.runfolder import RunFolder, RunFolderBusy
    from vlm_decade.models.api.session import cancel_batches

    if provider not in (None, "openai", "gemini"):
        raise InputError([Problem("command line", f"unknown provider '{provider}'; known: openai, gemini", field="--provider")])
    folder = RunFolder(_run_dir(run_dir))
    manifest = folder.manifest()
    if "config" not in manifest:
        _fail(InputError([Problem(str(folder.root / "manifest.json"), "no run here (manifest.json missing or empty)")]))
    providers = ProvidersConfig.model_validate(manifest["config"].get("providers", {}))
    try:
        with folder.lock():  # no run may collect (and resubmit) the batches while they are cancelled
            for name in [provider] if provider else ["openai", "gemini"]:
                done = cancel_batches(providers, folder, name)
                if done is None:
                    print(f"{name}: no batch pending")
                    continue
                print(f"{name}: {done['batches']} batches cancelled; {done['answered']} answers kept, {done['dropped']} requests "
                      "left for the next run" + (f"; {done['unknown']} batches not found in the cache folder" if done["unknown"] else ""))
    except RunFolderBusy as exc:
        _exit(1, str(exc))


def _batch_counts(kind: str, tally) -> str:
    """'2 completed, 1 pending (chat, 40 requests waiting)': one kind of a provider's batches."""
    states = ", ".join(f"{n} {state}" for state, n in sorted(tally.items()) if state != "waiting")
    waiting = f", {tally['waiting']} requests waiting" if tally["waiting"] else ""
    return f"{states} ({'embeddings' if kind == 'embed' else kind}{waiting})"


@app.command()
def masks(
    image: Path = typer.Argument(..., help="An image file."),
    out: Path = typer.Option(..., "--out", help="Folder for the PNGs and masks.json."),
    study_file: Optional[Path] = typer.Option(None, "--study", help="Take the mask settings from this study."),
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

    from vlm_decade.core.config import reference_markdown
    from vlm_decade.studies import STUDIES

    if study not in STUDIES:
        raise InputError([Problem("command line", f"unknown study '{study}'; known: {', '.join(STUDIES)}", field="STUDY")])
    cls = STUDIES[study]
    print(json.dumps(cls.model_json_schema(), indent=2) if as_json else reference_markdown(cls), end="" if not as_json else "\n")


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
        view.add_row(r["label"], r["subset"], str(r["n_pairs"]), f"{r['spearman']:.4f}", f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]")
    Console(stderr=True).print(view)
    print(json.dumps(summary))


def main() -> None:  # pragma: no cover - `python -m vlm_decade`
    sys.exit(app())
