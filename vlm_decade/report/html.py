"""The report page's parts: its head and style, tables from Arrow, the CSV copies and their links."""

from __future__ import annotations

import html
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv

from vlm_decade.core.runfolder import atomic_write_bytes

STYLE = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:13px;margin:0.5em 0 1.5em}th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f3f3f3}.demo{background:#fff3cd;border:1px solid #e0b400;padding:0.8em 1em;border-radius:4px}
.note{color:#555;font-size:14px}img{max-width:100%}
"""


def page_start(title: str, heading: str, style: str = STYLE) -> str:
    """The page up to and including its first heading."""
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body><h1>{html.escape(heading)}</h1>"
    )


def html_table(table: pa.Table, columns: list[str], formats: dict | None = None) -> str:
    """`columns` of `table` as an HTML table; `formats[column](value, row)` gives a cell's text
    (floats default to three decimals, nulls to an empty cell)."""
    formats = formats or {}
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = []
    for row in table.select(columns).to_pylist():
        cells = []
        for c in columns:
            value = row[c]
            if c in formats:
                text = formats[c](value, row)
            else:  # a null (an estimate a budget stop left out) is an empty cell
                text = "" if value is None else (f"{value:.3f}" if isinstance(value, float) else str(value))
            cells.append(f"<td>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def write_csv(table: pa.Table, path: Path) -> None:
    sink = pa.BufferOutputStream()
    pacsv.write_csv(table, sink)
    atomic_write_bytes(path, sink.getvalue().to_pybytes())


def write_csvs(root: Path, tables: dict[str, pa.Table], names: tuple[str, ...]) -> str:
    """Write `tables/<name>.csv` for each name; return the page's closing note that links them."""
    for name in names:
        write_csv(tables[name], root / "tables" / f"{name}.csv")
    return (
        "<p class='note'>Tables: "
        + ", ".join(f"<a href='tables/{n}.csv'>{n}.csv</a>" for n in names)
        + "; the Parquet tables and manifest.json sit beside this page.</p></body></html>"
    )
