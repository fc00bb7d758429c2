"""report.html: report.md's content plus the plots and the gallery, in one self-contained file
(no external CSS, JS, fonts or images: it must open from an archive or a CI artifact)."""

from __future__ import annotations

import re
from html import escape

from pytest_satbench.core.results import BenchmarkResult
from pytest_satbench.report.build import token_curve
from pytest_satbench.report.gallery import Entry
from pytest_satbench.report.markdown import short_names
from pytest_satbench.report.plots import accuracy_bars, tokens_curve

CSS = """
body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:24px auto;max-width:1150px;color:#1b1b1b;line-height:1.4}
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:3px}
table{border-collapse:collapse;font-size:12.5px;margin:8px 0}td,th{border:1px solid #d6d6d6;padding:3px 7px;vertical-align:top}
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
code{background:#f4f4f4;padding:0 3px;border-radius:3px;font-size:12px}pre{background:#f7f7f7;padding:8px;overflow-x:auto;font-size:11.5px}
.pass{color:#fff;background:#2e7d32;font-weight:bold}.fail{color:#fff;background:#c62828;font-weight:bold}
.plot{display:block;margin:10px 0;max-width:100%;height:auto}
.gallery{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:14px}
.card{border:1px solid #ccc;border-radius:6px;padding:8px}.card .q{font-size:13px;margin-bottom:6px}
.panels{display:flex;gap:8px;flex-wrap:wrap}.panel{font-size:12px;max-width:180px}
.panel img{width:170px;height:auto;display:block;border:1px solid #bbb}.right{color:#2e7d32}.wrong{color:#c62828}
.missing{width:170px;height:110px;display:flex;align-items:center;justify-content:center;background:#eee;color:#666;text-align:center}
"""

_NUM = re.compile(r"^[+\-]?[$]?[\d,.]+(?:%| s)?$|^-$|^<1e-4$")


def _inline(text: str) -> str:
    text = text.replace("\\|", "\x00")
    parts = text.split("`")
    out = []
    for i, p in enumerate(parts):
        p = escape(p.replace("\x00", "|"))
        out.append(f"<code>{p}</code>" if i % 2 else p)
    return "".join(out)


def _cell(tag: str, raw: str) -> str:
    raw = raw.strip()
    cls = ""
    if raw == "PASS":
        cls = ' class="pass"'
    elif raw == "FAIL":
        cls = ' class="fail"'
    elif tag == "td" and _NUM.match(raw):
        cls = ' class="num"'
    return f"<{tag}{cls}>{_inline(raw)}</{tag}>"


def _split_row(line: str) -> list[str]:
    cells = re.split(r"(?<!\\)\|", line.strip())
    return cells[1:-1]


def md_to_html(md: str, after_heading: dict[str, str]) -> str:
    """Just the Markdown report.md uses: headings, paragraphs, tables, fenced code."""
    out: list[str] = []
    lines = md.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            out.append("<pre>" + escape("\n".join(lines[i + 1 : j])) + "</pre>")
            i = j + 1
            continue
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            title = line[level:].strip()
            out.append(f"<h{level}>{_inline(title)}</h{level}>")
            if title in after_heading:
                out.append(after_heading[title])
            i += 1
            continue
        if line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(lines[i])
                i += 1
            head, body = _split_row(rows[0]), [_split_row(r) for r in rows[2:]]
            out.append("<table><thead><tr>" + "".join(_cell("th", c) for c in head) + "</tr></thead><tbody>")
            out += ["<tr>" + "".join(_cell("td", c) for c in r) + "</tr>" for r in body]
            out.append("</tbody></table>")
            continue
        if line.strip():
            out.append(f"<p>{_inline(line)}</p>")
        i += 1
    return "\n".join(out)


def gallery_html(entries: list[Entry], labels: dict[str, str]) -> str:
    if not entries:
        return ""
    cards = []
    for e in entries:
        panels = []
        for p in e.panels:
            img = (
                f'<img alt="{escape(p.arm)}" src="data:image/jpeg;base64,{p.thumb_b64}">'
                if p.thumb_b64 else f'<div class="missing">{escape(p.note or "image not available")}</div>'
            )
            note = f"<div><i>{escape(p.note)}</i></div>" if p.note and p.thumb_b64 else ""
            verdict = "right" if p.correct else "wrong"
            panels.append(
                f'<div class="panel">{img}<div><code>{escape(labels.get(p.arm, p.arm))}</code></div>'
                f'<div class="{verdict}">{escape(p.answer[:120])} ({verdict})</div>{note}</div>'
            )
        cards.append(
            f'<div class="card"><div class="q"><b>{escape(e.key)}</b> ({escape(", ".join(e.types))}): '
            f"{escape(e.text[:300])}<br>ground truth: <b>{escape(e.answer)}</b></div>"
            f'<div class="panels">{"".join(panels)}</div></div>'
        )
    return '<div class="gallery">' + "\n".join(cards) + "</div>"


def render(data: BenchmarkResult, md: str, gallery: list[Entry]) -> str:
    inserts = {
        "Accuracy per question type and arm": accuracy_bars(
            data.stats, f"{data.benchmark}: accuracy per type and arm (whiskers: 95% CI)",
            short_names(list(data.stats.arms)),
        ),
        "Regressed questions": gallery_html(gallery, short_names(list(data.stats.arms))),
    }
    curve = token_curve(data)
    if curve is not None:
        inserts["Accuracy versus image tokens"] = tokens_curve(
            curve[0], curve[1], f"{data.benchmark}: accuracy versus image tokens"
        )
    body = md_to_html(md, inserts)
    title = escape(f"satbench report: {data.benchmark} / {data.tag}")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{title}</title><style>{CSS}</style></head>\n<body>\n{body}\n</body></html>\n"
    )
