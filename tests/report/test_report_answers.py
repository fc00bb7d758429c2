"""What the reports say about the answers themselves (core.analysis), and about a run that was
limited or did not finish: summary.json, answer_classes.csv, answer_transitions.csv, report.md
and report.html, on hand-made stores with known answers and on a real --limit run."""

from __future__ import annotations

import csv
import json
import re
from html import escape
from pathlib import Path

import pytest
from datasets_fake import rsvqa_suite
from servers import FakeVLM

from pytest_satbench.engine.store import AnswerRow, ResultStore
from pytest_satbench.report import content, write_reports

JPEG = "jpeg:quality=10"
BENCH = "demo"
PROTOCOL = {"model": "m", "prompt_style": "geocot", "arms": ["orig", JPEG], "command": ["pytest"],
            "date": "2026-12-01T00:00:00+0000", "tag": "t", "limit": None}
COUNTS = [str(k) for k in range(1, 11)]  # 10 count classes: the top 8 shown, 9 and 10 pooled
# (type, ground truth, orig's answer, jpeg's answer); None: an API error
PLAN = (
    # presence, 3 yes / 5 no, and a model that says "no" to all of it: 62.5% accuracy, which
    # is the majority baseline, and a balanced accuracy of 50%
    [("presence", gt, "no", "no") for gt in ["yes"] * 3 + ["no"] * 5]
    # comp: orig right; jpeg says "No." to everything (normalised to "no"), and one error
    + [("comp", "yes", "yes", "No."), ("comp", "yes", "yes", "No."), ("comp", "yes", "yes", None),
       ("comp", "no", "no", "No.")]
    # count: "1" three times, 2..10 once; orig right, jpeg answers one more than the truth
    + [("count", gt, gt, str(int(gt) + 1)) for gt in ["1", "1", *COUNTS]]
)


def _row(nodeid: str, key: str, arm: str, text: str | None, **extra: object) -> AnswerRow:
    base = {"nodeid": nodeid, "arm": arm, "fingerprint": f"{arm}-{key}", "benchmark": BENCH,
            "question_key": key, "image_id": f"img{int(key) // 2}"}
    if text is None:
        return AnswerRow(status="error", error="HTTP 503", **base)  # type: ignore[arg-type]  # base: AnswerRow fields by name
    return AnswerRow(status="ok", text=text, finish_reason="stop", latency_s=1.0, **base, **extra)  # type: ignore[arg-type]  # base, extra: AnswerRow fields by name


def _store(root: Path, protocol: dict, plan: list[tuple[str, str, str, str | None]], *, finish: bool = True,
           clipped: set[tuple[int, str]] = frozenset()) -> ResultStore:  # type: ignore[assignment]  # an immutable empty default
    store = ResultStore(root / "results.sqlite")
    store.start_run("r", "t", protocol)
    for k, (qtype, gt, orig, recon) in enumerate(plan):
        key = str(k)
        nodeid = f"t::test_{BENCH}[{key}]"
        q = {"key": key, "text": "?", "answer": gt, "types": [qtype], "kind": "vqa", "choices": None,
             "extra": [], "image_id": f"img{k // 2}", "image_path": None, "prompt": "?"}
        store.record_item("r", nodeid, BENCH, q, {"orig": f"orig-{key}", JPEG: f"{JPEG}-{key}"})
        for arm, text in (("orig", orig), (JPEG, recon)):
            store.put(_row(nodeid, key, arm, text, **({"clipped": True} if (k, arm) in clipped else {})))
    if finish:
        store.finish_run("r")
    return store


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("answers")
    store = _store(root, PROTOCOL, PLAN, clipped={(0, "orig"), (1, JPEG), (10, JPEG)})
    [out] = write_reports(store, "r", root / "reports", iterations=50)
    return out


def _md_rows(md: str, header_start: str) -> list[list[str]]:
    """The rows of the first Markdown table whose header row starts with `header_start`."""
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start)) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


def _section(md: str, heading: str) -> str:
    """A `##`/`###` section's text, up to the next heading of its level or above."""
    level = heading.split(" ", 1)[0]
    body = md.split(heading + "\n", 1)[1]
    stop = re.search(rf"^#{{1,{len(level)}}} ", body, re.MULTILINE)
    return body[: stop.start()] if stop else body


def test_summary_carries_the_answer_analysis(folder: Path) -> None:
    s = json.loads((folder / "summary.json").read_text())
    a = s["answer_analysis"]
    pres = a["by_type"]["presence"]
    assert (pres["n"], pres["majority_answer"], pres["majority_accuracy"]) == (8, "no", 5 / 8)
    orig = pres["by_arm"]["orig"]
    assert orig["balanced_accuracy"] == pytest.approx(0.5)  # "always no": 0% of yes, 100% of no
    assert s["statistics"]["by_type"]["presence"]["accuracy"]["orig"]["accuracy"] == pytest.approx(5 / 8)
    assert orig["recall"] == [{"answer": "no", "n": 5, "correct": 5, "recall": 1.0},
                              {"answer": "yes", "n": 3, "correct": 0, "recall": 0.0}]
    assert orig["confusion"] == {"rows": ["no", "yes"], "columns": ["no", "yes", "(other)", "(unreadable)"],
                                 "counts": [[5, 0, 0, 0], [3, 0, 0, 0]]}
    comp = a["by_type"]["comp"]
    assert comp["by_arm"][JPEG]["confusion"]["counts"] == [[0, 2, 0, 1], [0, 1, 0, 0]]  # rows yes, no
    assert comp["by_arm"][JPEG]["balanced_accuracy"] == pytest.approx((0 + 1) / 2)
    # the codec flips yes -> no on the two yes questions it answered; the error is unreadable
    assert comp["transitions"][JPEG] == [{"before": "yes", "after": "no", "count": 2},
                                         {"before": "yes", "after": "(unreadable)", "count": 1}]
    assert pres["transitions"][JPEG] == []  # "no" before and after
    count = a["by_type"]["count"]
    assert count["by_arm"]["orig"]["confusion"]["rows"] == ["1", *COUNTS[1:8], "(other)"]
    assert count["majority_answer"] == "1" and count["majority_accuracy"] == pytest.approx(3 / 12)
    assert a["majority_accuracy"] == pytest.approx((5 + 3 + 3) / 24)


def test_the_answer_csvs(folder: Path) -> None:
    classes = list(csv.DictReader((folder / "answer_classes.csv").open()))
    by = {(r["type"], r["arm"], r["answer"]): r for r in classes}
    yes = by["presence", "orig", "yes"]
    assert (yes["n"], yes["correct"], float(yes["recall"])) == ("3", "0", 0.0)
    assert float(yes["balanced_accuracy"]) == pytest.approx(0.5)
    assert (yes["majority_answer"], float(yes["majority_accuracy"])) == ("no", 5 / 8)
    assert len([r for r in classes if r["type"] == "count" and r["arm"] == "orig"]) == 10  # every class, pooled or not
    moves = list(csv.DictReader((folder / "answer_transitions.csv").open()))
    assert {"type": "comp", "arm": JPEG, "orig_answer": "yes", "recon_answer": "no", "count": "2"} in moves
    assert not [m for m in moves if m["type"] == "presence"]


def test_report_md_answers_section(folder: Path) -> None:
    md = (folder / "report.md").read_text()
    section = _section(md, "## Answers: what the model says")
    summary = {r[0]: r for r in _md_rows(section, "| type | n | classes |")}
    # type, n, classes, majority answer, majority baseline, random, balanced orig, balanced jpeg
    assert summary["presence"] == ["presence", "8", "2", "no", "62.5%", "50.0%", "50.0%", "50.0%"]
    assert summary["comp"][6:] == ["100.0%", "50.0%"]
    assert summary["count"][:6] == ["count", "12", "10", "1", "25.0%", "-"]
    # a yes/no type: the confusion of every arm; count (9 rows): orig's only, pooled
    pres = _md_rows(_section(section, "### presence: ground truth x answer, every arm"), "| arm |")
    assert pres[0] == ["`orig`", "no", "5", "5", "0", "0", "0", "100.0%"]
    assert pres[1] == ["`orig`", "yes", "3", "3", "0", "0", "0", "0.0%"]
    assert [r[0] for r in pres] == ["`orig`", "`orig`", "`jpeg:q10`", "`jpeg:q10`"]
    count = _md_rows(_section(section, "### count: ground truth x answer, `orig`"), "| ground truth |")
    assert [r[0] for r in count] == ["1", *COUNTS[1:8], "(other)"]
    assert count[-1] == ["(other)", "2", "0", "0", "0", "0", "0", "0", "0", "0", "2", "0", "100.0%"]
    moves = _md_rows(_section(section, "### How each reconstruction changes answers"), "| type | arm |")
    assert ["comp", "`jpeg:q10`", "yes", "no", "2"] in moves
    assert ["count", "`jpeg:q10`", "1", "2", "3"] == moves[moves.index(["comp", "`jpeg:q10`", "yes", "(unreadable)", "1"]) + 1]


def test_only_the_largest_transitions_are_listed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # count under jpeg moves 1->2 (x3), 2->3, ..., 7->8, 8->(other): 8 moves (9->10 stays in (other))
    monkeypatch.setattr(content, "TRANSITIONS_SHOWN", 3)
    [out] = write_reports(_store(tmp_path, PROTOCOL, PLAN), "r", tmp_path / "reports", iterations=0)
    md = (out / "report.md").read_text()
    rows = [r for r in _md_rows(md.split("### How each reconstruction changes answers", 1)[1], "| type | arm |")
            if r[0] == "count"]
    assert rows[:3] == [["count", "`jpeg:q10`", "1", "2", "3"], ["count", "`jpeg:q10`", "2", "3", "1"],
                        ["count", "`jpeg:q10`", "3", "4", "1"]] and len(rows) == 4
    assert rows[-1] == ["count", "`jpeg:q10`", "5 other moves", "", "5"]


def test_html_confusion_cells_are_shaded(folder: Path) -> None:
    page = (folder / "report.html").read_text()
    assert "<h2>Answers: what the model says</h2>" in page
    table = page.split("<h3>presence: ground truth x answer, every arm</h3>", 1)[1].split("</table>", 1)[0]
    shades = re.findall(r'<td class="num" style="background-color:rgba\(31,119,180,([0-9.]+)\)[^"]*">(\d+)</td>', table)
    # 4 rows (2 arms x yes/no) x 4 answer columns, each shaded by its share of the row
    assert len(shades) == 16
    assert shades[:4] == [("0.850", "5"), ("0.000", "0"), ("0.000", "0"), ("0.000", "0")]
    tok = page.split("<h3>comp: ground truth x answer, every arm</h3>", 1)[1].split("</table>", 1)[0]
    assert '<td class="num" style="background-color:rgba(31,119,180,0.283)">1</td>' in tok  # jpeg, yes -> no: 1 of 3
    assert "style=" not in page.split("<h2>Answers", 1)[0]  # only heat-map cells carry a style
    md = (folder / "report.md").read_text()
    assert "rgba" not in md and 'style="' not in md


def test_clipped_answers_are_counted(folder: Path) -> None:
    s = json.loads((folder / "summary.json").read_text())
    assert s["usage"]["clipped"] == 2 and s["usage"]["clipped_by_arm"] == {"orig": 1, JPEG: 1}  # (10, jpeg) errored
    md = (folder / "report.md").read_text()
    assert "Answers clipped at --max-answer-chars (scored on the text kept): 2 (`orig`: 1, `jpeg:q10`: 1)." in md
    usage = _section(md, "## Usage")
    assert usage.index("API errors") < usage.index("Answers clipped")


def test_a_complete_unlimited_run_says_neither(folder: Path) -> None:
    s = json.loads((folder / "summary.json").read_text())
    assert (s["limited"], s["not_run"], s["unfinished"]) == (None, 0, False)
    md = (folder / "report.md").read_text()
    assert "Limited run" not in md and "never ran" not in md and "\n> " not in md
    assert 'class="notice"' not in (folder / "report.html").read_text()


def test_an_unfinished_run_says_so_at_the_top(tmp_path: Path) -> None:
    plan = PLAN[:6]
    store = _store(tmp_path, {**PROTOCOL, "planned": {BENCH: 10}}, plan, finish=False)  # Ctrl-C after 6 of 10
    [out] = write_reports(store, "r", tmp_path / "reports", iterations=0)
    s = json.loads((out / "summary.json").read_text())
    assert (s["not_run"], s["unfinished"], s["questions"]) == (4, True, 6)
    sentence = ("Run unfinished (interrupted or stopped): 4 of the 10 questions selected never ran and are in "
                "no figure here; rerun the same command to ask them.")
    md = (out / "report.md").read_text()
    lines = md.splitlines()
    assert lines[0].startswith("# demo") and lines[2] == f"> **{sentence}**"  # before anything else
    page = (out / "report.html").read_text()
    assert f'<p class="notice">{sentence}</p>' in page
    assert page.index('class="notice"') < page.index("<h2>")


def test_a_finished_run_with_questions_never_run_says_so(tmp_path: Path) -> None:
    store = _store(tmp_path, {**PROTOCOL, "planned": {BENCH: 8}}, PLAN[:6])
    [out] = write_reports(store, "r", tmp_path / "reports", iterations=0)
    s = json.loads((out / "summary.json").read_text())
    assert (s["not_run"], s["unfinished"]) == (2, False)
    assert "> **Run incomplete: 2 of the 8 questions selected never ran" in (out / "report.md").read_text()


def test_grounding_only_has_no_answer_classes(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "results.sqlite")
    store.start_run("r", "t", PROTOCOL)
    q = {"key": "0", "text": "the car", "answer": "{<10><10><50><50>}", "types": ["unique"], "kind": "ref",
         "choices": None, "extra": [["is_unique", "True"]], "image_id": "img0", "image_path": None, "prompt": "?"}
    store.record_item("r", "t::test_vrsbench_ref[0]", "vrsbench_ref", q, {"orig": "o0"})
    store.put(AnswerRow(nodeid="t::test_vrsbench_ref[0]", arm="orig", fingerprint="o0", benchmark="vrsbench_ref",
                        question_key="0", image_id="img0", status="ok", text="[100,100,500,500]", finish_reason="stop"))
    store.finish_run("r")
    [out] = write_reports(store, "r", tmp_path / "reports", iterations=0)
    assert json.loads((out / "summary.json").read_text())["answer_analysis"] is None
    assert (out / "answer_classes.csv").read_text().splitlines() == [
        "type,arm,answer,n,correct,recall,balanced_accuracy,majority_answer,majority_accuracy"]
    assert (out / "answer_transitions.csv").read_text().splitlines() == ["type,arm,orig_answer,recon_answer,count"]
    assert "Answers: what the model says" not in (out / "report.md").read_text()


BENCH_MODULE = """
from pytest_satbench import benchmark_test
test_rsvqa_lr = benchmark_test("rsvqa_lr")
"""


def test_a_limited_real_run_says_so(pytester: pytest.Pytester) -> None:
    data = rsvqa_suite(pytester, BENCH_MODULE, n_images=3, per_type=2)  # 24 questions, 6 per type
    with FakeVLM(models=["m"], answer=lambda prompt, has_image, image: "no") as srv:
        result = pytester.runpytest("--servers", srv.url, "--data-root", str(data), "--limit", "8",
                                    "--recon", "jpeg:quality=10", "-q",
                                    "-W", "ignore::pytest.PytestAssertRewriteWarning")
    assert result.ret == 0, result.stdout.str()
    folder = pytester.path / "reports" / "rsvqa_lr" / "default"
    s = json.loads((folder / "summary.json").read_text())
    assert (s["limited"], s["questions"], s["not_run"], s["unfinished"]) == (8, 8, 0, False)
    sentence = ("Limited run (--limit 8): a sample of 8 questions with each question type in proportion to its "
                "size (at least one per type, fixed seed), so overall accuracy estimates the full run's; per-type "
                "figures rest on fewer questions.")
    md = (folder / "report.md").read_text()
    assert sentence in md.splitlines()
    assert f"<p>{escape(sentence)}</p>" in (folder / "report.html").read_text()
    # every answer "no": right on comp only (its fake truth is "no"), the same on both arms
    pres = s["answer_analysis"]["by_type"]["presence"]
    assert pres["by_arm"]["orig"]["confusion"]["counts"] == [[0, 2, 0]]  # truth yes: answered (other), 2 questions
    assert pres["transitions"] == {"jpeg:quality=10": []}
    summary = {r[0]: r for r in _md_rows(md, "| type | n | classes |")}
    assert summary["comp"][1:] == ["2", "1", "no", "100.0%", "50.0%", "100.0%", "100.0%"]
    assert "No answer changed class on any reconstruction." in md


def test_the_document_models_shade_and_notice() -> None:
    from pytest_satbench.report import html, markdown
    from pytest_satbench.report.document import (
        Cell,
        Column,
        Document,
        Notice,
        Table,
        cell,
        rich,
    )

    with pytest.raises(ValueError, match="outside 0..1"):
        Cell(rich("3"), shade=1.5)
    hostile = "a *b* <script>x</script>\nc"
    doc = Document("t", [Notice(rich(hostile)),
                         Table((Column(rich("n"), "numeric"),), ((cell("3", shade=0.25),), (cell("0", shade=None),)))])
    md = markdown.to_markdown(doc)
    assert md.splitlines()[0] == r"> **a \*b\* \<script>x\</script> c**"
    assert md.splitlines()[4:6] == ["| 3 |", "| 0 |"]  # the shade is HTML's alone
    page = html.to_html(doc)
    assert '<p class="notice">a *b* &lt;script&gt;x&lt;/script&gt;\nc</p>' in page
    assert '<td class="num" style="background-color:rgba(31,119,180,0.212)">3</td>' in page
    assert '<td class="num">0</td>' in page
