"""mkdocs hook: a line `<!-- docstring: pytest_satbench/core/scoring.py -->` in a page becomes
that module's docstring, as a text block. The rules of scoring and statistics are written once,
in their modules; the pages show them from there, so they cannot drift apart. A marker naming a
file that is gone, or one without a docstring, fails the build."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from mkdocs.exceptions import PluginError

MARKER = re.compile(r"^<!-- docstring: (\S+) -->$", re.M)


def on_page_markdown(markdown, page, config, files):  # noqa: ANN001, ANN201 (mkdocs hook)
    root = Path(config["config_file_path"]).parent

    def docstring(match: re.Match[str]) -> str:
        path = root / match.group(1)
        if not path.is_file():
            raise PluginError(f"{page.file.src_path}: {match.group(1)} does not exist; point the marker at "
                              "the module that now holds these rules")
        text = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        if not text:
            raise PluginError(f"{page.file.src_path}: {match.group(1)} has no module docstring")
        return f"From the docstring of `{match.group(1)}`:\n\n````text\n{text}\n````"

    return MARKER.sub(docstring, markdown)
