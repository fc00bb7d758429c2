"""report.html: the report's Document with its plots and the gallery, in one self-contained
file (no external CSS, JS, fonts or images: it must open from an archive or a CI artifact).
A page with a `Filter` (the comparison's question browser) carries one inline script of a few
lines, `FILTER_JS`; every other page has none.

Rendered from the Document itself, never from report.md: alignment comes from a column's
declared kind, colour from a cell's status, a heat-map cell's background from its shade
(an inline style, the one style attribute written), and every text (question texts and answers are
user data) is escaped once, here.
"""

from __future__ import annotations

from html import escape

from pytest_satbench.report.document import (
    Block,
    Card,
    Cell,
    Code,
    Column,
    Document,
    Figure,
    Filter,
    Gallery,
    Group,
    Heading,
    Notice,
    Paragraph,
    Preformatted,
    Rich,
    Table,
)

__all__ = ["CSS", "to_html"]

CSS = """
body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:24px auto;max-width:1150px;color:#1b1b1b;line-height:1.4}
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:3px}
table{border-collapse:collapse;font-size:12.5px;margin:8px 0}td,th{border:1px solid #d6d6d6;padding:3px 7px;vertical-align:top}
th{background:#f3f3f3;text-align:left}.num{text-align:right;font-variant-numeric:tabular-nums}td.num{white-space:nowrap}
code{background:#f4f4f4;padding:0 3px;border-radius:3px;font-size:12px}pre{background:#f7f7f7;padding:8px;overflow-x:auto;font-size:11.5px}
.pass{color:#fff;background:#2e7d32;font-weight:bold}.fail{color:#fff;background:#c62828;font-weight:bold}
.notice{border:2px solid #c62828;background:#fdecea;padding:6px 10px;font-weight:bold}
.plot{display:block;margin:10px 0;max-width:100%;height:auto}
.gallery{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:14px}
.card{border:1px solid #ccc;border-radius:6px;padding:8px}.card .q{font-size:13px;margin-bottom:6px}
.panels{display:flex;gap:8px;flex-wrap:wrap}.panel{font-size:12px;max-width:180px}
.panel img{width:170px;height:auto;display:block;border:1px solid #bbb}.right{color:#2e7d32}.wrong{color:#c62828}
.missing{width:170px;height:110px;display:flex;align-items:center;justify-content:center;background:#eee;color:#666;text-align:center}
.filter{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;padding:4px 0;font-size:13px;z-index:1}
.filter fieldset{display:inline-block;border:1px solid #ccc;margin:0 8px 0 0;padding:2px 8px}.filter label{margin-right:10px}
[hidden]{display:none!important}
"""

# a Filter's one script: a Group (class "group") is shown when, for every facet of the form,
# its data-<facet> value is a checked box's value (run on every change and once on load,
# where a browser restored the boxes)
FILTER_JS = (
    "function satbenchFilter(f){var on={};f.querySelectorAll('input').forEach(function(i){"
    "on[i.name]=on[i.name]||[];if(i.checked)on[i.name].push(i.value)});"
    "document.querySelectorAll('.group').forEach(function(g){var show=true;for(var k in on){"
    "if(on[k].indexOf(g.getAttribute('data-'+k))<0)show=false}g.hidden=!show})}"
    "document.querySelectorAll('form.filter').forEach(function(f){satbenchFilter(f)});"
)


def _e(s: str) -> str:
    return escape(s, quote=True)


def _inline(parts: Rich) -> str:
    return "".join(f"<code>{_e(p.text)}</code>" if isinstance(p, Code) else _e(p) for p in parts)


def _classes(*names: str | None) -> str:
    names_ = [n for n in names if n]
    return f' class="{" ".join(names_)}"' if names_ else ""


def _th(c: Column) -> str:
    return f"<th{_classes('num' if c.align == 'numeric' else None)}>{_inline(c.header)}</th>"


# heat-map cells: one blue, its opacity the shade (0: none); white text where it is dark
HEAT_RGB = (31, 119, 180)
HEAT_MAX_ALPHA = 0.85


def _shade(shade: float | None) -> str:
    if shade is None:
        return ""
    alpha = HEAT_MAX_ALPHA * min(max(shade, 0.0), 1.0)
    r, g, b = HEAT_RGB
    ink = ";color:#fff" if alpha > 0.5 else ""
    return f' style="background-color:rgba({r},{g},{b},{alpha:.3f}){ink}"'


def _td(c: Cell, col: Column) -> str:
    return (f"<td{_classes('num' if col.align == 'numeric' else None, c.status)}{_shade(c.shade)}>"
            f"{_inline(c.content)}</td>")


def _table(t: Table) -> str:
    head = "<tr>" + "".join(_th(c) for c in t.columns) + "</tr>"
    body = ["<tr>" + "".join(_td(c, col) for c, col in zip(r, t.columns, strict=True)) + "</tr>" for r in t.rows]
    return "<table><thead>" + head + "</thead><tbody>\n" + "\n".join(body) + "\n</tbody></table>"


def _card(card: Card) -> str:
    panels = []
    for t in card.thumbnails:
        img = (
            f'<img alt="{_e(t.label)}" src="data:image/jpeg;base64,{_e(t.jpeg_b64)}">'
            if t.jpeg_b64 else f'<div class="missing">{_e(t.note or "image not available")}</div>'
        )
        note = f"<div><i>{_e(t.note)}</i></div>" if t.note and t.jpeg_b64 else ""
        verdict = "right" if t.correct else "wrong"
        panels.append(
            f'<div class="panel">{img}<div><code>{_e(t.label)}</code></div>'
            f'<div class="{verdict}">{_e(t.answer)} ({verdict})</div>{note}</div>'
        )
    return (
        f'<div class="card"><div class="q"><b>{_e(card.key)}</b> ({_e(card.types)}): '
        f"{_e(card.question)}<br>ground truth: <b>{_e(card.truth)}</b></div>"
        f'<div class="panels">{"".join(panels)}</div></div>'
    )


def _filter(f: Filter) -> str:
    sets = []
    for facet in f.facets:
        boxes = "".join(f'<label><input type="checkbox" name="{_e(facet.name)}" value="{_e(value)}" checked> '
                        f"{_e(label)}</label>" for value, label in facet.choices)
        sets.append(f"<fieldset><legend>{_e(facet.label)}</legend>{boxes}</fieldset>")
    return f'<form class="filter" onchange="satbenchFilter(this)">{"".join(sets)}</form>'


def _group(g: Group) -> str:
    data = "".join(f' data-{_e(k)}="{_e(v)}"' for k, v in g.data)
    return f'<div class="group"{data}>\n' + "\n".join(h for h in (_block(b) for b in g.blocks) if h) + "\n</div>"


def _block(b: Block) -> str:
    if isinstance(b, Heading):
        level = min(max(b.level, 1), 6)
        return f"<h{level}>{_inline(b.text)}</h{level}>"
    if isinstance(b, Paragraph):
        return f"<p>{_inline(b.text)}</p>"
    if isinstance(b, Notice):
        return f'<p class="notice">{_inline(b.text)}</p>'
    if isinstance(b, Table):
        return _table(b)
    if isinstance(b, Preformatted):
        return "<pre>" + _e("\n".join(b.lines)) + "</pre>"
    if isinstance(b, Figure):
        return b.svg  # markup from report.plots, which escapes its own text
    if isinstance(b, Gallery):
        return '<div class="gallery">' + "\n".join(_card(c) for c in b.cards) + "</div>" if b.cards else ""
    if isinstance(b, Filter):
        return _filter(b)
    if isinstance(b, Group):
        return _group(b)
    raise TypeError(f"no HTML for {type(b).__name__}")


def to_html(doc: Document) -> str:
    """The Document as one HTML page, styles inline."""
    body = "\n".join(h for h in (_block(b) for b in doc.blocks) if h)
    if any(isinstance(b, Filter) for b in doc.blocks):  # the one script a page can carry, once, at its end
        body += f"\n<script>{FILTER_JS}</script>"
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{_e(doc.title)}</title><style>{CSS}</style></head>\n<body>\n{body}\n</body></html>\n"
    )
