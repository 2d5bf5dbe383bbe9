"""The two pages a newcomer reads first name only what exists. In docs/architecture.md and
docs/extending.md: every repository path (`vlm_decade/...`, `tests/...`, `jobs/...`, `benchmarks/...`,
`docs/...`, anywhere outside code blocks), every package path in backticks (`core/runner.py`), every
entry of the tree and every file its descriptions name, and every dotted name of the package in
backticks (`core.runner.Stage`, imported and looked up) exist; and the tree lists every package.
A path with a placeholder (`vlm_decade/studies/<name>/config.py`) needs the folder before it.
docs/models.md's table of the papers' models names registered backends and test files that exist."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "vlm_decade"
DOCS = ("docs/architecture.md", "docs/extending.md")
REPOSITORY = ("vlm_decade", "tests", "jobs", "benchmarks", "docs")
# The package's own modules and packages: the first word of a package path or dotted name.
TOP = {p.stem for p in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
FILE_ENDINGS = (".py", ".html", ".md", ".toml", ".json", ".yaml", ".yml", ".log", ".parquet", ".csv")

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
BACKTICKED = re.compile(r"`([^`\n]+)`")
REPOSITORY_PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(REPOSITORY)})/[\w./<>-]*[\w/>])")
PACKAGE_PATH = re.compile(r"^[\w<>-]+(?:/[\w.<>-]*)*(?:\.py|\.html|/)$|^[\w<>-]+/[\w.<>/-]+$")
DOTTED = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$")
TREE_NAME = re.compile(r"(?<![\w./:-])([\w-]+(?:/[\w-]+)*(?:\.py|\.html|\.md|/))(?![\w/.])")


def text(doc: str) -> str:
    return (ROOT / doc).read_text(encoding="utf-8")


def prose(doc: str) -> str:
    """The page without its code blocks (diagrams, the tree, code samples)."""
    return FENCE.sub("", text(doc))


def exists(path: Path) -> bool:
    """Whether `path` exists; with a placeholder (`<name>`), whether the folder before it does."""
    parts = path.relative_to(ROOT).parts
    placeholder = next((i for i, part in enumerate(parts) if "<" in part), None)
    return (ROOT.joinpath(*parts[:placeholder]).is_dir()) if placeholder is not None else path.exists()


def repository_paths(doc: str) -> set[str]:
    return set(REPOSITORY_PATH.findall(prose(doc)))


def package_paths(doc: str) -> set[str]:
    """Backticked paths inside the package (`core/runner.py`, `cli.py`, `stages/embed/`)."""
    found = set()
    for token in BACKTICKED.findall(prose(doc)):
        first = re.split(r"[/.]", token, maxsplit=1)[0]
        if first in TOP and PACKAGE_PATH.match(token):
            found.add(token)
    return found


def dotted_names(doc: str) -> set[str]:
    """Backticked dotted names of the package (`core.runner.Stage`, `studies.options_reference()`)."""
    found = set()
    for token in BACKTICKED.findall(prose(doc)):
        name = re.sub(r"\(.*\)$", "", token).removeprefix("vlm_decade.")
        if DOTTED.match(name) and name.split(".")[0] in TOP and not name.endswith(FILE_ENDINGS):
            found.add(name)
    return found


def resolves(name: str) -> bool:
    """Import the longest module the name starts with, then look up the rest as attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(["vlm_decade", *parts[:cut]]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def tree(doc: str) -> list[tuple[Path, Path]]:
    """The tree's block: (path, line's folder) for each entry and each file a description names. An
    entry line starts at an even indent below 16 (two spaces a level); the lines below it indented
    further continue its description. A name in a description is relative to the folder the line
    describes, or to the repository when it starts with one of its top folders."""
    (block,) = [b for b in FENCE.findall(text(doc)) if b.splitlines()[1:2] == ["vlm_decade/"]]
    named, stack, folder = [], [], ROOT
    for line in block.splitlines()[1:-1]:
        indent = len(line) - len(line.lstrip())
        if indent < 16:
            entry, _, description = line.strip().partition(" ")
            stack = [*stack[: indent // 2], entry.rstrip("/")]
            path = ROOT.joinpath(*stack)
            folder = path if entry.endswith("/") else path.parent
            named.append((path, folder))
        else:
            description = line
        for name in TREE_NAME.findall(description):
            base = ROOT if name.split("/")[0] in REPOSITORY else folder
            named.append((base / name.rstrip("/"), folder))
    return named


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_the_page_gives_exists(doc):
    paths = repository_paths(doc)
    missing = sorted(p for p in paths if not exists(ROOT / p))
    missing += sorted(p for p in package_paths(doc) if not exists(PACKAGE / p))
    assert not missing, f"{doc} names paths that do not exist: {missing}"
    assert len(paths) >= 5  # the pattern still finds the page's paths


@pytest.mark.parametrize("doc", DOCS)
def test_every_dotted_name_the_page_gives_imports(doc):
    names = dotted_names(doc)
    missing = sorted(n for n in names if not resolves(n))
    assert not missing, f"{doc} names what the package does not have: {missing}"
    assert len(names) >= 5


def test_the_tree_is_true_to_the_package():
    named = tree("docs/architecture.md")
    missing = sorted(str(path.relative_to(ROOT)) for path, _ in named if not path.exists())
    assert not missing, f"docs/architecture.md's tree names what does not exist: {missing}"
    listed = {path for path, _ in named if path.is_dir()}
    packages = {p.parent for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE}
    unlisted = sorted(str(p.relative_to(ROOT)) for p in packages - listed)
    assert not unlisted, f"docs/architecture.md's tree lacks packages: {unlisted}"
    assert len(named) >= 100


def test_the_architecture_page_stays_a_page():
    """The page describes the current state; history lives in git and figures in RESULTS.md."""
    words = len((ROOT / "docs/architecture.md").read_text(encoding="utf-8").split())
    assert 1000 <= words <= 1800


def papers_table() -> list[list[str]]:
    """docs/models.md's table of the papers' models: its rows' cells, the header left out."""
    page = text("docs/models.md")
    block = page.split("<!-- papers -->", 1)[1].split("<!-- /papers -->", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in block.strip().splitlines()]
    return rows[2:]


def test_the_papers_models_name_registered_backends_and_tests_that_exist():
    from vlm_decade.models.backends import BACKENDS

    rows = papers_table()
    assert len(rows) >= 13 + 2 + 9  # Study B's 13 LMMs and two closed-world baselines, Study A's nine
    for row in rows:
        _study, _model, backend, _family, _checkpoint, tests = row
        backends = BACKTICKED.findall(backend)
        assert backends and all(b in BACKENDS.entries for b in backends), row
        named = REPOSITORY_PATH.findall(tests)
        assert tests == "no" or named, row
        missing = [p for p in named if not (ROOT / p).is_file()]
        assert not missing, f"docs/models.md's papers table names tests that do not exist: {missing}"
