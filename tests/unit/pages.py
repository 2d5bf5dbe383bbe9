"""A written page read back as a browser reads it, and a value that is markup if a page fails to escape it."""

from __future__ import annotations

from html.parser import HTMLParser

PAYLOAD = "<script>alert('1 & \"2\"')</script>"


class Page(HTMLParser):
    """A page as a browser reads it: every tag with its attributes, and the text under each <h2>
    ("" for the text before the first), the style sheet left out."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.sections: dict[str, str] = {"": ""}
        self._heading: str | None = None
        self._section = ""
        self.feed(str(text))
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "h2":
            self._heading = ""

    def handle_endtag(self, tag):
        if tag == "h2":
            self._section, self._heading = self._heading, None
            self.sections[self._section] = ""

    def handle_data(self, data):
        if self.tags and self.tags[-1][0] == "style":
            return
        if self._heading is not None:
            self._heading += data
        else:
            self.sections[self._section] += data
