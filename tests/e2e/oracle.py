"""The page oracle's parts: a page parsed into a tree of elements as the stdlib's html parser reads
it, the numbers printed in it, a tally that compares each printed number with a value the test
queried itself (at the precision the page prints) and finds the numbers no check read, and the
run's Parquet tables opened in DuckDB for the test's own queries.

Nothing here imports the view or the reports: what a page must print comes from `Tables`."""

from __future__ import annotations

import math
import re
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import duckdb

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}
# A number as the pages print it: an integer (perhaps with thousands commas), a decimal, or a
# mantissa with an exponent ("1.2e-3"); not the digits inside a name (`m1`, `cifar10_00`).
NUMBER = r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e-?\d+)?(?![\w])"
NUMBERS = re.compile(NUMBER)
VALUES = re.compile(f"–|n/a|{NUMBER}")  # what a cell prints for a number: it, or – / n/a for none
MISSING = {"", "–", "n/a"}


class Element:
    """One element of a page: its tag, attributes, children (elements and texts) and whether a check read it."""

    def __init__(self, tag: str, attrs: dict, parent: Element | None):
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[Element | str] = []
        self.checked = False

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else (" " if c.tag == "br" else c.text()) for c in self.children)

    def iter(self, tag: str | None = None, **attrs):
        """Descendants (depth first) with `tag` and `attrs` (`class_`: one of its classes; `data_x`: data-x)."""
        for child in self.children:
            if isinstance(child, Element):
                if child.matches(tag, attrs):
                    yield child
                yield from child.iter(tag, **attrs)

    def matches(self, tag: str | None, attrs: dict) -> bool:
        if tag is not None and self.tag != tag:
            return False
        for name, value in attrs.items():
            if name == "class_":
                if value not in (self.attrs.get("class") or "").split():
                    return False
            elif self.attrs.get(name.replace("_", "-")) != value:
                return False
        return True

    def find(self, tag: str | None = None, **attrs) -> Element | None:
        return next(self.iter(tag, **attrs), None)

    def one(self, tag: str | None = None, **attrs) -> Element:
        found = self.find(tag, **attrs)
        assert found is not None, f"no <{tag} {attrs}> in <{self.tag} {self.attrs}>"
        return found

    def elements(self) -> list[Element]:
        return [c for c in self.children if isinstance(c, Element)]

    def cells(self) -> list[Element]:
        return [c for c in self.elements() if c.tag in ("td", "th")]

    def body(self) -> list[Element]:
        """A table's rows of <td> cells."""
        return [r for r in self.iter("tr") if r.cells() and all(c.tag == "td" for c in r.cells())]

    def head(self) -> list[str]:
        """A table's header texts (its first row of <th>), whitespace squeezed."""
        row = next(r for r in self.iter("tr") if r.cells() and r.cells()[0].tag == "th")
        return [squeeze(c.text()) for c in row.cells()]


class Page(HTMLParser):
    """A page's tree of elements under `root`."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.root = self._open = Element("#document", {}, None)
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        element = Element(tag, dict(attrs), self._open)
        self._open.children.append(element)
        if tag not in VOID:
            self._open = element

    def handle_startendtag(self, tag, attrs):
        self._open.children.append(Element(tag, dict(attrs), self._open))

    def handle_endtag(self, tag):
        open_ = self._open
        while open_.parent is not None and open_.tag != tag:
            open_ = open_.parent
        if open_.parent is not None:
            self._open = open_.parent

    def handle_data(self, data):
        self._open.children.append(data)


def squeeze(text) -> str:
    return " ".join(str(text).split())


def missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def printed(value, token: str) -> bool:
    """Whether `token` is `value` as a page prints it at `token`'s own precision (digits after the
    point, or a mantissa's with its exponent); a missing value prints as –, n/a or nothing."""
    if missing(value):
        return token in MISSING
    if token in MISSING:
        return False
    plain = token.replace(",", "")
    if "e" in plain:
        mantissa, exponent = plain.split("e")
        want_mantissa, want_exponent = f"{float(value):.{len(mantissa.partition('.')[2])}e}".split("e")
        return mantissa == want_mantissa and int(exponent) == int(want_exponent)
    digits = len(plain.partition(".")[2])
    if isinstance(value, int) and not isinstance(value, bool) and digits == 0:
        return plain == str(value)
    return plain == f"{float(value):.{digits}f}"


def p_printed(value, text: str) -> bool:
    """A p or q as the report prints it: digits, or "< bound" at the resampling floor; none, or why
    not ("not tested (< 5 images)") when the tables hold none."""
    text = squeeze(text)
    if missing(value):
        return text in MISSING or text.startswith("not tested")
    if text.startswith("<"):
        return not missing(value) and value <= float(text[1:])
    return printed(value, text)


class Tally:
    """What the checks compared, per kind of page: numbers and pages."""

    def __init__(self):
        self.compared: Counter[str] = Counter()
        self.pages: Counter[str] = Counter()

    def numbers(
        self, kind: str, element: Element, expected: list, where: str = "", words: tuple[str, ...] = ()
    ) -> None:
        """The values printed in `element`, in order, are `expected` (a missing one: –, n/a or
        nothing); `words`: the page's own words in it that hold digits."""
        text = squeeze(element.text())
        for phrase in words:
            text = text.replace(phrase, "")
        shown = VALUES.findall(text)
        if not shown and all(missing(v) for v in expected):
            assert not NUMBERS.findall(text), f"{where}: {text!r} where the tables hold none"
        else:
            assert len(shown) == len(expected), f"{where}: {text!r} printed for {expected}"
            for token, value in zip(shown, expected):
                assert printed(value, token), f"{where}: the page prints {token!r} where the tables hold {value!r}"
        element.checked = True
        self.compared[kind] += sum(not missing(v) for v in expected)

    def text(self, kind: str, element: Element, expected, where: str = "") -> None:
        """`element`'s text is `expected` (whitespace squeezed); the numbers in it count as compared."""
        shown = squeeze(element.text())
        assert shown == squeeze("" if expected is None else expected), (
            f"{where}: the page shows {shown!r} where the tables hold {expected!r}"
        )
        element.checked = True
        self.compared[kind] += len(NUMBERS.findall(shown))

    def page(self, kind: str) -> None:
        self.pages[kind] += 1

    def lines(self) -> list[str]:
        return [f"{kind}: {self.compared[kind]} numbers on {self.pages[kind]} page(s)" for kind in sorted(self.pages)]


def unread(root: Element, literal: tuple[str, ...] = ()) -> list[str]:
    """The texts under `root` holding numbers that no check read, leaving out the page's own words
    in `literal` (such as "95% bootstrap CI")."""
    left = []
    for child in root.children:
        if isinstance(child, str):
            text = squeeze(child)
            for phrase in literal:
                text = text.replace(phrase, "")
            if NUMBERS.search(text):
                left.append(squeeze(child))
        elif not child.checked and child.tag not in ("script", "style"):
            left += unread(child, literal)
    return left


def matches(row: Element, columns: list[str], candidate: dict) -> bool:
    """Whether a table row's cells print `candidate`'s `columns` (None: a cell not compared)."""
    for cell, column in zip(row.cells(), columns):
        if column is None:
            continue
        value, text = candidate[column], squeeze(cell.text())
        if isinstance(value, bool):
            ok = text == str(value)
        elif isinstance(value, str):
            ok = text == squeeze(value)
        elif column in ("p", "q"):
            ok = p_printed(value, text)
        elif missing(value):
            ok = text in MISSING
        else:
            shown = VALUES.findall(text)
            ok = bool(shown) and printed(value, shown[0]) and len(NUMBERS.findall(text)) == 1
        if not ok:
            return False
    return True


def match_rows(
    tally: Tally,
    kind: str,
    table: Element,
    candidates: list[dict],
    columns: list[str],
    every: bool = True,
) -> None:
    """Each body row of `table` prints one of `candidates` (its cells `columns` in order; None: not
    compared), each candidate once; with `every`, every candidate is shown."""
    pool = list(candidates)
    for row in table.body():
        found = next((c for c in pool if matches(row, columns, c)), None)
        shown = " | ".join(squeeze(c.text()) for c in row.cells())
        assert found is not None, f"{kind}: no row of the tables reads {shown!r} ({columns})"
        pool.remove(found)
        row.checked = True
        tally.compared[kind] += sum(
            len(NUMBERS.findall(found[column])) if isinstance(found[column], str) else not missing(found[column])
            for column in columns
            if column is not None and not isinstance(found[column], bool)
        )
    if every:
        assert not pool, f"{kind}: the page leaves out {pool[:3]}"


def headed_tables(root: Element) -> list[tuple[dict[str, str], Element]]:
    """Every table under `root` with the headings above it: {h2: ..., h3: ..., h4: ...}."""
    found, headings = [], {}

    def walk(element: Element):
        for child in element.elements():
            if child.tag in ("h2", "h3", "h4"):
                level = int(child.tag[1])
                headings.update({f"h{level}": squeeze(child.text())})
                for deeper in range(level + 1, 5):
                    headings.pop(f"h{deeper}", None)
            elif child.tag == "table":
                found.append((dict(headings), child))
            else:
                walk(child)

    walk(root)
    return found


def datasets(main: Element, t: Tables, tally: Tally, kind: str) -> None:
    """A page's dataset filter: each dataset with its number of images."""
    counts = {r["dataset"]: r["n"] for r in t.rows("SELECT dataset, count(*) AS n FROM images GROUP BY dataset")}
    options = [o for o in main.one("select", id="f-dataset").iter("option") if o.attrs["value"]]
    assert [o.attrs["value"] for o in options] == sorted(counts)
    for option in options:
        tally.numbers(kind, option, [counts[option.attrs["value"]]], "dataset filter")


def metadata(main: Element, t: Tables, tally: Tally, kind: str, image_id: str) -> None:
    """An image page's metadata: the user's own columns of the images (Study B: labels) table."""
    rows = t.rows("SELECT * FROM metadata WHERE image_id = ?", [image_id]) if t.has("metadata") else []
    own = {k: v for k, v in rows[0].items() if k != "image_id"} if rows else {}
    table = main.find("table", id="metadata")
    assert (table is None) == (not own)
    if table is not None:
        assert table.head() == list(own)
        for cell in table.iter("td"):
            tally.text(kind, cell, own[cell.attrs["data-column"]], f"metadata {cell.attrs['data-column']}")


def image_facts(main: Element, t: Tables, tally: Tally, row: dict) -> None:
    """An image page's size and path (its note) and its metadata; `row`: the image's row."""
    tally.text("image", main.one("p", class_="note"), f"{row['width']} × {row['height']} px · {row['path']}")
    metadata(main, t, tally, "image", row["image_id"])


def model_codes(main: Element, tally: Tally, name: str, config: dict) -> None:
    """A model page's note: the backend and model id the study file gives the model."""
    own = next(m for m in config["models"] if m["name"] == name)
    for code, expected in zip(main.one("p", class_="note").iter("code"), (own["backend"], own.get("model_id"))):
        tally.text("model", code, expected)


def failed(main: Element, t: Tables, tally: Tally, name: str, keys: str, columns: list[str]) -> None:
    """A model page's failed responses: how many, and the first page of them."""
    rows = t.rows(
        f"SELECT * FROM responses WHERE subject = ? AND status <> 'ok' ORDER BY image_id, {keys} LIMIT 100", [name]
    )
    total = t.values("SELECT count(*) FROM responses WHERE subject = ? AND status <> 'ok'", [name])[0]
    tally.numbers("model", main.one("p", id="failed-count"), [total], "failed responses")
    table = main.find("table", id="failed")
    assert (table is None) == (not rows)
    if table is not None:
        match_rows(tally, "model", table, rows, columns)


class Tables:
    """The run folder's Parquet tables as DuckDB views, for the test's own queries."""

    def __init__(self, run: Path):
        self.run = run
        self.connection = duckdb.connect(":memory:")
        for path in sorted(run.glob("*.parquet")):
            self.connection.execute(f"CREATE VIEW \"{path.stem}\" AS SELECT * FROM read_parquet('{path}')")

    def rows(self, sql: str, params: list | tuple = ()) -> list[dict]:
        result = self.connection.execute(sql, list(params))
        names = [d[0] for d in result.description]
        return [dict(zip(names, row)) for row in result.fetchall()]

    def values(self, sql: str, params: list | tuple = ()) -> list:
        return [next(iter(r.values())) for r in self.rows(sql, params)]

    def has(self, table: str) -> bool:
        return (self.run / f"{table}.parquet").is_file()

    def all_images(self, table: str) -> str:
        """The condition of a statistics table's rows about all images (a table without groups has only those)."""
        columns = self.values(f'SELECT column_name FROM (DESCRIBE "{table}")')
        return "group_by IS NULL" if "group_by" in columns else "TRUE"
