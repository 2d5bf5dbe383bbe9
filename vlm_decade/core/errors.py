"""Input problems that name the file, row and field, collected so a user sees them all at once; and
what an error of the machine (a full disk, an unwritable folder) says, with its exit status; and the
one way an exception is said in a row, a file or on the terminal (`error_text`).

Exit status 2 is the user's input (a table, the study file, a path given on the command line), 1 the
environment (a full disk, an I/O error, too little memory), 3 a run that finished with failed rows
(docs/cli.md).
"""

from __future__ import annotations

import errno
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

INPUT_EXIT = 2
ENVIRONMENT_EXIT = 1
RUN_FAILED_EXIT = 3

# Terminal escape sequences: CSI (colours, cursor moves), OSC (titles, links), and the two-byte ones.
_ESCAPES = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[0-~])")


def plain(text: str) -> str:
    """`text` without terminal escape codes (Ray colours its workers' names and tracebacks): what a
    table, a file or a message may hold."""
    return _ESCAPES.sub("", text).replace("\x1b", "")


class RemoteError(Exception):
    """An exception raised in a worker of which only the text came back (Ray keeps the error of an
    actor's creation task as text): the name of its type and its message."""

    def __init__(self, type_name: str, message: str):
        super().__init__(f"{type_name}: {message}" if message else type_name)
        self.type_name, self.message = type_name, message


def error_text(exc: BaseException) -> str:
    """'TheType: the first line of its message', without escape codes: how a failure is said in an
    error row, in the manifest, in the report and on the terminal."""
    name, message = (exc.type_name, exc.message) if isinstance(exc, RemoteError) else (type(exc).__name__, str(exc))
    lines = [line.strip() for line in plain(message).splitlines() if line.strip()]
    return f"{name}: {lines[0]}" if lines else name


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the user's input. `row` is 1-based as a spreadsheet shows it (header = row 1)."""

    file: str
    message: str
    row: int | None = None
    field: str | None = None

    def __str__(self) -> str:
        where = self.file
        if self.row is not None:
            where += f", row {self.row}"
        if self.field is not None:
            where += f", field '{self.field}'"
        return f"{where}: {self.message}"


# Checks that see a study's config but not its file name this `file`; `InputError.located` puts in
# the path of the study file the command line read.
STUDY_FILE = "study file"


class InputError(Exception):
    """Raised with every problem found; the command line prints them and exits with status 2.

    `image_ids`: when a study's images table could be read but had problems, the ids it declares,
    so that checks of the tables and files that refer to images still run against the ids that
    really exist (and do not call every reference "unknown")."""

    def __init__(self, problems: list[Problem], image_ids: set[str] | None = None):
        self.problems = list(problems)
        self.image_ids = image_ids
        super().__init__("\n".join(str(p) for p in self.problems))

    def located(self, study_file) -> InputError:
        """The same problems, with those that name the study file in general naming its path."""
        problems = [
            Problem(str(study_file), p.message, p.row, p.field) if p.file == STUDY_FILE else p for p in self.problems
        ]
        return InputError(problems, self.image_ids)


class Problems:
    """Accumulates problems while a check walks all the input, then raises them together."""

    def __init__(self) -> None:
        self.items: list[Problem] = []

    def add(self, file, message: str, row: int | None = None, field: str | None = None) -> None:
        self.items.append(Problem(str(file), message, row, field))

    def extend(self, other: Problems | list[Problem]) -> None:
        self.items.extend(other.items if isinstance(other, Problems) else other)

    def __bool__(self) -> bool:
        return bool(self.items)

    def raise_if_any(self) -> None:
        if self.items:
            raise InputError(self.items)


# A path the user gave that cannot be used as one: their input (exit 2), named with what is wrong.
_PATH_ERRORS = {
    errno.EEXIST: "exists and is not a folder",
    errno.ENOTDIR: "a part of this path is a file, not a folder",
    errno.EISDIR: "is a folder, not a file",
    errno.ENOENT: "not found",
    errno.EACCES: "permission denied (cannot write here)",
    errno.EPERM: "not permitted",
    errno.EROFS: "is on a read-only file system",
    errno.ENAMETOOLONG: "the name is too long",
}
_FULL = {errno.ENOSPC, errno.EDQUOT}


class StoreError(OSError):
    """An object store (a bucket holding images or a run folder) could not be read or written; the
    message names the URI and what was being done."""


def os_failure(exc: OSError, folder: Path | None = None) -> tuple[int, str]:
    """(exit status, message) for an OSError that ended a command; `folder`: the run folder it was
    writing, if known. A full disk says which folder, how much space is left and what was kept."""
    if isinstance(exc, StoreError):
        return ENVIRONMENT_EXIT, f"{exc}. What was done is kept; run the same command again once the store answers."
    target = exc.filename if exc.filename is not None else folder
    if exc.errno in _FULL or "No space left on device" in str(exc):
        where = Path(folder if folder is not None else Path(str(target)).parent) if target is not None else None
        if where is None:
            return ENVIRONMENT_EXIT, f"no space left on the device: {exc}"
        message = f"no space left on the device holding {where}{_free(where)}"
        if exc.filename is not None:
            message += f", while writing {exc.filename}"
        return (
            ENVIRONMENT_EXIT,
            f"{message}. Kept there: {_kept(where)}. Free some space and run the same command again: it goes on from there.",
        )
    if exc.errno in _PATH_ERRORS and target is not None:
        return INPUT_EXIT, f"{target}: {_PATH_ERRORS[exc.errno]}"
    return ENVIRONMENT_EXIT, f"{target}: {exc.strerror or exc}" if target is not None else str(exc)


def _free(folder: Path) -> str:
    for path in (folder, *folder.parents):
        try:
            return f" ({shutil.disk_usage(path).free / 1e6:,.1f} MB free)"
        except OSError:
            continue
    return ""


def _kept(folder: Path) -> str:
    """What a run folder holds that a re-run will not redo: finished stages and saved batches."""
    from vlm_decade.core.runfolder import RunFolder, kept

    try:
        manifest = RunFolder(folder).manifest()
    except (OSError, ValueError):  # a manifest that is itself damaged
        manifest = {}
    found = kept(folder, manifest)
    done = sorted(found.stages)
    parts = sum(len(files) for files in found.parts.values())
    stages_text = f"{len(done)} finished stage(s)" + (f" ({', '.join(done)})" if done else "")
    return f"{stages_text} and {parts} saved batch(es) of unfinished stages"
