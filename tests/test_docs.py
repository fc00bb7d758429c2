"""The documentation builds and its links hold.

`mkdocs build --strict` (mkdocs.yml at the repository root) fails on any warning: a link to a
page or an anchor that does not exist, a page left out of the nav, a `<!-- docstring: PATH -->`
marker naming a module that is gone (docs/hooks.py). The README is not part of the site (GitHub
and PyPI show it), so its relative links and anchors are checked here: each names a file of the
repository and, after `#`, a heading of that file."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    try:
        import mkdocs  # noqa: F401 (imported only to check that it is installed)
    except ImportError:
        pytest.fail("mkdocs is not installed: pip install -e '.[docs]' (make install-test does)")
    site = tmp_path / "site"
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                             "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    assert (site / "index.html").is_file() and (site / "options" / "index.html").is_file()


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    text = re.sub(r"^(```|````).*?^\1", "", markdown, flags=re.M | re.S)  # no headings in code
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+?)#*$", text, re.M):
        slug, n = github_slug(heading), 1
        while slug in found:  # a repeated heading gets -1, -2, ...
            slug, n = f"{github_slug(heading)}-{n}", n + 1
        found.add(slug)
    return found


def test_readme_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    broken = []
    for target in LINK.findall(readme):
        if re.match(r"[a-z]+:", target):  # http(s):, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = ROOT / path if path else ROOT / "README.md"
        if not file.exists():
            broken.append(f"{target}: no file {path}")
        elif anchor and (file.suffix != ".md" or anchor not in anchors(file.read_text())):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, broken
    assert LINK.search(readme), "the README links into docs/"
