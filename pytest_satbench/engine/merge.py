"""Merging results stores: `python -m pytest_satbench.report --merge STORE... --into STORE`.

The shards of a cluster job array (`--shard I/N`, docs/cluster.md) each write a store of their
own; merged into one, the tag's report is the report of one run over the whole benchmark.

What a merge does, and why it can be trusted:
- It copies every table the target has (read from `sqlite_master` and `PRAGMA table_info`,
  not from a list here): runs, answers, run items, image records, traffic, limits, and any
  table a later version adds. A table only a source has is created in the target from the
  source's own definition; a column a source lacks (an older store) is left to the target's
  default (NULL where there is none).
- It never duplicates a row: a table with a primary key or unique constraint keeps the row
  already there (`ON CONFLICT DO NOTHING`); a table without one (or with only a rowid) gets the
  source's rows that no row there equals (`EXCEPT`, whole rows). Merging twice is a no-op.
- Answers follow the store's rule (`engine/store.py`): an error never replaces an answer; of
  two answers (or two errors) with the same key, the later one (`created`) is kept.
- A run whose recorded protocol conflicts with the target's newest run of the same tag is
  refused (`protocol_conflict`): what the answers measure must agree (model, sampling, prompt
  style, arms, codec identities, scoring settings, dataset files, judge model, served
  weights, and any protocol field a later version adds); what a shard may change is listed
  in `MAY_DIFFER` (its command, date, servers, planned and shard counts, ...).
- Sources are opened read-only (`mode=ro`) and read inside one read transaction each (a
  consistent snapshot); a source another process has open (a run still writing it) is
  refused, as is a missing file or a file that is not a store. The target is written in one
  transaction: any bad input, or a crash, leaves it as it was; nothing is merged unless
  every source can be.
"""

from __future__ import annotations

import os
import sqlite3
import struct
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pytest_satbench.engine.store import ResultStore, store_error

__all__ = ["MAY_DIFFER", "MergeError", "MergeResult", "merge_stores", "protocol_conflict"]

# Protocol fields that may differ between the runs of one tag (the shards of a job array, a
# resume): how and where a run was made, how much of the benchmark it set out to answer, and
# whether it measured distortion (no answer depends on it).
# Every other field must agree. `served_model` and `judge` are compared by the parts that change
# answers (the weights' root, the judge's model), not by context length or address.
MAY_DIFFER = frozenset({"command", "date", "servers", "servers_file", "planned", "shard", "limit", "order",
                        "sequential", "plugin_version", "tag", "distortion"})

_BATCH = 5000  # rows fetched and inserted at a time: a 222k-answer store is never held whole


class MergeError(Exception):
    """Nothing was merged: one line per bad input (`lines`), each naming the store and what to do."""

    def __init__(self, lines: Sequence[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = list(lines)


@dataclass
class MergeResult:
    """What a merge added: per source, per table, the rows it added or replaced in the target."""

    target: Path
    added: dict[Path, dict[str, int]] = field(default_factory=dict)

    def total(self, table: str) -> int:
        return sum(per.get(table, 0) for per in self.added.values())


def merge_stores(sources: Iterable[Path], target: Path) -> MergeResult:
    """Merge every row of `sources` into `target` (created when absent), in one transaction.
    Raises MergeError (one line per bad input; the target untouched) when a source is missing,
    not a store, open in another process, the target itself, or holds a run whose protocol
    conflicts with the target's runs of its tag; StoreError when the target cannot be used."""
    target = Path(target)
    srcs = list(dict.fromkeys(Path(s) for s in sources))  # a store named twice is merged once
    # per source, what is wrong with it, in the order given; the others are still checked:
    # every bad input is said at once
    bad = {s: line for s in srcs if (line := _source_problem(s, target)) is not None}
    created = not target.exists()
    ResultStore(target).close()  # the current schema and the migrations of older stores
    dst = _connect(target)
    result = MergeResult(target)
    try:
        dst.execute("BEGIN IMMEDIATE")
        existing = {r for (r,) in dst.execute("SELECT run_id FROM runs")}
        for src_path in srcs:
            if src_path in bad:
                continue
            try:
                src = sqlite3.connect(f"file:{quote(str(src_path.resolve()))}?mode=ro", uri=True,
                                      isolation_level=None, timeout=10)
            except sqlite3.Error as exc:
                bad[src_path] = (f"{src_path}: cannot be opened read-only ({exc}); check its permissions")
                continue
            try:
                src.execute("BEGIN")  # one read transaction: every table from one snapshot
                problem = _not_a_store(src, src_path) or _conflicts(src, dst, src_path, existing)
                if problem:
                    bad[src_path] = problem
                    continue
                result.added[src_path] = _copy(src, dst)
            except _RowRefused as exc:
                bad[src_path] = (f"{src_path}: a row of its {exc.table} table does not fit the target's "
                                 f"({exc.why}); was it written by another program?")
            except sqlite3.OperationalError as exc:  # SQLite could not read it (its -wal/-shm, locks)
                bad[src_path] = (f"{src_path}: cannot be read ({exc}); check that it and its folder are readable "
                                 "(SQLite reads its -wal and -shm files too)")
            except sqlite3.DatabaseError as exc:
                bad[src_path] = (f"{src_path}: not a satbench results store ({exc}); pass the store a run wrote "
                                 "(--store)")
            finally:
                src.close()
        if bad:
            raise MergeError([bad[s] for s in srcs if s in bad])
        dst.execute("COMMIT")
    except BaseException:
        if dst.in_transaction:
            dst.execute("ROLLBACK")
        dst.close()
        if created:  # nothing merged: no empty store left behind either
            for suffix in ("", "-wal", "-shm"):
                Path(f"{target}{suffix}").unlink(missing_ok=True)
        raise
    dst.close()
    return result


# --------------------------------------------------------------------------- bad inputs

def _source_problem(path: Path, target: Path) -> str | None:
    if not path.exists():
        return f"{path}: no such file; pass the results store a shard wrote (its --store)"
    if not path.is_file():
        return f"{path}: not a file; pass the results store a shard wrote (its --store)"
    if target.exists() and os.path.samefile(path, target):
        return f"{path}: is the target of --into; name each store once, the target after --into"
    with open(path, "rb") as fh:
        head = fh.read(16)
    if head != b"SQLite format 3\x00":
        return f"{path}: not a satbench results store (not an SQLite file); pass the store a run wrote (--store)"
    holder = _open_elsewhere(path)
    if holder:
        return (f"{path}: open in another process{holder} (a run still writing it?); wait until it ends, "
                "then merge (a store is merged whole, never half-written)")
    return None


def _not_a_store(src: sqlite3.Connection, path: Path) -> str | None:
    have = {r[0] for r in src.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    missing = sorted({"answers", "runs", "run_items"} - have)
    if missing:
        return (f"{path}: not a satbench results store (no {', '.join(missing)} table); pass the store a run "
                "wrote (--store)")
    return None


def _open_elsewhere(path: Path) -> str:
    """' (pid N)' (or ' ') when another process has the store open, '' when none has.

    Every connection to a WAL database holds a shared lock on the DMS byte of its `-shm` file
    for as long as it is open (sqlite.org/walformat.html, "the DMS lock"); a run keeps its
    connections open from start to end, between commits too. Asked with F_GETLK, which takes
    no lock. Only where the lock layout is known (Linux); elsewhere the merge relies on the read
    transaction's snapshot. Must run before this process opens the store itself."""
    shm = Path(f"{path}-shm")
    if not sys.platform.startswith("linux") or not shm.exists():
        return ""  # no -shm: no connection is open (the last one to close removes it)
    import fcntl

    try:
        fd = os.open(shm, os.O_RDONLY)
    except OSError:
        return ""
    try:
        # struct flock {short l_type, l_whence; off_t l_start, l_len; pid_t l_pid}: a write lock
        # on byte 128 (the DMS byte) would conflict with any connection's shared lock there
        probe = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 128, 1, 0)
        got = fcntl.fcntl(fd, fcntl.F_GETLK, probe)
        l_type, _, _, _, pid = struct.unpack("hhqqi", got)
    except OSError:
        return ""
    finally:
        os.close(fd)
    if l_type == fcntl.F_UNLCK:
        return ""
    return f" (pid {pid})" if pid > 0 else " "


# --------------------------------------------------------------------------- protocols

def protocol_conflict(mine: Mapping[str, Any], theirs: Mapping[str, Any]) -> tuple[str, Any, Any] | None:
    """(field, its value in `mine`, in `theirs`) of the first protocol field in which two runs
    of one tag measure differently, or None. A field absent or null in one protocol and null in
    the other agrees (an older run did not record a setting a newer one leaves unset)."""
    a, b = _plain(mine), _plain(theirs)
    for key in sorted((set(a) | set(b)) - MAY_DIFFER):
        va, vb = a.get(key), b.get(key)
        if key == "datasets":  # per benchmark both record: another benchmark is no conflict
            for bench in sorted(set(va or {}) & set(vb or {})):
                if va[bench] != vb[bench]:
                    return f"datasets.{bench} (sha256 of its files)", va[bench], vb[bench]
            continue
        if key == "served_model":  # other weights under one id; another context length is allowed
            va, vb = (va or {}).get("root"), (vb or {}).get("root")
            if va and vb and va != vb:
                return "served_model.root", va, vb
            continue
        if key == "judge":  # the judge's model; its address may differ between shards
            va, vb = (va or {}).get("model"), (vb or {}).get("model")
            key = "judge.model"
        if va != vb:
            return key, va, vb
    return None


def _plain(value: Any) -> Any:
    """`value` with null entries of its mappings dropped, recursively."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    return value


def _conflicts(src: sqlite3.Connection, dst: sqlite3.Connection, path: Path, existing: set[str]) -> str | None:
    """The first run of `src` (not already in the target) whose protocol conflicts with the
    target's newest run of its tag (the target as merged so far: `existing` are the runs it had
    before, the others came from a source named earlier), as one line; the runs of one source
    are not compared with each other (the run that started each already was)."""
    import json

    newest: dict[str, tuple[str, dict[str, Any]] | None] = {}
    for run_id, tag, raw in src.execute("SELECT run_id, tag, protocol FROM runs ORDER BY started"):
        if dst.execute("SELECT 1 FROM runs WHERE run_id=?", (run_id,)).fetchone():
            continue  # merged before: the same run
        if tag not in newest:
            got = dst.execute("SELECT run_id, protocol FROM runs WHERE tag=? ORDER BY started DESC LIMIT 1",
                              (tag,)).fetchone()
            newest[tag] = (got[0], json.loads(got[1])) if got else None
        newest_of_tag = newest[tag]
        if newest_of_tag is None:
            continue
        other, theirs = newest_of_tag
        differ = protocol_conflict(json.loads(raw), theirs)
        if differ:
            name, here, there = differ
            return (f"{path}: run {run_id} of tag {tag!r} measured with {name} {_short(here)}, the target's runs "
                    f"of that tag (run {other}{'' if other in existing else ', merged just before'}) with "
                    f"{_short(there)}; merge it --into another store")
    return None


def _short(value: Any, n: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= n else text[: n - 3] + "..."


# --------------------------------------------------------------------------- copying

@dataclass(frozen=True)
class _Column:
    name: str
    type: str
    notnull: bool
    default: str | None
    pk: int


def _columns(conn: sqlite3.Connection, schema: str, table: str) -> list[_Column]:
    return [_Column(r[1], r[2] or "", bool(r[3]), r[4], int(r[5]))
            for r in conn.execute(f"PRAGMA {schema}.table_info({_ident(table)})")]


def _tables(conn: sqlite3.Connection) -> dict[str, str]:
    """Ordinary tables by name, with their CREATE statement (SQLite's own ones left out)."""
    return {name: sql for name, sql in conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' ORDER BY rowid")}


def _copy(src: sqlite3.Connection, dst: sqlite3.Connection) -> dict[str, int]:
    """Every table of `src` into `dst` (inside the caller's transaction); rows added or replaced
    per table."""
    ours = _tables(dst)
    out: dict[str, int] = {}
    for table, sql in _tables(src).items():
        if table not in ours:  # a table of a newer version (or a plugin's): its own definition
            dst.execute(sql)
            for (index_sql,) in src.execute(
                    "SELECT sql FROM sqlite_master WHERE type='index' AND tbl_name=? AND sql IS NOT NULL", (table,)):
                dst.execute(index_sql)
        have = {c.name for c in _columns(dst, "main", table)}
        for c in _columns(src, "main", table):
            if c.name not in have:  # a column of a newer version: added, so nothing is dropped
                default = f" DEFAULT {c.default}" if c.default is not None else ""
                notnull = " NOT NULL" if c.notnull and c.default is not None else ""
                dst.execute(f"ALTER TABLE {_ident(table)} ADD COLUMN {_ident(c.name)} {c.type}{notnull}{default}")
        out[table] = _copy_table(src, dst, table)
    return out


class _RowRefused(Exception):
    def __init__(self, table: str, why: str) -> None:
        super().__init__(table, why)
        self.table, self.why = table, why


def _copy_table(src: sqlite3.Connection, dst: sqlite3.Connection, table: str) -> int:
    target = _columns(dst, "main", table)
    theirs = {c.name for c in _columns(src, "main", table)}
    pk = [c for c in sorted(target, key=lambda c: c.pk) if c.pk]
    rowid_key = len(pk) == 1 and pk[0].type.upper() == "INTEGER" and _has_rowid(dst, table)
    if rowid_key:  # a surrogate key (INTEGER PRIMARY KEY): two stores number rows alike, so it is not copied
        pk = []
    cols = [c.name for c in target if c.name in theirs and not (rowid_key and c.pk)]
    if not cols:
        return 0
    names = ", ".join(_ident(c) for c in cols)
    marks = ", ".join("?" for _ in cols)
    unique = bool(pk) or _has_unique(dst, table)
    if table == "answers" and pk:
        keys = {c.name for c in pk}
        sets = ", ".join(f"{_ident(c)}=excluded.{_ident(c)}" for c in cols if c not in keys)
        sql = (f"INSERT INTO answers ({names}) VALUES ({marks}) ON CONFLICT({', '.join(_ident(c.name) for c in pk)}) "
               f"DO UPDATE SET {sets} WHERE (excluded.status = 'ok' AND answers.status != 'ok') OR "
               "((excluded.status = 'ok') = (answers.status = 'ok') AND excluded.created > answers.created)")
    elif unique:
        # not OR IGNORE: that would also skip, without a word, a row a NOT NULL or CHECK refuses
        sql = f"INSERT INTO {_ident(table)} ({names}) VALUES ({marks}) ON CONFLICT DO NOTHING"
    else:  # no key: the source's rows go to a scratch table, and those not already there are added
        dst.execute(f"CREATE TEMP TABLE _satbench_merge AS SELECT {names} FROM main.{_ident(table)} WHERE 0")
        sql = f"INSERT INTO temp._satbench_merge ({names}) VALUES ({marks})"
    order = " ORDER BY rowid" if _has_rowid(src, table) else ""  # run items: the order they were recorded in
    cur = src.execute(f"SELECT {names} FROM {_ident(table)}{order}")
    before = dst.total_changes
    try:
        while True:
            rows = cur.fetchmany(_BATCH)
            if not rows:
                break
            dst.executemany(sql, rows)
        if not unique:
            before = dst.total_changes
            # EXCEPT compares whole rows, NULL equal to NULL, by sorting: not a scan per row
            dst.execute(f"INSERT INTO main.{_ident(table)} ({names}) SELECT {names} FROM temp._satbench_merge "
                        f"EXCEPT SELECT {names} FROM main.{_ident(table)}")
    except sqlite3.IntegrityError as exc:
        raise _RowRefused(table, str(exc)) from None
    finally:
        if not unique:
            dst.execute("DROP TABLE IF EXISTS temp._satbench_merge")
    return dst.total_changes - before


def _has_rowid(conn: sqlite3.Connection, table: str) -> bool:
    try:
        conn.execute(f"SELECT rowid FROM {_ident(table)} LIMIT 0")
    except sqlite3.OperationalError:
        return False  # WITHOUT ROWID
    return True


def _has_unique(conn: sqlite3.Connection, table: str) -> bool:
    return any(r[2] for r in conn.execute(f"PRAGMA index_list({_ident(table)})"))


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _connect(path: Path) -> sqlite3.Connection:
    try:
        conn = sqlite3.connect(path, isolation_level=None, timeout=60)
        conn.execute("PRAGMA busy_timeout=60000")
        return conn
    except sqlite3.Error as exc:
        raise store_error(path, exc) from None
