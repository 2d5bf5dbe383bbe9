"""Input problems that name the file, row and field, collected so a user sees them all at once."""

from __future__ import annotations

from dataclasses import dataclass


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

    def located(self, study_file) -> "InputError":
        """The same problems, with those that name the study file in general naming its path."""
        problems = [Problem(str(study_file), p.message, p.row, p.field) if p.file == STUDY_FILE else p for p in self.problems]
        return InputError(problems, self.image_ids)


class Problems:
    """Accumulates problems while a check walks all the input, then raises them together."""

    def __init__(self) -> None:
        self.items: list[Problem] = []

    def add(self, file, message: str, row: int | None = None, field: str | None = None) -> None:
        self.items.append(Problem(str(file), message, row, field))

    def extend(self, other: "Problems | list[Problem]") -> None:
        self.items.extend(other.items if isinstance(other, Problems) else other)

    def __bool__(self) -> bool:
        return bool(self.items)

    def raise_if_any(self) -> None:
        if self.items:
            raise InputError(self.items)
