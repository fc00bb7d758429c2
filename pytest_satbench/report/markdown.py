"""report.md: the report's Document as GitHub-flavoured Markdown, for a terminal or a pull request.

Plain text is escaped where Markdown would read it as structure (a `|` splitting a table
cell, a `<` opening an HTML tag, a backtick opening a code span, an entity reference); code spans get a fence
longer than any backtick run they hold. Blocks only HTML can show (plots, gallery images)
are left out: report.md says the images are in report.html.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pytest_satbench.report.document import (
    Block,
    Code,
    Document,
    Figure,
    Gallery,
    Heading,
    Notice,
    Paragraph,
    Preformatted,
    Rich,
    Table,
)

__all__ = ["to_markdown"]

# `\` and the characters that open structure inline: code spans, emphasis (`>` only quotes
# at a line's start, where no text of ours goes)
_SPECIAL = re.compile(r"([\\`*])")
# `<` opens an HTML tag or an autolink only before a letter, `/`, `!` or `?`: `<1e-4` stays
_TAG_OPEN = re.compile(r"<(?=[A-Za-z/!?])")
# `_` only emphasises at a word's edge (GFM leaves snake_case alone), so only there is it escaped
_EDGE_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
# an entity reference would be decoded by a Markdown renderer: `&lt;` must stay those four characters
_ENTITY = re.compile(r"&(?=#?[A-Za-z0-9]+;)")
_WHITESPACE = re.compile(r"\s+")


def _one_line(s: str) -> str:
    # a newline in user text would end a table row or a paragraph; the edges stay, they
    # separate this part from its neighbours
    return _WHITESPACE.sub(" ", s)


def _text(s: str, in_table: bool) -> str:
    s = _SPECIAL.sub(r"\\\1", _one_line(s))
    s = _TAG_OPEN.sub(r"\\<", _EDGE_UNDERSCORE.sub(r"\\_", _ENTITY.sub(r"\\&", s)))
    return s.replace("|", "\\|") if in_table else s


def _code(s: str, in_table: bool) -> str:
    s = _one_line(s)
    longest = max((len(m) for m in re.findall(r"`+", s)), default=0)
    fence = "`" * (longest + 1)
    # CommonMark strips one space on each side: pad when the span starts or ends with a backtick
    if s.startswith("`") or s.endswith("`"):
        s = f" {s} "
    # GFM splits table cells on `|` before it sees code spans; `\|` is the escape it honours there
    return fence + (s.replace("|", "\\|") if in_table else s) + fence


def _inline(parts: Rich, in_table: bool = False) -> str:
    return "".join(_code(p.text, in_table) if isinstance(p, Code) else _text(p, in_table) for p in parts)


def _table(t: Table) -> list[str]:
    def row(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cells) + " |"

    lines = [
        row([_inline(c.header, True) for c in t.columns]),
        "|" + "".join("---:|" if c.align == "numeric" else "---|" for c in t.columns),
    ]
    # the status is in the cell's text already (PASS/FAIL): Markdown has no colour for it
    # nor for a heat map's shade: the count it shades is the cell's text
    lines += [row([_inline(c.content, True) for c in r]) for r in t.rows]
    return lines


def _fence(lines: Sequence[str]) -> str:
    longest = max((len(m) for line in lines for m in re.findall(r"`{3,}", line)), default=2)
    return "`" * (longest + 1)


def _block(b: Block) -> list[str]:
    if isinstance(b, Heading):
        return ["#" * b.level + " " + _inline(b.text)]
    if isinstance(b, Paragraph):
        return [_inline(b.text)]
    if isinstance(b, Notice):  # `*` in the text is escaped, so the only emphasis is ours
        return ["> **" + _inline(b.text).strip() + "**"]
    if isinstance(b, Table):
        return _table(b)
    if isinstance(b, Preformatted):
        fence = _fence(b.lines)
        return [fence, *b.lines, fence]
    if isinstance(b, Figure | Gallery):
        return []
    raise TypeError(f"no Markdown for {type(b).__name__}")


def to_markdown(doc: Document) -> str:
    """The Document as Markdown: blocks separated by one blank line."""
    out: list[str] = []
    for b in doc.blocks:
        lines = _block(b)
        if lines:
            out += [*lines, ""]
    return "\n".join(out)
