"""The one `main` behind the `ray job submit` scripts in jobs/: `--config` or `--demo`, `--out`.
Each script names its study; its registration (`studies.registry`) gives its config class, its
demo and, for a file of another study, the script to run it with.

The job's driver joins the cluster that runs it (Ray sets RAY_ADDRESS for submitted jobs) and
alone writes the run folder. Bad input ends with every problem listed and exit status 2; an error of
the environment (a full disk) with what it says and exit status 1; a run that left failed rows with
the per-model summary and exit status 3 (unless `--allow-failures`); as on the command line, never
a traceback for any of them (docs/cli.md).
"""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

from vlm_decade.core.errors import ENVIRONMENT_EXIT, INPUT_EXIT, RUN_FAILED_EXIT, InputError, Problem, os_failure
from vlm_decade.core.progress import counted, problem_lines
from vlm_decade.core.storage import Mirror, is_uri


def job_package(out: Path) -> Path | None:
    """Ray's temporary copy of the working dir this job runs in, when `out` would land inside it
    (`ray job submit --working-dir .` runs the script from such a copy on the head node)."""
    cwd = Path.cwd().resolve()
    if not {"runtime_resources", "working_dir_files"} <= set(cwd.parts):
        return None
    return cwd if out.resolve().is_relative_to(cwd) else None


def _study(kind: str, args):
    from vlm_decade.core.config import output_problems
    from vlm_decade.studies import STUDIES, load_study
    from vlm_decade.studies.registry import resolve

    if args.out is not None and (problems := output_problems(args.out, "--out")):
        raise InputError(problems)
    if args.demo:
        if args.out is not None and is_uri(args.out):
            raise InputError(
                [Problem(args.out, "the demo writes its inputs and run to a local folder: give a path", field="--out")]
            )
        out = Path(args.out) if args.out is not None else Path("runs/demo") / kind
        _refuse_job_package(out)  # before the demo lays out its inputs there
        return resolve(STUDIES[kind].demo)(out)
    study = load_study(args.config, output=args.out)
    if not isinstance(study, STUDIES[kind].config):
        raise InputError(
            [
                Problem(
                    str(args.config),
                    f"a `study: {study.study}` file; run it with {STUDIES[study.study].job}",
                    field="study",
                )
            ]
        )
    if problems := output_problems(study.output):
        raise InputError(problems)
    _refuse_job_package(Path(study.output))
    return study


def _where(output: Path) -> str:
    """Where the run folder is, as the user will look for it."""
    mirror = Mirror.of(Path(output))
    local = f"{Path(output).resolve()} on {socket.gethostname()}"
    return local if mirror is None else f"{mirror.uri} (working copy {local})"


def _refuse_job_package(out: Path) -> None:
    package = job_package(out)
    if package is not None:
        raise InputError(
            [
                Problem(
                    "--out",
                    f"{out} would land inside Ray's temporary copy of the working dir ({package}), "
                    "which the next job or code change replaces; give an absolute path on a disk the head node keeps, "
                    "or shared storage",
                    field="--out",
                )
            ]
        )


def main(kind: str, description: str, argv: list[str] | None = None) -> int:
    """Run a study of `kind` (a registered study's name, `studies.registry`); the exit status."""
    from vlm_decade.core.dispatch import Stalled
    from vlm_decade.core.runfolder import RunFolderBusy
    from vlm_decade.core.runner import run_failures
    from vlm_decade.models.api.session import APIStopped
    from vlm_decade.studies import pipeline_of

    parser = argparse.ArgumentParser(description=description)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", type=Path, help="the study's YAML file")
    source.add_argument("--demo", action="store_true", help="run this study's bundled offline demo")
    parser.add_argument(
        "--out",
        help=f"run folder, a path or an s3:// or gs:// URI (default: the study's `output`, or runs/demo/{kind})",
    )
    parser.add_argument(
        "--allow-failures", action="store_true", help="exit 0 when the run finished with failed rows (else 3)"
    )
    args = parser.parse_args(argv)
    study = None
    try:
        study = _study(kind, args)
        print(f"run folder: {_where(study.output)}", flush=True)
        folder = pipeline_of(study).run(study)
    except InputError as exc:
        exc = exc.located(args.config) if args.config is not None else exc
        print(f"{counted(len(exc.problems), 'problem')} in the input; nothing was run or written:", file=sys.stderr)
        for line in problem_lines(exc.problems, every=True):  # a job's log holds every one
            print(line, file=sys.stderr)
        return INPUT_EXIT
    except OSError as exc:
        status, message = os_failure(exc, Path(study.output) if study is not None else None)
        print(message, file=sys.stderr)
        return status
    except MemoryError:
        print("out of memory: give the job more memory, or fewer actors (runtime.actors_per_model)", file=sys.stderr)
        return ENVIRONMENT_EXIT
    except (APIStopped, RunFolderBusy, Stalled) as exc:
        print(f"stopped: {exc}", file=sys.stderr)
        return ENVIRONMENT_EXIT
    failed = run_failures(folder.manifest())
    if failed:
        status = 0 if args.allow_failures else RUN_FAILED_EXIT
        print(f"failed rows, named at the top of the report too; exit status {status}:", file=sys.stderr)
        for failure in failed:
            print(f"  {failure.line()}", file=sys.stderr)
    return 0 if not failed or args.allow_failures else RUN_FAILED_EXIT
