"""The report's document model and its two renderers: the same table in Markdown and in HTML,
escaped for each, with nothing of one format leaking into the other."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from pytest_satbench.report import html, markdown
from pytest_satbench.report.document import (
    Card,
    Cell,
    Code,
    Column,
    Document,
    Figure,
    Gallery,
    Heading,
    Paragraph,
    Preformatted,
    Table,
    Thumbnail,
    cell,
    rich,
)

HOSTILE = "a | b <script>alert(1)</script> & `tick`"


def _doc() -> Document:
    doc = Document("title <b>")
    doc.add(
        Heading(1, rich("bench — ", Code("tag|x"))),
        Paragraph(rich("arms: ", Code("tok48"), ", ", Code("jpeg:q10"), ".")),
        Table(
            (Column(rich("question")), Column(rich("gate")), Column(rich("n"), "numeric"), Column(rich(Code("tok48")), "numeric")),
            (
                (cell(HOSTILE), cell("PASS", "pass"), cell("12"), cell("81.2% [78.1-84.0]")),
                (cell("two\nlines"), cell("FAIL", "fail"), cell("-"), cell(Code("x|y"))),
            ),
        ),
        Preformatted(("type   n  orig", "count  3  100.0")),
        Figure('<svg xmlns="http://www.w3.org/2000/svg"><text>plot</text></svg>'),
        Gallery((Card("k1", "count", "how many <cars>?", "3", (
            Thumbnail("orig", "3", True, "QUJD"), Thumbnail("tok48", "<img src=x onerror=alert(1)>", False, None, "reconstruction not kept"),
        )),)),
    )
    return doc


def _md_cells(line: str) -> list[str]:
    """A GFM table row split the way GFM does: on every `|` not escaped by a backslash."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def test_markdown_table_escapes_and_aligns() -> None:
    md = markdown.to_markdown(_doc())
    lines = md.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| question"))
    assert lines[header + 1] == "|---|---|---:|---:|"  # numeric columns right-aligned
    row = _md_cells(lines[header + 2])
    assert len(row) == 4  # the `|` in the question did not split the cell
    assert row[0] == r"a \| b \<script>alert(1)\</script> & \`tick\`"
    assert row[1:] == ["PASS", "12", "81.2% [78.1-84.0]"]
    second = _md_cells(lines[header + 3])
    assert second == ["two lines", "FAIL", "-", r"`x\|y`"]  # a newline never ends the row
    assert not re.search(r"(?<!\\)<", md)  # no tag a Markdown renderer would pass on as HTML
    # a code span holding a `|` in a heading (not a table): no backslash needed there
    assert lines[0] == "# bench — `tag|x`"
    assert "```\ntype   n  orig\ncount  3  100.0\n```" in md


def test_markdown_skips_html_only_blocks() -> None:
    md = markdown.to_markdown(_doc())
    assert "<svg" not in md and "QUJD" not in md and "reconstruction not kept" not in md


def test_code_span_with_backticks_gets_a_longer_fence() -> None:
    md = markdown.to_markdown(Document("t", [Paragraph(rich(Code("a `b` c"), " and ", Code("`x")))]))
    assert md.splitlines()[0] == "``a `b` c`` and `` `x ``"


class _Collect(HTMLParser):
    """Every element with its attributes, and the text of each table cell."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.cells: list[tuple[str, dict[str, str | None], str]] = []
        self._cell: tuple[str, dict[str, str | None]] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag in ("td", "th"):
            self._cell, self._text = (tag, dict(attrs)), []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.cells.append((*self._cell, "".join(self._text)))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._text.append(data)


def test_html_escapes_user_text_and_aligns_by_column() -> None:
    page = html.to_html(_doc())
    parsed = _Collect()
    parsed.feed(page)
    tags = [t for t, _ in parsed.tags]
    assert "script" not in tags and tags.count("img") == 1  # the answer's <img> is text
    assert tags.count("svg") == 1  # the figure is the one piece of markup passed through
    assert "<title>title &lt;b&gt;</title>" in page
    td = [(attrs.get("class") or "", text) for tag, attrs, text in parsed.cells if tag == "td"]
    assert td[0] == ("", HOSTILE)  # the text survives escaping exactly
    assert td[1] == ("pass", "PASS") and td[5] == ("fail", "FAIL")
    assert td[2] == ("num", "12") and td[3] == ("num", "81.2% [78.1-84.0]")
    assert td[6] == ("num", "-")  # aligned by its column, not by looking like a number
    assert td[4] == ("", "two\nlines")
    th = [(attrs.get("class") or "", text) for tag, attrs, text in parsed.cells if tag == "th"]
    assert th == [("", "question"), ("", "gate"), ("num", "n"), ("num", "tok48")]
    assert "<code>x|y</code>" in page and "<code>tok48</code>" in page
    assert "&lt;cars&gt;" in page and "&lt;img src=x onerror=alert(1)&gt;" in page


def test_no_markdown_syntax_in_html() -> None:
    page = html.to_html(_doc())
    body = page.split("<body>", 1)[1]
    assert "`" not in body.replace("`tick`", "")  # only the user's own backticks, as text
    assert "|---" not in body and "---:|" not in body and "\\|" not in body
    assert not re.search(r"^#+ ", body, re.MULTILINE) and "```" not in body
    assert "<pre>type   n  orig\ncount  3  100.0</pre>" in body


def test_table_refuses_a_short_row() -> None:
    with pytest.raises(ValueError, match="row of 1 cells in a table of 2 columns"):
        Table((Column(rich("a")), Column(rich("b"))), ((Cell(rich("x")),),))


def test_markdown_leaves_plain_numbers_and_names_readable() -> None:
    """Only what Markdown would read as structure is escaped: report.md is also read raw."""
    doc = Document("t", [Table((Column(rich("type")), Column(rich("p"), "numeric")),
                               ((cell("rural_urban"), cell("<1e-4")), (cell("_x_ &amp; 2*3"), cell("1.00"))))])
    lines = markdown.to_markdown(doc).splitlines()
    assert lines[2] == "| rural_urban | <1e-4 |"
    assert lines[3] == r"| \_x\_ \&amp; 2\*3 | 1.00 |"


def test_a_filter_and_its_groups_are_html_only_and_escaped() -> None:
    from pytest_satbench.report.document import Facet, Filter, Group

    doc = Document("t")
    doc.add(Filter((Facet("type", "question type", (('a"b', "<a&b> (2)"),)),)),
            Group((("type", 'a"b'),), (Heading(3, rich("a: A right, B wrong")), Paragraph(rich("<x>")))))
    page = html.to_html(doc)
    assert '<input type="checkbox" name="type" value="a&quot;b" checked> &lt;a&amp;b&gt; (2)</label>' in page
    assert '<div class="group" data-type="a&quot;b">\n<h3>a: A right, B wrong</h3>\n<p>&lt;x&gt;</p>\n</div>' in page
    assert page.count("<script>") == 1 and page.index("<script>") > page.index('<div class="group"')
    assert "<script" not in html.to_html(Document("t", [Paragraph(rich("no filter"))]))
    with pytest.raises(TypeError):  # Markdown has no form of them: a document for it leaves them out
        markdown.to_markdown(doc)
    with pytest.raises(ValueError):
        Facet("on click", "x", ())
    with pytest.raises(ValueError):
        Group((("Type", "a"),), ())
