"""`python -m pytest_satbench.report --compare A B`: two tags answered by two loopback servers
whose answers are known, so b, c, the exact McNemar p, the clustered intervals and the Holm
adjustment are computed by hand here; the pairing by question key; Holm and the exact test
against independent computations."""

from __future__ import annotations

import csv
import io
import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from datasets_fake import write_rsvqa
from PIL import Image
from servers import FakeVLM

from pytest_satbench.core.compare import SideAnswer, compare, holm, pair
from pytest_satbench.core.stats import ArmOutcome, mcnemar_exact, paired_delta_ci
from pytest_satbench.report.__main__ import main as report_main

N_IMAGES = 4  # image ids 10..13, each a flat grey whose level names it
SHADE = {10: 40, 11: 90, 12: 140, 13: 190}
TRUTH = {"presence": "yes", "comp": "no", "count": "403", "rural_urban": "urban"}


def _image_id(image: bytes | None) -> int:
    assert image is not None
    with Image.open(io.BytesIO(image)) as im:
        level = im.convert("L").getpixel((0, 0))
    return min(SHADE, key=lambda i: abs(SHADE[i] - level))


def _qtype(prompt: str) -> str:
    for qtype, needle in (("presence", "residential building"), ("comp", "more roads"),
                          ("count", "number of roads"), ("rural_urban", "rural or an urban")):
        if needle in prompt:
            return qtype
    raise AssertionError(prompt)


def answers_a(prompt: str, has_image: bool, image: bytes | None) -> str:
    """Right except presence on image 13 and count on images 12 and 13."""
    qtype, img = _qtype(prompt), _image_id(image)
    if (qtype == "presence" and img == 13) or (qtype == "count" and img in (12, 13)):
        return "no" if qtype == "presence" else "7"
    return TRUTH[qtype]


def answers_b(prompt: str, has_image: bool, image: bytes | None) -> str:
    """Right except presence on images 11, 12 and 13."""
    qtype, img = _qtype(prompt), _image_id(image)
    if qtype == "presence" and img != 10:
        return "no"
    return TRUTH[qtype]


def _suite(pytester: pytest.Pytester) -> Path:
    # two test files: tag b's node ids differ from tag a's, so only the question key pairs them
    pytester.makepyfile(test_bench_a="from pytest_satbench import benchmark_test\n"
                                     "test_rsvqa_lr = benchmark_test('rsvqa_lr')\n",
                        test_bench_b="from pytest_satbench import benchmark_test\n"
                                     "test_rsvqa_lr = benchmark_test('rsvqa_lr')\n")
    root = pytester.path / "data"
    written = write_rsvqa(root, "lr", n_images=N_IMAGES, per_type=2)
    for img_id, path in written.images.items():
        Image.new("RGB", (64, 64), (SHADE[int(img_id)],) * 3).save(path)
    return root


def _run(pytester: pytest.Pytester, url: str, data: Path, *args: str) -> None:
    result = pytester.runpytest("--servers", url, "--data-root", str(data), "-p", "no:randomly",
                                "-W", "ignore::pytest.PytestAssertRewriteWarning", *args)
    assert result.ret == 0, result.stdout.str()


@pytest.fixture
def two_tags(pytester: pytest.Pytester) -> Path:
    data = _suite(pytester)
    with FakeVLM(models=["model-a"], answer=answers_a) as srv:
        _run(pytester, srv.url, data, "test_bench_a.py", "--tag", "a")
    with FakeVLM(models=["model-b"], answer=answers_b) as srv:
        _run(pytester, srv.url, data, "test_bench_b.py", "--tag", "b", "--max-new", "64")
    return pytester.path


def _binomial_p(b: int, c: int) -> float:
    """Two-sided exact McNemar from the binomial tail, written out with math.comb."""
    n = b + c
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


def test_two_tags_compare_with_hand_computed_counts_p_and_intervals(two_tags: Path, capsys) -> None:
    store = two_tags / ".pytest_cache" / "d" / "satbench" / "results.sqlite"
    out = two_tags / "reports"
    assert report_main(["--store", str(store), "--compare", "a", "b", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    folder = out / "rsvqa_lr" / "compare" / "a-vs-b"
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["pairs"] == 32 and summary["only_a"] == summary["only_b"] == 0
    by = summary["by_type"]
    # presence: A right on images 10-12, B only on 10: b = 4 (images 11, 12), c = 0; image 13 wrong on both
    assert (by["presence"]["b"], by["presence"]["c"], by["presence"]["n"]) == (4, 0, 8)
    assert by["presence"]["delta_pp"] == -50.0
    # count: A wrong on images 12 and 13, B right everywhere: c = 4
    assert (by["count"]["b"], by["count"]["c"]) == (0, 4) and by["count"]["delta_pp"] == 50.0
    assert (by["comp"]["b"], by["comp"]["c"], by["comp"]["mcnemar_p"]) == (0, 0, 1.0)
    ov = summary["overall"]
    assert (ov["b"], ov["c"], ov["delta_pp"], ov["mcnemar_p"]) == (4, 4, 0.0, 1.0)
    assert ov["accuracy_a"] == ov["accuracy_b"] == 26 / 32
    for row in (by["presence"], by["count"], ov):
        assert row["mcnemar_p"] == pytest.approx(_binomial_p(row["b"], row["c"]), rel=1e-12)
    assert by["presence"]["mcnemar_p"] == pytest.approx(0.125)
    # the clustered interval: the bootstrap over the 4 images of the per-question differences
    img = np.repeat([10, 11, 12, 13], 2)
    a = np.array([1, 1, 1, 1, 1, 1, 0, 0])
    b = np.array([1, 1, 0, 0, 0, 0, 0, 0])
    lo, hi = paired_delta_ci(a, b, img, iterations=1000, seed=0)
    assert (by["presence"]["delta_ci_low_pp"], by["presence"]["delta_ci_high_pp"]) == pytest.approx((100 * lo, 100 * hi))
    # by hand: per image the presence delta is 0, -1, -1, 0, so a resample of 4 images has K ~ Bin(4, 1/2)
    # of the -1 ones and the delta -K/4; P(K = 4) = P(K = 0) = 1/16 > 2.5%: the interval is [-100, 0]
    assert (by["presence"]["delta_ci_low_pp"], by["presence"]["delta_ci_high_pp"]) == (-100.0, 0.0)
    assert (by["count"]["delta_ci_low_pp"], by["count"]["delta_ci_high_pp"]) == (0.0, 100.0)
    # overall, per image 0, -1/4, 0, +1/4 (8 questions each): a draw is -1, 0, +1 quarter with probability
    # 1/4, 1/2, 1/4; P(sum <= -3) = 9/256 > 2.5% > P(sum = -4) = 1/256: the interval is [-3/16, +3/16]
    assert (ov["delta_ci_low_pp"], ov["delta_ci_high_pp"]) == (-18.75, 18.75)
    # Holm over every test of the comparison, by hand from the raw p-values
    tested = [r for r in [*by.values(), ov, *summary["figures"].values()] if r["mcnemar_p"] is not None
              and r["same_as"] is None]
    assert summary["tests"] == len(tested) >= 6
    raw = sorted(r["mcnemar_p"] for r in tested)
    m = len(raw)
    expected, running = [], 0.0
    for j, p in enumerate(raw):
        running = max(running, min(1.0, (m - j) * p))
        expected.append(running)
    assert sorted(r["holm_p"] for r in tested) == pytest.approx(expected)
    assert by["presence"]["holm_p"] == pytest.approx(min(1.0, m * 0.125))
    # what differs, from the two runs' protocols
    fields = {d["field"]: (d["a"], d["b"]) for d in summary["differences"]}
    assert fields["model"] == ("model-a", "model-b")
    assert fields["sampling.max_tokens"] == (1024, 64)
    assert "arm" not in fields and not any(k.startswith("datasets") for k in fields)
    # the terminal table and the files
    assert "What differs: " in printed and "model: model-a -> model-b" in printed
    assert "Every question pairs: 32 questions" in printed
    line = next(x for x in printed.splitlines() if x.startswith("presence "))
    assert line.split()[:8] == ["presence", "8", "75.0", "25.0", "-50.0", line.split()[5], "4", "0"]
    rows = list(csv.DictReader((folder / "per_type.csv").open()))
    assert [r["group"] for r in rows][:5] == ["comp", "count", "presence", "rural_urban", "overall"]
    md = (folder / "report.md").read_text()
    assert "Holm-adjusted over the" in md and "model: model-a -> model-b" in md
    html = (folder / "report.html").read_text()
    assert "Discordant questions" in html and "presence: A right, B wrong (4)" in html
    # the browser's cards: each side's image as it was sent (orig: the source file), both answers
    assert html.count('<img alt="A: a" src="data:image/jpeg;base64,') == 8
    assert html.count('<img alt="B: b" src="data:image/jpeg;base64,') == 8
    assert "<img" not in md and "| key | question | truth | A&#x27;s answer" not in md
    _check_browser_filter(html, md)
    jl = [json.loads(x) for x in (folder / "discordant.jsonl").read_text().splitlines()]
    assert len(jl) == 8 and {d["direction"] for d in jl} == {"A right, B wrong", "A wrong, B right"}


# the browser's groups here: presence A right/B wrong (4 questions), count A wrong/B right (4)
GROUPS = {("presence", "a_right"), ("count", "b_right")}
_GROUP = re.compile(r'<div class="group" data-type="([^"]*)" data-direction="([^"]*)">\n<h3>([^<]*)</h3>')


def _check_browser_filter(html: str, md: str) -> None:
    """report.html filters the discordant questions by type and direction; report.md has none."""
    assert html.count('<form class="filter" onchange="satbenchFilter(this)">') == 1
    boxes = re.findall(r'<input type="checkbox" name="(\w+)" value="([^"]*)" checked> ([^<]*)</label>', html)
    assert boxes == [("type", "count", "count (4)"), ("type", "presence", "presence (4)"),
                     ("direction", "a_right", "A right, B wrong (4)"), ("direction", "b_right", "A wrong, B right (4)")]
    # every group carries its type and direction, and its heading says the same
    groups = _GROUP.findall(html)
    assert {(t, d) for t, d, _ in groups} == GROUPS and len(groups) == html.count('<div class="group"') == 2
    for t, d, heading in groups:
        assert heading == f"{t}: {'A right, B wrong' if d == 'a_right' else 'A wrong, B right'} (4)"
    assert html.count("<script>") == 1 and "src=" not in html.split("<script>")[1].split("</script>")[0]
    assert "<form" not in md and "data-type" not in md and "presence: A right, B wrong (4)" in md


def test_the_browser_filter_hides_the_groups_not_chosen(two_tags: Path, tmp_path: Path) -> None:
    """In a headless Chromium, unticking a direction hides its groups; unticking a type too."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium); the filter's script is not run")
    store = two_tags / ".pytest_cache" / "d" / "satbench" / "results.sqlite"
    assert report_main(["--store", str(store), "--compare", "a", "b", "--out", str(two_tags / "reports"),
                        "--iterations", "50"]) == 0
    html = (two_tags / "reports" / "rsvqa_lr" / "compare" / "a-vs-b" / "report.html").read_text()

    def shown_after(*untick: tuple[str, str]) -> set[tuple[str, str]]:
        # a user's clicks: untick the boxes, then the change event the form listens to
        clicks = "".join(f"document.querySelector('input[name={n}][value={v}]').checked=false;" for n, v in untick)
        page = tmp_path / f"page{len(list(tmp_path.glob('page*.html')))}.html"
        page.write_text(html.replace("</body>", f"<script>{clicks}var f=document.querySelector('form.filter');"
                                                "f.dispatchEvent(new Event('change'))</script></body>"))
        got = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                              "--disable-background-networking", "--disable-component-update", "--disable-sync",
                              f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()],
                             capture_output=True, text=True, timeout=60, check=False)
        dom = re.findall(r'<div class="group" data-type="([^"]*)" data-direction="([^"]*)"( hidden="")?>', got.stdout)
        assert len(dom) == 2, got.stderr[-2000:]
        return {(t, d) for t, d, hidden in dom if not hidden}

    assert shown_after() == GROUPS
    assert shown_after(("direction", "a_right")) == {("count", "b_right")}
    assert shown_after(("type", "count"), ("direction", "a_right")) == set()
    assert shown_after(("type", "presence")) == {("count", "b_right")}


def test_each_side_is_its_own_report(two_tags: Path) -> None:
    """Over the same questions, a side's accuracy and interval are its tag's report's."""
    store = two_tags / ".pytest_cache" / "d" / "satbench" / "results.sqlite"
    out = two_tags / "reports"
    assert report_main(["--store", str(store), "--compare", "a", "b", "--out", str(out)]) == 0
    cmp_ = json.loads((out / "rsvqa_lr" / "compare" / "a-vs-b" / "summary.json").read_text())
    for side, tag in (("a", "a"), ("b", "b")):
        own = json.loads((out / "rsvqa_lr" / tag / "summary.json").read_text())
        st = own["statistics"]
        for qtype, row in [*cmp_["by_type"].items(), ("overall", cmp_["overall"])]:
            acc = (st["overall"] if qtype == "overall" else st["by_type"][qtype])["accuracy"]["orig"]
            assert (row[f"accuracy_{side}"], row[f"{side}_ci_low"], row[f"{side}_ci_high"]) == \
                pytest.approx((acc["accuracy"], acc["ci_low"], acc["ci_high"])), (side, qtype)
        for name, row in cmp_["figures"].items():
            key = name if name in ("overall_accuracy", "average_accuracy") else f"aggregate:{name}"
            fig = own["aggregate_views"][key]["accuracy"]["orig"]
            assert (row[f"accuracy_{side}"], row[f"{side}_ci_low"], row[f"{side}_ci_high"]) == \
                pytest.approx((fig["value"], fig["ci_low"], fig["ci_high"])), (side, name)


def test_sides_name_tags_and_arms_and_unknown_ones_fail_in_one_line(two_tags: Path, capsys) -> None:
    store = str(two_tags / ".pytest_cache" / "d" / "satbench" / "results.sqlite")
    assert report_main(["--store", store, "--compare", "a", "nope"]) == 2
    assert "no run with tag 'nope'" in capsys.readouterr().err
    assert report_main(["--store", store, "--compare", "a", "b:tok32"]) == 2
    assert "tag 'b' has no arm 'tok32' (its arms: orig)" in capsys.readouterr().err
    # `:orig` is the newest run's tag (b); comparing a side with itself gives no discordance
    assert report_main(["--store", store, "--compare", ":orig", "b:orig", "--out", str(two_tags / "r2"),
                        "--iterations", "50"]) == 0
    same = json.loads((two_tags / "r2" / "rsvqa_lr" / "compare" / "b-vs-b" / "summary.json").read_text())
    assert same["overall"]["b"] == same["overall"]["c"] == 0 and same["differences"] == []
    assert report_main(["--store", store, "--compare", "a", "b", "--benchmark", "vrsbench"]) == 2
    assert "benchmark 'vrsbench' is not in both" in capsys.readouterr().err


# --------------------------------------------------------------------------- pure parts

def test_holm_on_a_hand_example() -> None:
    # Holm (1979): p sorted .01 .02 .03 .04 with m = 4 -> .04 .06 .06 .06 (monotone), None untested
    assert holm([0.03, None, 0.01, 0.04, 0.02]) == pytest.approx([0.06, None, 0.04, 0.06, 0.06])
    assert holm([0.5, 0.9]) == [1.0, 1.0]
    assert holm([]) == [] and holm([None]) == [None]


@pytest.mark.parametrize(("b", "c"), [(0, 0), (0, 1), (1, 0), (4, 0), (3, 7), (85, 185), (10, 10), (0, 25)])
def test_exact_mcnemar_is_the_binomial_tail(b: int, c: int) -> None:
    assert mcnemar_exact(b, c) == pytest.approx(_binomial_p(b, c), rel=1e-12, abs=1e-300)


def _side(key: str, image: str, correct: bool, qtype: str = "t") -> SideAnswer:
    return SideAnswer(key, image, (qtype,), ArmOutcome("ok", correct, True))


def test_pairing_is_by_key_in_a_order_and_counts_what_one_side_lacks() -> None:
    a = [_side("1", "i1", True), _side("2", "i1", False), _side("3", "i2", True)]
    b = [_side("4", "i9", True), _side("3", "i2", False), _side("1", "i1", True)]
    p = pair(a, b)
    assert [r.key for r in p.records] == ["1", "3"] and (p.only_a, p.only_b) == (1, 1)
    c = compare(p, iterations=0)
    assert (c.overall.b, c.overall.c, c.overall.n) == (1, 0, 2) and c.overall.delta == -50.0
    assert c.tests == 2  # the one type and overall
    with pytest.raises(ValueError, match="appears twice"):
        pair([_side("1", "i", True)] * 2, [])
