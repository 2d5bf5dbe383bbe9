"""The `imported` backend: descriptions from a CSV or Parquet file, for models that no longer run.

Study A's early captioners (UDC, M2M, OSCAR) cannot be run on current platforms; labs keep their
outputs as files. The file has columns image_id, variant (`full` or a mask id) and text; the model
entry names it with `options: {file: ...}`. An optional `prompt` column (Study B) holds a prompt's
id: that row answers that prompt only; a row with the cell empty, or a file without the column,
answers every prompt (docs/openworld.md).

A file may lack some (image, variant) the study asks for: those responses become error rows, and the
statistics compare the model with others only on the images both have. `missing_rows` counts them, so
that `validate` warns (an error with `--strict`) and a run says so before it starts.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from vlm_decade.core.columns import first_rows, run_starts, stripped
from vlm_decade.core.config import BackendOptions, ModelConfig
from vlm_decade.core.errors import STUDY_FILE, Problem, Problems
from vlm_decade.core.tables import Table, read_table
from vlm_decade.models.backends import Backend, Description, Stimulus

COLUMNS = ("image_id", "variant", "text")
OPTIONAL = ("prompt",)
EVERY_PROMPT = ""  # the prompt cell of a row that answers every prompt


# Within a run (`files_held`), a file is parsed once, not once by each of its readers (its check, what
# it lacks, the plan's keys, the look-up: four times a run), while the files held take up to this
# much; larger ones are read again where needed, so that a million images' files are not held
# beside the descriptions.
HELD_BYTES = 256 * 2**20


class _Held:
    """The files parsed in the current run (none outside `files_held`): by path, size and mtime,
    each as `read_table` gave it, with the problems it found."""

    def __init__(self) -> None:
        self.files: dict[tuple[str, int, int], tuple[Table | None, list[Problem]]] | None = None

    def read(self, path: Path, problems: Problems) -> Table | None:
        """The file's good rows (`read_table`), or None with problems added: parsed once in a run."""
        try:
            stat = path.stat()
        except OSError:
            stat = None  # `read_table` says why
        if self.files is None or stat is None:
            return read_table(path, COLUMNS, problems, OPTIONAL)
        key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
        if key not in self.files:
            found = Problems()
            table = read_table(path, COLUMNS, found, OPTIONAL)
            held = sum(t.columns.nbytes for t, _ in self.files.values() if t is not None)
            if table is None or held + table.columns.nbytes <= HELD_BYTES:
                self.files[key] = (table, found.items)
            problems.extend(found)
            return table
        table, found = self.files[key]
        problems.extend(found)
        return table


_HELD = _Held()


@contextmanager
def files_held() -> Iterator[None]:
    """For the length of a run (a decorator of its function too): each imported file parsed once
    (`HELD_BYTES`)."""
    _HELD.files = {}
    try:
        yield
    finally:
        _HELD.files = None


def imported_file(model: ModelConfig) -> Path | None:
    file = model.options.get("file")
    return Path(file) if isinstance(file, str) and file else None


class FileAnswers:
    """A file's answers as Arrow columns, to look up many questions at once (`texts`) without a
    Python object per row. Where the file repeats a question (an error `check` reports), its last
    row answers. The rows are in image order (a file that is not is sorted once; one that is is kept
    as read), so that a lookup finds its images' rows by binary search: an actor asks a few
    questions at a time, and a scan of the whole file for each batch would make describing an
    imported model quadratic in the images."""

    def __init__(self, table: Table):
        rows = _keys(table).append_column("text", table.columns.column("text"))
        ids = rows.column("image_id")
        in_order = not ids.null_count and (
            len(ids) < 2 or pc.all(pc.less_equal(ids.slice(0, len(ids) - 1), ids.slice(1))).as_py()
        )
        if not in_order:  # a stable sort: an image's rows stay in the file's order; a row of no image answers nothing
            valid = np.flatnonzero(pc.is_valid(ids).to_numpy(zero_copy_only=False))
            by_image = pc.sort_indices(ids.take(pa.array(valid))).to_numpy()
            rows = rows.take(pa.array(valid[by_image]))
        # A file in image order (as most are) is kept as read, not copied.
        self.rows = rows
        ids = self.rows.column("image_id").combine_chunks()
        starts = run_starts(ids)
        # One Python string per image, not per row; Arrow's order of UTF-8 is Python's order of str.
        self.images = ids.take(pa.array(starts, pa.int64())).to_numpy(zero_copy_only=False)
        self.ends = np.append(starts[1:], len(ids)).astype(np.int64)
        self.starts = starts.astype(np.int64)

    def _rows_of(self, image_ids: pa.Array) -> pa.Table:
        """The rows of the images `image_ids`, each image's last first."""
        wanted = pc.unique(image_ids).to_numpy(zero_copy_only=False)
        at = np.searchsorted(self.images, wanted)
        inside = at < len(self.images)
        at, wanted = at[inside], wanted[inside]
        at = at[self.images[at] == wanted]
        # Each image's rows from its last down to its first (the last row answers), on arrays.
        sizes = self.ends[at] - self.starts[at]
        within = np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        return self.rows.take(pa.array(np.repeat(self.ends[at] - 1, sizes) - within, pa.int64()))

    def texts(self, image_ids: pa.Array, variants: pa.Array, prompt_id: str) -> pa.Array:
        """Per question (image_ids[i], variants[i], prompt_id), the file's text (not stripped): its row
        for the prompt, else its row for every prompt; null where none."""
        rows = self._rows_of(image_ids)
        have = pc.binary_join_element_wise(*(rows.column(c) for c in ("image_id", "variant", "prompt")), "\x1f")
        have = have.combine_chunks() if isinstance(have, pa.ChunkedArray) else have
        asked = lambda prompt: pc.binary_join_element_wise(image_ids, variants, prompt, "\x1f")  # noqa: E731
        at = pc.coalesce(pc.index_in(asked(prompt_id), have), pc.index_in(asked(EVERY_PROMPT), have))
        return rows.column("text").take(at).combine_chunks().cast(pa.string())


def _keys(table: Table) -> pa.Table:
    """Each row's (image_id, variant, prompt): the question it answers."""
    cells = {c: table.columns.column(c) for c in ("image_id", "variant")}
    return pa.table(cells | {"prompt": table.text("prompt")})


def _id_array(image_ids) -> pa.Array:
    """A set of image ids (or an Arrow column of them) as an Arrow array, for whole-column checks."""
    if isinstance(image_ids, pa.ChunkedArray | pa.Array):
        return pc.unique(image_ids)
    return pa.array(sorted(image_ids), pa.string())


def _first_rows_of(values: pa.Array, numbers: pa.Array) -> list[tuple[str, int, int]]:
    """(value, how many rows, first row) for each distinct value, sorted by value."""
    counts = pa.table({"value": values, "row": numbers}).group_by("value", use_threads=False)
    counted = counts.aggregate([("row", "count"), ("row", "min")]).sort_by("value")
    return list(zip(*(counted.column(c).to_pylist() for c in ("value", "row_count", "row_min"))))


def answer_key(text: str) -> str:
    """One row's answer, hashed: its part of the response's cache key and model_version."""
    return hashlib.sha256(text.strip().encode()).hexdigest()


def missing_rows(
    models: Iterable[ModelConfig],
    image_ids: set[str] | pa.ChunkedArray,
    variants_of: Callable[[ModelConfig], list[str]],
    prompts: tuple[str, ...] = (EVERY_PROMPT,),
) -> list[str]:
    """One line per imported model whose file lacks some of the (image, variant, prompt) answers it
    will be asked for, with the counts per variant; none when every file is complete (or unreadable:
    `check` reports those)."""
    lines = []
    for model in models:
        path = imported_file(model)
        if model.backend != "imported" or path is None:
            continue
        table = _HELD.read(path, Problems())
        if table is None:
            continue
        ids = _id_array(image_ids)
        keys = _keys(table).filter(pc.invert(pa.array(table.blank("text"))))
        keys = keys.filter(pc.is_in(keys.column("image_id"), value_set=ids))  # the study's images' rows
        variants = variants_of(model)
        lacking = Counter()
        for p in prompts:  # per variant, the images with a row for this prompt, or for every prompt
            rows = keys.filter(pc.is_in(keys.column("prompt"), pa.array([p, EVERY_PROMPT])))
            have = rows.group_by("variant", use_threads=False).aggregate([("image_id", "count_distinct")])
            answered = dict(zip(have.column("variant").to_pylist(), have.column("image_id_count_distinct").to_pylist()))
            for v in variants:
                lacking[v] += len(ids) - answered.get(v, 0)
        if +lacking:
            each = len(ids) * len(prompts)
            counts = ", ".join(f"{v}: {lacking[v]} of {each}" for v in variants if lacking[v])
            asked = "(image, variant)" if prompts == (EVERY_PROMPT,) else "(image, variant, prompt)"
            lines.append(
                f"model '{model.name}': {path.name} has no description for {sum(lacking.values())} of the "
                f"{each * len(variants)} {asked} answers the study asks for ({counts}); those rows will be errors, "
                "and every comparison with this model uses only the images both sides have"
            )
    return lines


class ImportedBackend(Backend):
    needs_images = False
    looks_up = True

    class Options(BackendOptions):
        file: str | None = Field(
            None,
            description="the CSV or Parquet file of descriptions (image_id, variant, text; optional prompt); required",
        )

    def __init__(self, model: ModelConfig):
        super().__init__(model)
        path = imported_file(model)
        problems = Problems()
        table = _HELD.read(path, problems)
        problems.raise_if_any()
        self.answers = FileAnswers(table)
        self.per_prompt = bool(pc.any(pc.not_equal(table.text("prompt"), EVERY_PROMPT)).as_py())
        self.file = path.name

    def answer_rows(self, questions: pa.Table) -> pa.Table:
        """The file looked up a prompt at a time; a question it has no row for is an error row."""
        prompts = questions.column("prompt_id")
        found, places = [], []
        for prompt_id in pc.unique(prompts).to_pylist():
            at = pc.indices_nonzero(pc.equal(prompts, prompt_id))
            image_ids, variants = (questions.column(c).take(at) for c in ("image_id", "variant"))
            found.append(self.answers.texts(image_ids, variants, prompt_id))
            places.append(at.to_numpy())
        in_order = np.argsort(np.concatenate(places)) if places else np.zeros(0, np.int64)
        texts = (pa.concat_arrays(found) if found else pa.array([], pa.string())).take(pa.array(in_order))
        out: dict[str, list] = {"text": [], "status": [], "error": [], "model_version": []}
        asked = zip(*(questions.column(c).to_pylist() for c in ("image_id", "variant", "prompt_id")))
        for (image_id, variant, prompt_id), text in zip(asked, texts.to_pylist()):
            if text is None:
                what = f"({image_id}, {variant}" + (f", prompt {prompt_id})" if self.per_prompt else ")")
                answer = ("", "error", f"no description for {what} in the file", self.file)
            else:  # the row's own hash: rows other than it may change without it
                answer = (text.strip(), "ok", "", f"{self.file}@sha256:{answer_key(text)[:12]}")
            for column, value in zip(out, answer):
                out[column].append(value)
        return pa.table(out, schema=pa.schema([(c, pa.string()) for c in out]))

    def describe(self, batch: list[Stimulus]) -> list[Description]:
        questions = pa.table(
            {c: pa.array([getattr(s, c) for s in batch], pa.string()) for c in ("image_id", "variant", "prompt_id")}
        )
        return [Description(**r) for r in self.answer_rows(questions).to_pylist()]

    @classmethod
    def fingerprint(cls, model: ModelConfig) -> dict:
        """The file's content, not where it lies, decides the answers."""
        settings = super().fingerprint(model)
        path = imported_file(model)
        settings["options"] = {**settings["options"], "file": hashlib.sha256(path.read_bytes()).hexdigest()}
        return settings

    @classmethod
    def key_settings(cls, model: ModelConfig) -> dict:
        """Each response is keyed by its own row, not the whole file (`answers`): adding rows for
        new images, or changing one row, does again only the responses whose rows are new or changed."""
        settings = super().fingerprint(model)
        settings["options"] = {k: v for k, v in settings["options"].items() if k != "file"}
        return settings

    @classmethod
    def answers(cls, model: ModelConfig) -> Callable[[pa.Array, pa.Array, str], pa.Array]:
        """The file's texts, stripped as `answer_rows` gives them. The file is read once, into Arrow
        columns, and looked up a slice of questions at a time."""
        table = _HELD.read(imported_file(model), Problems())  # unreadable: `check` said so
        found = FileAnswers(table) if table is not None else None

        def texts(image_ids: pa.Array, variants: pa.Array, prompt_id: str) -> pa.Array:
            if found is None:
                return pa.nulls(len(image_ids), pa.string())
            return stripped(found.texts(image_ids, variants, prompt_id))

        return texts

    @classmethod
    def check(cls, model: ModelConfig, image_ids: set[str], variants: list[str]) -> list[Problem]:
        """Problems of the file. An empty `image_ids` means the study's images could not be read: the
        file's image ids are then not checked (and that is said once), rather than every row of it
        being called unknown."""
        path = imported_file(model)
        if path is None:
            return [
                Problem(
                    STUDY_FILE,
                    "the imported backend needs options: {file: PATH} (CSV or Parquet)",
                    field="options.file",
                )
            ]
        problems = Problems()
        table = _HELD.read(path, problems)
        if table is None:
            return problems.items
        ids = _id_array(image_ids)
        if not len(ids):
            problems.add(path, "image_id not checked: the images table could not be read", field="image_id")
        # Whole columns are checked; only the rows found bad are looked at one by one.
        keys = _keys(table)
        known = pc.is_in(keys.column("image_id"), value_set=ids).to_numpy(zero_copy_only=False)
        unknown_image = ~known if len(ids) else np.zeros(len(table), bool)
        empty = table.blank("text")
        duplicate = first_rows(keys, np.ones(len(table), bool)) < np.arange(len(table))
        numbers = table.numbers.to_numpy()
        for i in np.flatnonzero(unknown_image | empty | duplicate):
            row = int(numbers[i])
            image_id, variant, prompt = (keys.column(c)[i].as_py() for c in ("image_id", "variant", "prompt"))
            if unknown_image[i]:
                problems.add(path, f"unknown image_id '{image_id}'", row, "image_id")
            if empty[i]:
                problems.add(path, "empty text", row, "text")
            if duplicate[i]:
                prompt = f", prompt '{prompt}'" if prompt else ""
                problems.add(
                    path, f"duplicate description for image '{image_id}', variant '{variant}'{prompt}", row, "image_id"
                )
        other = pc.invert(pc.is_in(keys.column("variant"), value_set=pa.array(variants, pa.string())))
        unknown = _first_rows_of(keys.column("variant").filter(other), table.numbers.filter(other))
        if unknown:
            problems.add(path, _unknown_variants(unknown, variants), min(first for _, _, first in unknown), "variant")
        return problems.items


def _unknown_variants(unknown: list[tuple[str, int, int]], variants: list[str]) -> str:
    """One problem for every row whose variant the study does not have: a file that puts prompt ids
    in the variant column is one mistake, not one per row. `unknown`: (variant, rows, first row)."""
    values = ", ".join(f"'{v}' ({n} rows, first row {first})" for v, n, first in unknown)
    message = f"unknown variant {values}: expected one of {', '.join(variants)}"
    if variants == ["full"]:
        message += (
            "; the variant of an answer to the whole image is 'full': if these are prompt ids, put them in a "
            "`prompt` column (docs/openworld.md)"
        )
    return message


def prompt_problems(models: Iterable[ModelConfig], prompt_ids: list[str]) -> list[Problem]:
    """Prompt ids in imported files' `prompt` columns that the study has not (one problem per file)."""
    problems = Problems()
    for model in models:
        path = imported_file(model)
        if model.backend != "imported" or path is None:
            continue
        table = _HELD.read(path, Problems())  # unreadable: `check` says so
        if table is None:
            continue
        prompts = table.text("prompt")
        other = pc.invert(pc.is_in(prompts, value_set=pa.array([EVERY_PROMPT, *prompt_ids], pa.string())))
        unknown = _first_rows_of(prompts.filter(other), table.numbers.filter(other))
        if unknown:
            values = ", ".join(f"'{p}' ({n} rows, first row {first})" for p, n, first in unknown)
            problems.add(
                path,
                f"unknown prompt {values}: expected one of the study's prompt ids {', '.join(prompt_ids)}",
                min(first for _, _, first in unknown),
                "prompt",
            )
    return problems.items
