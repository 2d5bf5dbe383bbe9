"""The `imported` backend: descriptions from a CSV or Parquet file, for models that no longer run.

Study A's early captioners (UDC, M2M, OSCAR) cannot be run on current platforms; labs keep their
outputs as files. The file has columns image_id, variant (`full` or a mask id) and text; the model
entry names it with `options: {file: ...}`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from vlm_decade.core.config import ModelConfig
from vlm_decade.core.errors import Problem, Problems
from vlm_decade.core.tables import read_table
from vlm_decade.models.backends import Backend, Description, Stimulus

COLUMNS = ("image_id", "variant", "text")


def imported_file(model: ModelConfig) -> Path | None:
    file = model.options.get("file")
    return Path(file) if file else None


class ImportedBackend(Backend):
    needs_images = False

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
                out.append(Description("", "error", f"no description for ({s.image_id}, {s.variant}) in the file", self.version))
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
        path = imported_file(model)
        where = f"models[{model.name}].options.file"
        if path is None:
            return [Problem(where, "the imported backend needs options: {file: PATH} (CSV or Parquet)")]
        problems = Problems()
        table = read_table(path, COLUMNS, problems)
        if table is None:
            return problems.items
        seen: set[tuple[str, str]] = set()
        for row, rec in ((r.number, r.cells) for r in table.rows):
            key = (rec["image_id"], rec["variant"])
            if rec["image_id"] not in image_ids:
                problems.add(path, f"unknown image_id '{rec['image_id']}'", row, "image_id")
            if rec["variant"] not in variants:
                problems.add(path, f"unknown variant '{rec['variant']}' (expected one of {', '.join(variants)})", row, "variant")
            if not (rec["text"] or "").strip():
                problems.add(path, "empty text", row, "text")
            if key in seen:
                problems.add(path, f"duplicate description for image '{key[0]}', variant '{key[1]}'", row, "image_id")
            seen.add(key)
        return problems.items
