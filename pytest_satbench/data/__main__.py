"""`python -m pytest_satbench.data fetch BENCHMARK... [--root DIR] [--mirror URL]`, `list`,
`verify [BENCHMARK...] [--root DIR]` (docs/data.md). Exit status: 0 done / complete, 1 a
benchmark is not complete (after fetch: the loaders would still leave it out), 2 a fetch failed
(its one line says why and what to do)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pytest_satbench.data.fetch import (
    COMPLETE,
    FIRST_SEEN,
    MIRROR_ENV,
    Fetcher,
    mirror_base,
    resolve,
    source_rows,
    verify,
)
from pytest_satbench.data.transfer import FetchError
from pytest_satbench.datasets.sources import SOURCES

PROG = "python -m pytest_satbench.data"


def _root(arg: str | None) -> Path:
    return Path(arg or os.environ.get("SATBENCH_DATA_ROOT") or "satbench-data").absolute()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description="Fetch and verify the benchmarks' official data.")
    sub = parser.add_subparsers(dest="command", required=True)
    root_help = "the data root (default: $SATBENCH_DATA_ROOT, else ./satbench-data)"
    p_fetch = sub.add_parser("fetch", help="download, check and unpack benchmarks' files")
    p_fetch.add_argument("benchmarks", nargs="+", metavar="BENCHMARK")
    p_fetch.add_argument("--root", help=root_help)
    p_fetch.add_argument("--mirror", help=f"base URL serving the sources' relative paths (or ${MIRROR_ENV})")
    p_fetch.add_argument("--remove-archives", action="store_true",
                         help="delete each archive once unpacked (verify can then not re-hash it)")
    sub.add_parser("list", help="the sources: URL, checksum policy, where each file goes")
    p_verify = sub.add_parser("verify", help="re-check a data root without downloading")
    p_verify.add_argument("benchmarks", nargs="*", metavar="BENCHMARK")
    p_verify.add_argument("--root", help=root_help)
    args = parser.parse_args(argv)

    if args.command == "list":
        for s in SOURCES:
            print(f"{s.name}: {s.title} [{', '.join(s.benchmarks)}]; licence {s.licence}; {s.approx_size}"
                  + (f"; revision {s.revision} ({s.pin})" if s.host == "hub" else ""))
        for row in source_rows():
            print(f"  {row['source']}: {row['url']} -> {row['dest']} (checked by: {row['checksum']})")
        return 0
    try:
        sources = resolve(args.benchmarks or [s.name for s in SOURCES])
    except FetchError as exc:
        print(f"satbench-data: {exc}", file=sys.stderr)
        return 2
    root = _root(args.root)
    if args.command == "fetch":
        fetcher = Fetcher(root, mirror=mirror_base(args.mirror), remove_archives=args.remove_archives)
        try:
            fetcher.fetch(sources)
        except FetchError as exc:
            print(f"satbench-data: {exc}", file=sys.stderr)
            return 2
        ready: list[str] = []
        not_ready: list[str] = []
        for name, state, details in verify(root, sources):
            (ready if state in (COMPLETE, FIRST_SEEN) else not_ready).append(name)
            print(f"{name}: {state}" + (f" ({details[0]}{' ...' if len(details) > 1 else ''})" if details else ""))
        if not_ready:  # the loaders would still leave these out (`verify` lists why)
            print(f"satbench-data: {', '.join(not_ready)} not complete under {root}; "
                  f"{PROG} verify --root {root} lists what is missing", file=sys.stderr)
            return 1
        print(f"satbench-data: {', '.join(ready)} ready; run pytest with: --data-root {root}")
        return 0
    bad = 0
    asked = set(args.benchmarks)
    for name, state, details in verify(root, sources):
        if asked and name not in asked and not any(s.name in asked and name in s.benchmarks for s in sources):
            continue
        if state not in (COMPLETE, FIRST_SEEN):
            bad += 1
        print(f"{name}: {state}" + "".join(f"\n  {d}" for d in details))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
