"""The embeddings table across versions: a table written before the `mode` column existed is
reused with the column empty, beside new rows that carry the mode that bought them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from vlm_decade.core.config import EncoderConfig
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.models.encoders import text_key
from vlm_decade.stages.embed import EMBEDDINGS_SCHEMA, _rows, _write_selected, encoder_key


def test_a_table_without_the_mode_column_is_reused_with_it_empty(tmp_path):
    cfg = EncoderConfig(name="GPT-SI", backend="openai-embedding", model_id="text-embedding-3-large")
    old_text, new_text = "a cat on a mat", "a dog in the park"
    old_vector, new_vector = np.arange(4, dtype=np.float32), np.ones(4, dtype=np.float32)
    old = _rows([text_key(old_text)], old_vector[None], cfg).drop_columns(["mode"])  # as an earlier version wrote it
    folder = RunFolder(tmp_path)
    fingerprint, record = folder.write("embeddings", old)
    folder.save_manifest({"tables": {"embeddings": fingerprint}, "files": {"embeddings": record}})
    folder.append_part("embeddings", _rows([text_key(new_text)], new_vector[None], cfg, ["batch"]))
    wanted = pa.chunked_array([sorted([text_key(old_text), text_key(new_text)])], pa.string())

    _write_selected(folder, wanted, [cfg])

    table = folder.read("embeddings")
    assert table.schema.equals(EMBEDDINGS_SCHEMA)
    rows = {r["text_sha256"]: r for r in table.to_pylist()}
    assert rows[text_key(old_text)]["mode"] is None and rows[text_key(new_text)]["mode"] == "batch"
    assert (
        rows[text_key(old_text)]["vector"] == old_vector.tolist()
        and rows[text_key(new_text)]["vector"] == new_vector.tolist()
    )
    assert {r["encoder_key"] for r in rows.values()} == {encoder_key(cfg)}
