"""mkdocs hooks.

A line `<!-- docstring: pytest_satbench/core/scoring.py -->` in a page becomes that module's
docstring, as a text block. The rules of scoring and statistics are written once, in their
modules; the pages show them from there, so they cannot drift apart. A marker naming a file that
is gone, or one without a docstring, fails the build. A page that is only the line
`<!-- include: CHANGELOG.md -->` is that file of the repository, as Markdown (the changelog lives
at the root, where packagers and GitHub look for it).

A table cell's code span keeps its pipes escaped (a backslash before each) in the pages, as
GitHub needs; Python Markdown does not split a row inside a code span but would show the
backslash, so it goes."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from mkdocs.exceptions import PluginError

MARKER = re.compile(r"^<!-- docstring: (\S+) -->$", re.M)
INCLUDE = re.compile(r"^<!-- include: (\S+) -->\s*$")
TABLE_ROW = re.compile(r"^\|.*\|$", re.M)
CODE_SPAN = re.compile(r"`[^`]*`")


def _unescape_code_pipes(row: re.Match[str]) -> str:
    return CODE_SPAN.sub(lambda code: code.group(0).replace("\\|", "|"), row.group(0))


def on_page_markdown(markdown, page, config, files):  # noqa: ANN001, ANN201 (mkdocs hook)
    root = Path(config["config_file_path"]).parent
    included = INCLUDE.match(markdown)
    if included:
        path = root / included.group(1)
        if not path.is_file():
            raise PluginError(f"{page.file.src_path}: {included.group(1)} does not exist")
        markdown = path.read_text(encoding="utf-8")

    def docstring(match: re.Match[str]) -> str:
        path = root / match.group(1)
        if not path.is_file():
            raise PluginError(f"{page.file.src_path}: {match.group(1)} does not exist; point the marker at "
                              "the module that now holds these rules")
        text = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        if not text:
            raise PluginError(f"{page.file.src_path}: {match.group(1)} has no module docstring")
        return f"From the docstring of `{match.group(1)}`:\n\n````text\n{text}\n````"

    # the page's own tables first: a docstring is shown as it is written
    return MARKER.sub(docstring, TABLE_ROW.sub(_unescape_code_pipes, markdown))
