"""The package's shape: no module over 600 lines and no function over 100, so that every file can be
read whole and every function at once. A failure names each offender with its size."""

from __future__ import annotations

import ast
from pathlib import Path

import vlm_decade

PACKAGE = Path(vlm_decade.__file__).parent
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 100


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def where(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).as_posix()


def test_no_module_is_over_600_lines():
    long = [f"{where(p)}: {n} lines" for p in modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, "modules over 600 lines:\n" + "\n".join(long)


def test_no_function_is_over_100_lines():
    long = []
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1  # from `def` to its last line, decorators aside
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{where(path)}:{node.lineno} {node.name}: {n} lines")
    assert not long, "functions over 100 lines:\n" + "\n".join(long)
