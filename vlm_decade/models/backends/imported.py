"""The `imported` backend: descriptions from a CSV or Parquet file, for models that no longer run.

Study A's early captioners (UDC, M2M, OSCAR) cannot be run on current platforms; labs keep their
outputs as files. The file has columns image_id, variant (`full` or a mask id) and text; the model
entry names it with `options: {file: ...}`.

A file may lack some (image, variant) the study asks for: those responses become error rows, and the
statistics compare the model with others only on the images both have. `missing_rows` counts them, so
that `validate` warns (an error with `--strict`) and a run says so before it starts.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

from pydantic import Field

from vlm_decade.core.config import BackendOptions, ModelConfig
from vlm_decade.core.errors import STUDY_FILE, Problem, Problems
from vlm_decade.core.tables import read_table
from vlm_decade.models.backends import Backend, Description, Stimulus

COLUMNS = ("image_id", "variant", "text")


def imported_file(model: ModelConfig) -> Path | None:
    file = model.options.get("file")
    return Path(file) if isinstance(file, str) and file else None


def missing_rows(
    models: Iterable[ModelConfig], image_ids: set[str], variants_of: Callable[[ModelConfig], list[str]]
) -> list[str]:
    """One line per imported model whose file lacks some of the (image, variant) pairs it will be
    asked for, with the counts per variant; none when every file is complete (or unreadable: `check`
    reports those)."""
    lines = []
    for model in models:
        path = imported_file(model)
        if model.backend != "imported" or path is None:
            continue
        table = read_table(path, COLUMNS, Problems())
        if table is None:
            continue
        have = {(r.cells["image_id"], r.cells["variant"]) for r in table.rows if r.cells["text"].strip()}
        variants = variants_of(model)
        lacking = Counter(v for v in variants for i in image_ids if (i, v) not in have)
        if lacking:
            total = len(image_ids) * len(variants)
            counts = ", ".join(f"{v}: {lacking[v]} of {len(image_ids)}" for v in variants if lacking[v])
            lines.append(
                f"model '{model.name}': {path.name} has no description for {sum(lacking.values())} of the {total} "
                f"(image, variant) pairs the study asks for ({counts}); those rows will be errors, and every "
                "comparison with this model uses only the images both sides have"
            )
    return lines


class ImportedBackend(Backend):
    needs_images = False

    class Options(BackendOptions):
        file: str | None = Field(
            None, description="the CSV or Parquet file of descriptions (image_id, variant, text); required"
        )

    def __init__(self, model: ModelConfig):
        super().__init__(model)
        path = imported_file(model)
        problems = Problems()
        table = read_table(path, COLUMNS, problems)
        problems.raise_if_any()
        self.texts = {(r.cells["image_id"], r.cells["variant"]): r.cells["text"] for r in table.rows}
        self.version = f"{path.name}@sha256:{hashlib.sha256(path.read_bytes()).hexdigest()[:12]}"

    def describe(self, batch: list[Stimulus]) -> list[Description]:
        out = []
        for s in batch:
            text = self.texts.get((s.image_id, s.variant))
            if text is None:
                out.append(
                    Description(
                        "", "error", f"no description for ({s.image_id}, {s.variant}) in the file", self.version
                    )
                )
            else:
                out.append(Description(text.strip(), model_version=self.version))
        return out

    @classmethod
    def fingerprint(cls, model: ModelConfig) -> dict:
        """The file's content, not where it lies, decides the answers."""
        settings = super().fingerprint(model)
        path = imported_file(model)
        settings["options"] = {**settings["options"], "file": hashlib.sha256(path.read_bytes()).hexdigest()}
        return settings

    @classmethod
    def check(cls, model: ModelConfig, image_ids: set[str], variants: list[str]) -> list[Problem]:
        """Problems of the file. An empty `image_ids` means the study's images could not be read: the
        file's image ids are then not checked (and that is said once), rather than every row of it
        being called unknown."""
        where = f"models[{model.name}].options.file"
        path = imported_file(model)
        if path is None:
            return [
                Problem(STUDY_FILE, "the imported backend needs options: {file: PATH} (CSV or Parquet)", field=where)
            ]
        problems = Problems()
        table = read_table(path, COLUMNS, problems)
        if table is None:
            return problems.items
        if not image_ids:
            problems.add(path, "image_id not checked: the images table could not be read", field="image_id")
        seen: set[tuple[str, str]] = set()
        for row, rec in ((r.number, r.cells) for r in table.rows):
            key = (rec["image_id"], rec["variant"])
            if image_ids and rec["image_id"] not in image_ids:
                problems.add(path, f"unknown image_id '{rec['image_id']}'", row, "image_id")
            if rec["variant"] not in variants:
                problems.add(
                    path, f"unknown variant '{rec['variant']}' (expected one of {', '.join(variants)})", row, "variant"
                )
            if not (rec["text"] or "").strip():
                problems.add(path, "empty text", row, "text")
            if key in seen:
                problems.add(path, f"duplicate description for image '{key[0]}', variant '{key[1]}'", row, "image_id")
            seen.add(key)
        return problems.items
