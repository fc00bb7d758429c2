"""`python -m pytest_satbench.report`: write (or list) run reports from the results store.

    python -m pytest_satbench.report [--store PATH] [--run RUN_ID | --tag TAG] [--out reports] [--list]
                                     [--log-to mlflow[:URI] | --log-to wandb[:PROJECT] ...]
    python -m pytest_satbench.report --compare A B [--benchmark NAME] [--allow-different-data]
    python -m pytest_satbench.report --why KEY [--benchmark NAME]
    python -m pytest_satbench.report --reasons [--run RUN_ID | --tag TAG]
    python -m pytest_satbench.report --plan TAG [--width W] [--detect D]
    python -m pytest_satbench.report --curve [TAG] [--margin M]
    python -m pytest_satbench.report --merge STORE [STORE ...] --into STORE

Exit codes: 0 written/listed/compared/merged, 2 bad usage, missing store or run, a comparison
that cannot be made, a store that cannot be merged (nothing is), 1 nothing to report.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_satbench.core.defaults import BOOTSTRAP

if TYPE_CHECKING:
    from pytest_satbench.engine.store import ResultStore

DEFAULT_STORE = Path(".pytest_cache") / "d" / "satbench" / "results.sqlite"


def _fail(msg: str, code: int = 2) -> int:
    print(f"satbench-report: {msg}", file=sys.stderr)
    return code


def _question_counts(protocol: dict[str, object], recorded: dict[str, tuple[int, int, int]]) -> dict[str, list[int]]:
    """Per benchmark of a run: [questions it selected, answered in every arm, with an error,
    missing (never reached, or an arm without an answer)]."""
    planned = protocol.get("planned") or {}
    assert isinstance(planned, dict)
    out = {}
    for bench in sorted({*planned, *recorded}):
        n, ok, err = recorded.get(bench, (0, 0, 0))
        questions = max(int(planned.get(bench, 0)), n)
        out[bench] = [questions, ok, err, questions - ok - err]
    return out


def _counts_text(c: list[int]) -> str:
    return f"questions={c[0]} answered={c[1]} errors={c[2]} missing={c[3]}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pytest_satbench.report", description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, default=DEFAULT_STORE, help=f"results store (default: {DEFAULT_STORE})")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--run", help="run id (see --list); default: the newest run")
    which.add_argument("--tag", help="the newest run with this tag")
    ap.add_argument("--out", type=Path, default=Path("reports"), help="output root (default: reports)")
    ap.add_argument("--list", action="store_true",
                    help="list the runs in the store, newest first, with their questions, answered, errors and "
                         "missing, and exit")
    ap.add_argument("--iterations", type=int, default=BOOTSTRAP, help=f"bootstrap resamples (default: {BOOTSTRAP})")
    ap.add_argument("--asked-anew", action="store_true",
                    help="summary.json and report.md count the run's answers asked anew by reason (new question, "
                         "model, prompt, image bytes, --fresh, ...); off by default: ~1.6 s per 100,000 stored rows")
    ap.add_argument("--log-to", action="append", default=[], metavar="mlflow[:URI]|wandb[:PROJECT]",
                    help="log each written report to an experiment tracker, repeatable (docs/trackers.md): the "
                         "tracker run of the benchmark and tag is updated, not duplicated")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"),
                    help="paired comparison of B against A, each TAG (its orig arm), TAG:ARM or :ARM (an arm of the "
                         "newest run's tag); written to OUT/<benchmark>/compare/<A>-vs-<B>/")
    ap.add_argument("--benchmark", help="with --compare: only this benchmark (default: every benchmark both have); "
                                        "with --why: the question's benchmark")
    ap.add_argument("--allow-different-data", action="store_true",
                    help="with --compare: pair the questions both sides have even when their dataset files differ")
    ap.add_argument("--why", metavar="KEY",
                    help="every stored answer of question KEY across runs and tags, its fingerprint's components side "
                         "by side, and the components that differ")
    ap.add_argument("--reasons", action="store_true",
                    help="per run (--run, --tag, default every run): the answers it asked anew, by reason (new "
                         "question, model changed, prompt changed, image bytes changed, --fresh, ...)")
    ap.add_argument("--plan", metavar="TAG",
                    help="from a pilot tag's stored answers: the per-image variance of each arm's paired delta and the "
                         "images, questions and time --width W or --detect D needs")
    ap.add_argument("--width", type=float, metavar="W", help="with --plan: a 95%% interval W points wide")
    ap.add_argument("--detect", type=float, metavar="D",
                    help="with --plan: 80%% power to detect a delta of D points (two-sided, 5%%)")
    ap.add_argument("--curve", nargs="?", const="", metavar="TAG",
                    help="the budget curve of a sweep (arms of one codec at several nlatent budgets) of TAG (default: "
                         "the newest run's tag): accuracy and paired delta per budget, the smallest within --margin")
    ap.add_argument("--margin", type=float, default=1.0,
                    help="with --curve: a budget is within the margin when its delta interval lies above -M points "
                         "(default: 1.0)")
    ap.add_argument("--merge", nargs="+", type=Path, metavar="STORE",
                    help="copy every row of these stores (the shards of a job array, docs/cluster.md) into the store "
                         "--into names: never a duplicate (merging twice adds nothing), a run whose protocol conflicts "
                         "with the target's runs of its tag refused; all or nothing, the sources only read")
    ap.add_argument("--into", type=Path, metavar="STORE", help="with --merge: the store merged into (created if absent)")
    args = ap.parse_args(argv)
    if (args.merge is None) != (args.into is None):
        ap.error("--merge STORE... and --into STORE go together")
    if args.merge is not None:
        return _merge(args.merge, args.into)
    log_to = []
    if args.log_to:
        from pytest_satbench.report.trackers import TrackerError, parse_log_to

        try:
            log_to = [parse_log_to(t) for t in args.log_to]
        except TrackerError as exc:
            ap.error(f"--log-to: {exc}")
    if args.plan is not None and not (args.width or args.detect):
        ap.error("--plan needs --width W and/or --detect D")
    if (args.width is not None and args.width <= 0) or args.detect == 0:
        ap.error("--width must be positive and --detect non-zero")

    if not args.store.is_file():
        return _fail(f"no results store at {args.store}; run pytest with --servers first, or pass --store PATH")
    from pytest_satbench.engine.store import ResultStore

    try:
        store = ResultStore(args.store)
        runs = store.runs(args.tag)
    except sqlite3.DatabaseError as exc:
        return _fail(f"{args.store} is not a satbench results store ({exc}); pass --store PATH")
    try:
        if args.compare:
            return _compare(store, args)
        if args.why is not None:
            from pytest_satbench.report.why import why_lines

            lines = why_lines(store, args.why, args.benchmark)
            if not lines:
                where = f" of {args.benchmark}" if args.benchmark else ""
                return _fail(f"no stored answer of question {args.why!r}{where} in {args.store}", 1)
            print("\n".join(lines))
            return 0
        if args.plan is not None:
            from pytest_satbench.report.compare import CompareError
            from pytest_satbench.report.plan import plan, plan_lines

            try:
                plans = plan(store, args.plan, width=args.width, detect=args.detect)
            except CompareError as exc:
                return _fail(str(exc))
            if not plans:
                return _fail(f"tag {args.plan!r} has no recorded questions; nothing to plan from", 1)
            print("\n".join(plan_lines(plans)))
            return 0
        if args.curve is not None:
            return _curve(store, args)
        if args.reasons:
            from pytest_satbench.report.why import reasons_lines

            chosen = [r for r in runs if r["run_id"] == args.run] if args.run else runs
            if not chosen:
                return _fail(f"no such run in {args.store}; see --list")
            print("\n".join(reasons_lines(store, chosen)))
            return 0
        if args.list:
            if not runs:
                print("no runs" + (f" with tag {args.tag!r}" if args.tag else ""))
            counts = store.run_counts() if runs else {}
            for r in runs:
                started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(r["started"])))  # type: ignore[arg-type]  # stored as a number
                state = "finished" if r["finished"] else "unfinished"
                proto = r["protocol"] if isinstance(r["protocol"], dict) else {}
                per = _question_counts(proto, counts.get(str(r["run_id"]), {}))
                total = [sum(c[i] for c in per.values()) for i in range(4)]
                print(f"{r['run_id']}  tag={r['tag']}  {started}  {state}  model={proto.get('model')}  "
                      f"arms={','.join(proto.get('arms') or [])}  {_counts_text(total)}")
                if len(per) > 1:
                    for bench, c in per.items():
                        print(f"    {bench}: {_counts_text(c)}")
            return 0
        if args.run:
            if not any(r["run_id"] == args.run for r in runs):
                return _fail(f"run {args.run!r} is not in {args.store}; see --list")
            run_id = args.run
        elif runs:
            run_id = str(runs[0]["run_id"])
        else:
            return _fail(f"no runs{' with tag ' + repr(args.tag) if args.tag else ''} in {args.store}; see --list")
        from pytest_satbench.report import write_reports

        logged: list[str] = []
        folders = write_reports(store, run_id, args.out, iterations=args.iterations, asked_anew=args.asked_anew,
                                log_to=log_to, logged=logged)
        if not folders:
            return _fail(f"run {run_id} has no recorded questions; nothing to report", 1)
        for f in folders:
            print(f"satbench: report written to {f}")
        for line in logged:  # a tracker's failure is its line; the reports are written either way
            print(line)
        return 0
    finally:
        store.close()


def _merge(sources: list[Path], target: Path) -> int:
    from pytest_satbench.engine.merge import MergeError, merge_stores
    from pytest_satbench.engine.store import StoreError

    try:
        result = merge_stores(sources, target)
    except MergeError as exc:
        for line in exc.lines:
            _fail(line)
        return _fail(f"nothing merged into {target} ({len(exc.lines)} bad input{'s' if len(exc.lines) != 1 else ''})")
    except StoreError as exc:
        return _fail(str(exc))
    for src, per in result.added.items():
        shown = ", ".join(f"{n} {table}" for table, n in per.items() if n) or "nothing new"
        print(f"satbench: merged {src}: {shown}")
    print(f"satbench: {len(result.added)} store(s) merged into {target}; "
          f"report it with --store {target} --tag TAG")
    return 0


def _compare(store: ResultStore, args: argparse.Namespace) -> int:
    from pytest_satbench.report.compare import CompareError, run_comparison, terminal_lines, write_comparison

    try:
        reports = run_comparison(store, *args.compare, benchmark=args.benchmark,
                                 allow_different_data=args.allow_different_data, iterations=args.iterations)
    except CompareError as exc:
        return _fail(str(exc))
    for rep in reports:
        print("\n".join(terminal_lines(rep)))
        recon_cache = Path(args.store).parent.parent / "satbench-recon"  # the plugin's, next to the store
        print(f"satbench: comparison written to {write_comparison(rep, args.out, recon_cache=recon_cache)}")
    return 0


def _curve(store: ResultStore, args: argparse.Namespace) -> int:
    from pytest_satbench.report.budget import budget_lines, write_curve
    from pytest_satbench.report.build import collect

    runs = store.runs()
    tag = args.curve or (str(runs[0]["tag"]) if runs else None)
    mine = [r for r in runs if r["tag"] == tag]
    if not mine:
        return _fail(f"no run with tag {tag!r} in {args.store}; see --list")
    wrote = False
    for res in collect(store, str(mine[0]["run_id"]), iterations=args.iterations):
        folder = write_curve(res, args.out, args.margin)
        if folder is None:
            continue
        print("\n".join(budget_lines(res, args.margin)))
        print(f"satbench: budget curve written to {folder}")
        wrote = True
    if not wrote:
        return _fail(f"tag {tag!r} has no budget sweep (two or more arms of one codec that differ only in nlatent)", 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
