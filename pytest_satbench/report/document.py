"""What a report says, as typed blocks, before it is Markdown or HTML.

`report.content` builds one `Document` from a `BenchmarkResult`; `report.markdown` and
`report.html` each render that same Document. Neither renderer reads the other's output, so
a table is a table in both (columns with their alignment, cells with their status), and
escaping happens once per output format, at the end, on text that is still plain.

Text is kept plain here: `Code` marks an inline code span instead of backticks, a `Cell`
carries PASS/FAIL as a status instead of a string for a renderer to recognise, and a heat-map
shade (a confusion table's share of its row) as a number that only HTML draws. Blocks that
only HTML can show (plots, the gallery's images) are their own types, which the Markdown
renderer skips; a `Notice` is a paragraph both outputs set apart (an incomplete run).

A `Filter` and the `Group`s it shows or hides (the comparison's question browser) exist in
HTML only: a Document meant for Markdown leaves them out (the Markdown renderer has no form of
them), and gives the groups' blocks in sequence instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

__all__ = [
    "Block", "Card", "Cell", "Code", "Column", "Document", "Facet", "Figure", "Filter", "Gallery", "Group", "Heading",
    "Inline", "Notice", "Paragraph", "Preformatted", "Rich", "Status", "Table", "Thumbnail", "cell", "rich",
]

Status = Literal["pass", "fail"]
Align = Literal["text", "numeric"]


@dataclass(frozen=True, slots=True)
class Code:
    """An inline code span: an identifier, a spec, a file name (shown verbatim)."""

    text: str


Inline: TypeAlias = str | Code
Rich: TypeAlias = tuple[Inline, ...]


def rich(*parts: Inline | Iterable[Inline] | None) -> Rich:
    """Inline parts from strings, `Code` spans and sequences of them; None and "" dropped."""
    out: list[Inline] = []
    for p in parts:
        if p is None or p == "":
            continue
        if isinstance(p, str | Code):
            out.append(p)
        else:
            out.extend(x for x in p if x != "")
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Heading:
    level: int  # 1: the report's title; 2: a section
    text: Rich


@dataclass(frozen=True, slots=True)
class Paragraph:
    text: Rich


@dataclass(frozen=True, slots=True)
class Notice:
    """A paragraph the reader must not miss (the run is incomplete): a quoted, bold
    paragraph in Markdown, a framed one in HTML."""

    text: Rich


@dataclass(frozen=True, slots=True)
class Column:
    header: Rich
    # numeric columns are right-aligned in both outputs, so digits line up
    align: Align = "text"


@dataclass(frozen=True, slots=True)
class Cell:
    content: Rich
    status: Status | None = None  # a gate's verdict: coloured in HTML
    # a heat map's intensity, 0..1 (a confusion count over its row's total): the cell's
    # background in HTML; Markdown has no colour and shows the number alone
    shade: float | None = None

    def __post_init__(self) -> None:
        if self.shade is not None and not 0.0 <= self.shade <= 1.0:
            raise ValueError(f"shade {self.shade!r} outside 0..1")


def cell(x: Cell | Inline | Sequence[Inline] | None, status: Status | None = None,
         shade: float | None = None) -> Cell:
    """A cell from a string, a code span or inline parts (None: an empty cell)."""
    if isinstance(x, Cell):
        return x
    return Cell(rich(x), status, shade)


@dataclass(frozen=True, slots=True)
class Table:
    columns: tuple[Column, ...]
    rows: tuple[tuple[Cell, ...], ...]

    def __post_init__(self) -> None:
        # a short row would shift every later column in Markdown: refuse it here
        for r in self.rows:
            if len(r) != len(self.columns):
                raise ValueError(f"row of {len(r)} cells in a table of {len(self.columns)} columns")


@dataclass(frozen=True, slots=True)
class Preformatted:
    """Fixed-width lines shown as they are (the terminal summary)."""

    lines: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Figure:
    """HTML only: an inline SVG from `report.plots`. The one block holding markup; plots
    escape every text they draw, and no user text reaches it otherwise."""

    svg: str  # carries its own title and aria-label


@dataclass(frozen=True, slots=True)
class Thumbnail:
    """One arm's image and answer in a gallery card."""

    label: str  # the arm's short label
    answer: str
    correct: bool
    jpeg_b64: str | None  # None: the image could not be produced, `note` says why
    note: str = ""


@dataclass(frozen=True, slots=True)
class Card:
    """One regressed question: the original and each reconstruction side by side."""

    key: str
    types: str
    question: str
    truth: str
    thumbnails: tuple[Thumbnail, ...]


@dataclass(frozen=True, slots=True)
class Gallery:
    """HTML only: the regressed questions with their images (Markdown has their table)."""

    cards: tuple[Card, ...]


@dataclass(frozen=True, slots=True)
class Facet:
    """One dimension a `Filter` filters on: the `Group`s' data value `name`, and its choices."""

    name: str  # a lower-case word: the groups' data-<name> attribute
    label: str
    choices: tuple[tuple[str, str], ...]  # (value, label shown), all chosen at first

    def __post_init__(self) -> None:
        if not self.name.isalpha() or not self.name.islower():  # it becomes an attribute's name
            raise ValueError(f"facet name {self.name!r}: lower-case letters only")


@dataclass(frozen=True, slots=True)
class Filter:
    """HTML only: a checkbox per choice of each facet; a `Group` is shown when, for every
    facet, its value is checked (a few lines of inline script; nothing is fetched)."""

    facets: tuple[Facet, ...]


@dataclass(frozen=True, slots=True)
class Group:
    """HTML only: blocks a `Filter` shows or hides together, with their value per facet."""

    data: tuple[tuple[str, str], ...]  # (facet name, value)
    blocks: tuple[Block, ...]

    def __post_init__(self) -> None:
        for name, _ in self.data:
            if not name.isalpha() or not name.islower():
                raise ValueError(f"group data name {name!r}: lower-case letters only")


Block: TypeAlias = Heading | Paragraph | Notice | Table | Preformatted | Figure | Gallery | Filter | Group


@dataclass(slots=True)
class Document:
    title: str  # the HTML page's title; the first heading is the visible one
    blocks: list[Block] = field(default_factory=list)

    def add(self, *blocks: Block) -> None:
        self.blocks.extend(blocks)
