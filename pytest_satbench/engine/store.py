"""The results store: one SQLite file, one row per (node id, arm, fingerprint).

Why SQLite: every answer is committed the moment it arrives (WAL journal), so a SIGKILL
loses at most the requests in flight; several xdist workers can write the same file at
once (SQLite serialises writers, `busy_timeout` waits instead of failing); and a rerun
looks answers up by key instead of re-reading a 222k-line JSONL file.

Rules the rest of the plugin relies on:
- Only rows with status 'ok' count as answered. An error row records what went wrong (for
  reports and honest denominators) and is replaced by the next attempt.
- An error never overwrites a stored answer (the upsert refuses to).
- Correctness is NOT trusted from the row: callers re-score the stored raw answer, so a
  scorer fix applies to stored answers too. The `correct` column is for exports.

Every SQL statement of the plugin lives here (the schema, the writer, the queries reports
stream), which is why the file is long; what the file system says about the file (read-only,
full, a network mount) is at its end.
"""

from __future__ import annotations

import functools
import json
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from pytest_satbench.core.records import AnswerRow, Distortion, LimitTrace, ServerTraffic

SCHEMA = """
CREATE TABLE IF NOT EXISTS answers (
    nodeid TEXT NOT NULL,
    arm TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    status TEXT NOT NULL,
    benchmark TEXT NOT NULL,
    question_key TEXT NOT NULL,
    image_id TEXT NOT NULL,
    text TEXT,
    extracted TEXT,
    correct INTEGER,
    parsed INTEGER,
    finish_reason TEXT,
    latency_s REAL,
    prompt_tokens INTEGER,
    completion_tokens INTEGER,
    cost REAL,
    model TEXT,
    server TEXT,
    attempts INTEGER,
    image_sha256 TEXT,
    image_tokens INTEGER,
    error TEXT,
    created REAL NOT NULL,
    run_id TEXT,
    clipped INTEGER,
    reasoning_chars INTEGER,
    repaired INTEGER,
    reasoning_tokens INTEGER,
    reasoning TEXT,
    PRIMARY KEY (nodeid, arm, fingerprint)
);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    tag TEXT NOT NULL,
    started REAL NOT NULL,
    finished REAL,
    protocol TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS run_items (
    run_id TEXT NOT NULL,
    nodeid TEXT NOT NULL,
    benchmark TEXT NOT NULL,
    question TEXT NOT NULL,
    fingerprints TEXT NOT NULL,
    PRIMARY KEY (run_id, nodeid)
);
CREATE TABLE IF NOT EXISTS run_limits (
    run_id TEXT NOT NULL,
    process TEXT NOT NULL,
    server TEXT NOT NULL,
    steered_by TEXT NOT NULL,
    final_limit INTEGER NOT NULL,
    peak_in_flight INTEGER NOT NULL,
    points TEXT NOT NULL,
    PRIMARY KEY (run_id, process, server)
);
CREATE TABLE IF NOT EXISTS run_traffic (
    run_id TEXT NOT NULL,
    process TEXT NOT NULL,
    server TEXT NOT NULL,
    requests INTEGER NOT NULL,
    answered INTEGER NOT NULL,
    failures INTEGER NOT NULL,
    retries INTEGER NOT NULL,
    usage_dropped INTEGER NOT NULL DEFAULT 0,
    resent INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, process, server)
);
-- a run's items by benchmark in the order they ran (the index holds the rowid), so reports
-- stream them from the store without sorting
CREATE INDEX IF NOT EXISTS run_items_by_benchmark ON run_items (run_id, benchmark);
-- a source image's sha256 and size, reused while the file's size, mtime and content sample
-- are the same (engine/images.py: `content_sample`)
CREATE TABLE IF NOT EXISTS image_info (
    path TEXT PRIMARY KEY,
    size_bytes INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    width INTEGER NOT NULL,
    height INTEGER NOT NULL,
    sample TEXT
);
-- how far each arm's image as sent is from the original's as sent (core/records.py: Distortion),
-- keyed by the sha256 of both images' bytes sent (answers.image_sha256 of the orig arm and of
-- the arm): computed once when an image is prepared, reused by a resume and by reports.
-- psnr is IEEE infinity for identical images; lpips_weights is the sha256 of the weights file
-- LPIPS was computed with (NULL with lpips when it was not computed)
CREATE TABLE IF NOT EXISTS distortion (
    orig_sha256 TEXT NOT NULL,
    arm_sha256 TEXT NOT NULL,
    psnr REAL NOT NULL,
    ssim REAL NOT NULL,
    msssim REAL,
    lpips REAL,
    lpips_weights TEXT,
    created REAL NOT NULL,
    PRIMARY KEY (orig_sha256, arm_sha256)
);
"""


_COLUMNS = [f.name for f in fields(AnswerRow)]
# What every read selects: all but the reasoning text (AnswerRow's last field, None when not
# read), which only `rows(reasoning=True)` and the JSON-lines export read: a reasoning model's
# thinking can be many times its answers, and no figure is computed from it.
_READ = [c for c in _COLUMNS if c != "reasoning"]
assert _COLUMNS[-1] == "reasoning" and _READ == _COLUMNS[:-1]
_UPSERT = (
    f"INSERT INTO answers ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' for _ in _COLUMNS)}) "
    "ON CONFLICT(nodeid, arm, fingerprint) DO UPDATE SET "
    + ", ".join(f"{c}=excluded.{c}" for c in _COLUMNS[3:])
    # an error never replaces an answer; an answer replaces an error or an older answer
    + " WHERE excluded.status = 'ok' OR answers.status != 'ok'"
)


_ITEM_ANSWERS = f"SELECT {', '.join(_READ)} FROM answers WHERE nodeid=? AND status='ok'"


class StoreError(Exception):
    """The results store cannot be written or read: one line naming the file and what to do.
    What was committed before it is kept."""


def store_error(path: Path, exc: BaseException) -> StoreError:
    """The one-line message for what SQLite (or the file system) said about the store."""
    text = str(exc)
    low = text.lower()
    if _read_only_fs(path):
        low = "readonly"
    if "disk is full" in low or "no space" in low:
        why = "the disk is full; free space or pass --store PATH on another disk, then rerun (answers committed so far are kept)"
    elif "readonly" in low or "read-only" in low or "permission" in low or "unable to open" in low:
        why = _why_unwritable(path) or (
            "it cannot be opened; check that its folder exists and is writable, or pass --store PATH"
            if "unable to open" in low else
            "it cannot be written (read-only file or folder); fix its permissions or pass --store PATH")
    elif "not a database" in low or "malformed" in low:
        why = ("it is corrupt; rerun with --store-recover to move it aside (renamed .corrupt-<time>) and start a new "
               "one, or pass --store PATH")
    else:
        why = f"{text}; pass --store PATH to use another file"
    return StoreError(f"results store {path}: {why}")


def _why_unwritable(path: Path) -> str | None:
    """Which of the file and its folder refuses writes, found by trying (root ignores the
    permission bits, so they tell nothing: an immutable file, `chattr +i`, still refuses)."""
    if _read_only_fs(path):
        return "it cannot be written (its file system is mounted read-only); pass --store PATH on a writable disk"
    try:
        with open(path, "r+b"):
            pass
    except FileNotFoundError:
        pass
    except OSError as exc:
        return (f"it cannot be written (the file is read-only: {exc.strerror}); make it writable "
                "(chmod u+w, chattr -i) or pass --store PATH")
    try:
        import tempfile

        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as exc:
        return (f"it cannot be written (its folder {path.parent} is read-only: {exc.strerror}; SQLite keeps "
                f"{path.name}-wal and -shm next to it); make the folder writable or pass --store PATH")
    return None


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path.parent).f_flag & os.ST_RDONLY)
    except OSError:
        return False


@dataclass(frozen=True, slots=True)
class _Write:
    sql: str
    params: Sequence[object]
    done: threading.Event | None


@dataclass(frozen=True, slots=True)
class ImageInfo:
    sha256: str
    width: int
    height: int


class ResultStore:
    """Thread-safe access to the results file.

    Reads use one connection per thread. Writes go through one writer thread that commits
    whatever is queued in one transaction (a group commit): 64 request threads and pytest's
    loop never queue on a lock for SQLite, and an answer is committed a few milliseconds
    after it arrives. `put` returns once its answer is committed, so an answer the plugin
    has acted on is never lost; bookkeeping rows (`record_item`) are not waited for.
    """

    def __init__(self, path: Path) -> None:
        """Raises StoreError (one line with the remedy) when the file cannot be used."""
        self.path = Path(path)
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self._queue: queue.SimpleQueue[_Write | None] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._writer_lock = threading.Lock()
        self._writer_error: StoreError | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = self._conn()
            conn.executescript(SCHEMA)
            # stores written before answers recorded the run that asked them, clipping or reasoning
            # (its length, then its tokens and text)
            have = {r[1] for r in conn.execute("PRAGMA table_info(answers)")}
            for column, kind in (("run_id", "TEXT"), ("clipped", "INTEGER"), ("reasoning_chars", "INTEGER"),
                                 ("repaired", "INTEGER"), ("reasoning_tokens", "INTEGER"), ("reasoning", "TEXT")):
                if column not in have:
                    conn.execute(f"ALTER TABLE answers ADD COLUMN {column} {kind}")
            # stores written before images were sampled: their rows match no sample, so each
            # image is hashed once more
            if "sample" not in {r[1] for r in conn.execute("PRAGMA table_info(image_info)")}:
                conn.execute("ALTER TABLE image_info ADD COLUMN sample TEXT")
            # stores written before the client counted dropped usage values and resent requests
            have = {r[1] for r in conn.execute("PRAGMA table_info(run_traffic)")}
            for column in ("usage_dropped", "resent"):
                if column not in have:
                    conn.execute(f"ALTER TABLE run_traffic ADD COLUMN {column} INTEGER NOT NULL DEFAULT 0")
            self._identity = _identity(self.path)
        except (sqlite3.Error, OSError) as exc:
            self.close()
            raise store_error(self.path, exc) from None

    @classmethod
    def check_writable(cls, path: Path) -> None:
        """Open the store and commit one write, then close it: raises StoreError (one line
        with the remedy) when a run could not keep its answers there. SQLite opens a file it
        may not write read-only without a word, so only a real write tells."""
        store = cls(path)
        try:
            conn = store._conn()
            conn.execute("BEGIN IMMEDIATE")
            # made here, not with the schema: a reader of an old store on read-only media (the
            # report command) must not have to write to open it
            conn.execute("CREATE TABLE IF NOT EXISTS store_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            conn.execute("INSERT OR REPLACE INTO store_meta VALUES ('last_checked', ?)", (str(time.time()),))
            conn.execute("COMMIT")
        except (sqlite3.Error, OSError) as exc:
            raise store_error(store.path, exc) from None
        finally:
            store.close()

    @property
    def failure(self) -> StoreError | None:
        """Why the store stopped taking writes (None while it works): nothing more should be
        asked that could not be kept."""
        return self._writer_error

    @staticmethod
    def recover(path: Path) -> Path | None:
        """Move a corrupt store (and its WAL files) aside as `<name>.corrupt-<time>`; returns the
        new name, or None when the store is readable (or absent) and was left alone."""
        path = Path(path)
        if not path.exists():
            return None
        try:
            conn = sqlite3.connect(path)
            try:
                ok = conn.execute("PRAGMA quick_check").fetchone()[0] == "ok"
            finally:
                conn.close()
        except sqlite3.DatabaseError:
            ok = False
        if ok:
            return None
        aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        for suffix in ("", "-wal", "-shm"):
            src = Path(str(path) + suffix)
            if src.exists():
                os.replace(src, Path(str(aside) + suffix))
        return aside

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=60, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode: a commit survives a killed process (it is in the OS page
            # cache); only a power loss can take the last commits. FULL would fsync per
            # commit for no gain against the failure we care about (SIGKILL, OOM, Ctrl-C).
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=60000")
            self._local.conn = conn
            with self._all_lock:
                self._all.append(conn)
        return conn

    # ------------------------------------------------------------------ the writer
    def _write(self, sql: str, params: Sequence[object], *, wait: bool) -> None:
        if self._writer is None:
            with self._writer_lock:
                if self._writer is None:
                    self._writer = threading.Thread(target=self._write_loop, name="satbench-store", daemon=True)
                    self._writer.start()
        if self._writer_error is not None:
            raise self._writer_error  # failed once: nothing more is taken (see `failure`)
        done = threading.Event() if wait else None
        self._queue.put(_Write(sql, params, done))
        if done is not None:
            # Bounded waits, not one endless one: should the writer thread ever be gone without
            # releasing this write, the caller gets a StoreError instead of waiting forever.
            while not done.wait(1.0):
                writer = self._writer
                if writer is None or not writer.is_alive():
                    self._fail(StoreError(f"results store {self.path}: its writer stopped with writes still queued; "
                                          "rerun to ask what was not kept"))
                    break
            if self._writer_error is not None:
                raise self._writer_error

    def _fail(self, error: StoreError) -> None:
        if self._writer_error is None:  # the first reason is the one said
            self._writer_error = error

    def _write_loop(self) -> None:
        """The writer thread. It never ends while writes wait on it: whatever happens, every
        queued write is released (committed, or failed with `failure` set)."""
        conn: sqlite3.Connection | None = None
        try:
            # the file (or its folder) deleted or replaced since it was opened: said as such, and
            # no new file is made in its place (connecting would make one, or fail as unopenable)
            self._check_identity()
            conn = sqlite3.connect(self.path, timeout=60, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=60000")
        except StoreError as exc:
            self._fail(exc)
        except (sqlite3.Error, OSError) as exc:
            self._fail(store_error(self.path, exc))
        while True:
            first = self._queue.get()
            if first is None:
                if conn is not None:
                    conn.close()
                return
            batch = [first]
            while len(batch) < 1000:  # everything queued meanwhile goes in the same commit
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)  # stop after this batch
                    break
                batch.append(more)
            try:
                if self._writer_error is None and conn is not None:
                    self._commit(conn, batch)
            except StoreError as exc:
                self._fail(exc)
            except (sqlite3.Error, OSError) as exc:
                _rollback(conn)
                self._fail(store_error(self.path, exc))  # surfaces in every waiting put()
            except BaseException as exc:  # noqa: BLE001 - a writer that dies would hang every put()
                _rollback(conn)
                self._fail(StoreError(f"results store {self.path}: writing failed ({type(exc).__name__}: {exc}); "
                                      "the answers committed so far are kept: rerun to ask the rest"))
            for w in batch:
                if w.done is not None:
                    w.done.set()

    def _commit(self, conn: sqlite3.Connection, batch: list[_Write]) -> None:
        self._check_identity()
        conn.execute("BEGIN IMMEDIATE")
        for w in batch:
            try:
                conn.execute(w.sql, w.params)
            except UnicodeEncodeError:
                # a text SQLite cannot encode (a lone surrogate from a reply's JSON escapes):
                # kept with each such character replaced, never a failed write
                conn.execute(w.sql, [_encodable(v) for v in w.params])
        conn.execute("COMMIT")

    def _check_identity(self) -> None:
        # A store deleted (a .pytest_cache removed) or replaced under a running process still
        # takes writes through the open file, which no later run will ever read.
        try:
            now = _identity(self.path)
        except FileNotFoundError:
            now = None
        if now != self._identity:
            raise StoreError(
                f"results store {self.path}: the file was deleted or replaced while this run wrote to it "
                "(was .pytest_cache removed?); answers from here on could not be kept: rerun to ask them"
            )

    def flush(self) -> None:
        """Wait until every queued write is committed (or the store has failed: what it had
        committed can still be read)."""
        if self._writer is not None and self._writer_error is None:
            try:
                self._write("SELECT 1", (), wait=True)
            except StoreError:
                pass

    # ------------------------------------------------------------------ answers
    def put(self, row: AnswerRow) -> None:
        """Store an answer or an error; returns once it is committed."""
        if not row.created:
            row.created = time.time()
        self._write(_UPSERT, [getattr(row, c) for c in _COLUMNS], wait=True)

    def get(self, nodeid: str, arm: str, fingerprint: str) -> AnswerRow | None:
        """The stored answer, or None when there is none (an error row is not an answer)."""
        cur = self._conn().execute(
            f"SELECT {', '.join(_READ)} FROM answers "
            "WHERE nodeid=? AND arm=? AND fingerprint=? AND status='ok'",
            (nodeid, arm, fingerprint),
        )
        got = cur.fetchone()
        return _row(got) if got else None

    def get_many(self, nodeid: str, keys: Sequence[tuple[str, str]]) -> dict[str, AnswerRow]:
        """Stored answers of one item, by arm, for the given (arm, fingerprint) pairs, in
        their order. One query for the item's answers (the primary key's prefix), not one per
        arm: every question of a run asks this, stored or not."""
        if len(keys) < 2:
            return {arm: row for arm, fp in keys if (row := self.get(nodeid, arm, fp)) is not None}
        wanted = dict(keys)
        found: dict[str, AnswerRow] = {}
        for got in self._conn().execute(_ITEM_ANSWERS, (nodeid,)):
            if wanted.get(got[1]) == got[2]:  # this arm's fingerprint, not another setting's answer
                found[got[1]] = _row(got)
        return {arm: found[arm] for arm, _ in keys if arm in found}

    def rows(self, benchmark: str | None = None, *, reasoning: bool = False) -> Iterator[AnswerRow]:
        """Every stored row; `reasoning`: with the reasoning text (otherwise None)."""
        self.flush()  # this process's queued writes first
        sql = f"SELECT {', '.join(_COLUMNS if reasoning else _READ)} FROM answers"
        args: tuple[str, ...] = ()
        if benchmark:
            sql += " WHERE benchmark=?"
            args = (benchmark,)
        for got in self._conn().execute(sql + " ORDER BY nodeid, arm", args):
            yield _row(got)

    def count(self, status: str | None = None) -> int:
        self.flush()  # this process's queued writes first
        n: int
        if status:
            n = self._conn().execute("SELECT COUNT(*) FROM answers WHERE status=?", (status,)).fetchone()[0]
        else:
            n = self._conn().execute("SELECT COUNT(*) FROM answers").fetchone()[0]
        return n

    def export_jsonl(self, path: Path, benchmark: str | None = None) -> int:
        """Write every row (answers and errors) as JSON lines; returns the number written."""
        path.parent.mkdir(parents=True, exist_ok=True)
        # unique per process: two runs on one checkout may export at the same time
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        n = 0
        with open(tmp, "w", encoding="utf-8") as fh:
            for row in self.rows(benchmark, reasoning=True):
                fh.write(json.dumps(asdict(row), ensure_ascii=False) + "\n")
                n += 1
        os.replace(tmp, path)
        return n

    # ------------------------------------------------------------------ runs
    # A run records which questions it covered and with which fingerprints, so reports are
    # rebuilt from the store (answers + the run's items), resumed or not.
    def start_run(self, run_id: str, tag: str, protocol: dict[str, object]) -> None:
        """Idempotent: xdist workers of one run all call it with the same run id."""
        self._write(
            "INSERT OR IGNORE INTO runs (run_id, tag, started, finished, protocol) VALUES (?, ?, ?, NULL, ?)",
            (run_id, tag, time.time(), json.dumps(protocol, sort_keys=True)),
            wait=True,
        )

    def finish_run(self, run_id: str) -> None:
        self._write("UPDATE runs SET finished=? WHERE run_id=?", (time.time(), run_id), wait=True)

    def record_item(self, run_id: str, nodeid: str, benchmark: str, question: dict[str, object], fingerprints: dict[str, str]) -> None:
        # not waited for: a lost row only means a resumed run records the item again
        self._write(
            "INSERT OR REPLACE INTO run_items VALUES (?, ?, ?, ?, ?)",
            (run_id, nodeid, benchmark, json.dumps(question), json.dumps(fingerprints)),
            wait=False,
        )

    def put_traffic(self, run_id: str, process: str, traffic: Sequence[ServerTraffic]) -> None:
        """What one process's client sent to each server during the run (replaces its last
        snapshot: a process writes it when it stops)."""
        for t in traffic:
            self._write(
                "INSERT OR REPLACE INTO run_traffic (run_id, process, server, requests, answered, failures, "
                "retries, usage_dropped, resent) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, process, t.server, t.requests, t.answered, t.failures, t.retries, t.usage_dropped,
                 t.resent),
                wait=False,
            )
        self.flush()

    def put_limits(self, run_id: str, traces: Sequence[LimitTrace]) -> None:
        """Each server's adaptive limits over one process's run (replaces its last snapshot)."""
        for t in traces:
            self._write(
                "INSERT OR REPLACE INTO run_limits VALUES (?, ?, ?, ?, ?, ?, ?)",
                (run_id, t.process, t.server, t.steered_by, t.final_limit, t.peak_in_flight,
                 json.dumps([list(p) for p in t.points])),
                wait=False,
            )
        self.flush()

    def limits(self, run_id: str) -> list[LimitTrace]:
        """The run's limit traces, by server then process."""
        self.flush()
        return [
            LimitTrace(server, process, steered_by, int(final), int(peak), tuple((float(t), int(n)) for t, n in json.loads(points)))
            for server, process, steered_by, final, peak, points in self._conn().execute(
                "SELECT server, process, steered_by, final_limit, peak_in_flight, points FROM run_limits "
                "WHERE run_id=? ORDER BY server, process", (run_id,))
        ]

    def traffic(self, run_id: str) -> dict[str, ServerTraffic]:
        """Per server, summed over the run's processes (xdist workers)."""
        self.flush()
        out: dict[str, ServerTraffic] = {}
        for server, *counts in self._conn().execute(
            "SELECT server, SUM(requests), SUM(answered), SUM(failures), SUM(retries), SUM(usage_dropped), "
            "SUM(resent) "
            "FROM run_traffic WHERE run_id=? GROUP BY server ORDER BY server", (run_id,)
        ):
            out[server] = ServerTraffic(server, *(int(c) for c in counts))
        return out

    def runs(self, tag: str | None = None) -> list[dict[str, object]]:
        """Runs, newest first: run_id, tag, started, finished, protocol (dict)."""
        self.flush()  # this process's queued writes first
        sql = "SELECT run_id, tag, started, finished, protocol FROM runs"
        args: tuple[str, ...] = ()
        if tag:
            sql += " WHERE tag=?"
            args = (tag,)
        out = []
        for run_id, t, started, finished, protocol in self._conn().execute(sql + " ORDER BY started DESC", args):
            out.append({"run_id": run_id, "tag": t, "started": started, "finished": finished, "protocol": json.loads(protocol)})
        return out

    def run_benchmarks(self, run_id: str) -> list[str]:
        """The benchmarks a run recorded items of, sorted."""
        self.flush()
        got = self._conn().execute("SELECT DISTINCT benchmark FROM run_items WHERE run_id=?", (run_id,))
        return sorted(b for (b,) in got)

    def run_items(self, run_id: str, benchmark: str | None = None) -> Iterator[tuple[str, str, dict[str, object], dict[str, AnswerRow]]]:
        """(nodeid, benchmark, question dict, {arm: latest row for the run's fingerprint}), in
        the order the run recorded its items.

        An arm with no row at all (never asked: the run was interrupted) is absent.

        A generator over one SQLite cursor: an item's rows are read when it is reached, so a
        caller that aggregates as it goes holds one item at a time, not the run (the rows of
        a 222k-question run were ~1 GB of Python objects). One query joins each item with its
        arms' answers (the fingerprints unpacked with json_each), in item order, instead of a
        query per item and arm (seconds at 222k questions)."""
        self.flush()
        where = "r.run_id=?" + (" AND r.benchmark=?" if benchmark else "")
        args: tuple[str, ...] = (run_id, benchmark) if benchmark else (run_id,)
        sql = (
            f"SELECT r.rowid, r.nodeid, r.benchmark, r.question, r.fingerprints, {', '.join('a.' + c for c in _READ)} "
            "FROM run_items r LEFT JOIN json_each(r.fingerprints) j "
            "LEFT JOIN answers a ON a.nodeid = r.nodeid AND a.arm = j.key AND a.fingerprint = j.value "
            f"WHERE {where} ORDER BY r.rowid"
        )
        current: int | None = None
        head: tuple[str, str, str, str] = ("", "", "", "")
        found: dict[str, AnswerRow] = {}
        for got in self._conn().execute(sql, args):
            if got[0] != current:
                if current is not None:
                    yield _item(head, found)
                current, head, found = got[0], got[1:5], {}
            if got[5] is not None:  # a.nodeid: this arm has a row
                row = _row(got[5:])
                found[row.arm] = row
        if current is not None:
            yield _item(head, found)

    def tag_items(self, run_ids: Sequence[str], benchmark: str) -> Iterator[tuple[str, dict[str, object], dict[str, AnswerRow], frozenset[str]]]:
        """Every question of one benchmark that any of `run_ids` recorded (a tag's runs, newest
        first), once: (nodeid, question dict, {arm: row}, the arms of those rows `run_ids[0]`
        recorded: empty when only earlier runs recorded the question).

        Per question, the question record is the newest run's that recorded it; per arm, the
        fingerprint is the newest run's that asked that arm, and the row is that fingerprint's
        (the one row the store keeps per node, arm and fingerprint: the latest answer). Arms come
        in the newest record's order, then the arms only older runs asked. Questions come in the
        order the tag first recorded them. An arm with no row at all is absent, as in `run_items`.

        A generator over one SQLite cursor, like `run_items` (which this is for one run): the
        merge is SQLite's, nothing per question is held here."""
        self.flush()
        if not run_ids:
            return
        ranks = " UNION ALL ".join("SELECT ? AS run_id, ? AS rank" for _ in run_ids)
        args: list[object] = [v for rank, run_id in enumerate(run_ids) for v in (run_id, rank)]
        sql = (
            f"WITH sel AS ({ranks}), "
            "recs AS (SELECT r.rowid AS rid, r.nodeid AS nodeid, r.question AS question, r.fingerprints AS fps, "
            "sel.rank AS rank FROM sel JOIN run_items r ON r.run_id = sel.run_id AND r.benchmark = ?), "
            # one aggregate per query: SQLite then takes the bare columns from the row with the minimum
            "heads AS (SELECT nodeid, question, fps, MIN(rank) AS best FROM recs GROUP BY nodeid), "
            "firsts AS (SELECT nodeid, MIN(rid) AS first FROM recs GROUP BY nodeid), "
            "arms AS (SELECT recs.nodeid AS nodeid, j.key AS arm, j.value AS fp, MIN(recs.rank) AS rank "
            "FROM recs, json_each(recs.fps) j GROUP BY recs.nodeid, j.key) "
            f"SELECT f.first, h.nodeid, h.question, h.fps, h.best, arms.rank, {', '.join('a.' + c for c in _READ)} "
            "FROM firsts f JOIN heads h ON h.nodeid = f.nodeid LEFT JOIN arms ON arms.nodeid = f.nodeid "
            "LEFT JOIN answers a ON a.nodeid = arms.nodeid AND a.arm = arms.arm AND a.fingerprint = arms.fp "
            "ORDER BY f.first, arms.rank"
        )
        args.append(benchmark)
        current: int | None = None
        head: tuple[str, str, str] = ("", "", "")
        found: dict[str, AnswerRow] = {}
        own: list[str] = []
        for got in self._conn().execute(sql, args):
            if got[0] != current:
                if current is not None:
                    yield _merged_item(head, found, own)
                current, head, found, own = got[0], got[1:4], {}, []
            if got[6] is not None:  # a.nodeid: this arm has a row
                row = _row(got[6:])
                found[row.arm] = row
                if got[5] == 0:  # the arm's fingerprint is the reporting run's
                    own.append(row.arm)
        if current is not None:
            yield _merged_item(head, found, own)

    def records(self, run_id: str | None = None, *, key: str | None = None,
                benchmark: str | None = None) -> Iterator[tuple[str, str, str, dict[str, object], dict[str, str]]]:
        """Runs' records of their questions, without answers: (run_id, nodeid, benchmark,
        question dict, {arm: fingerprint}) in the order recorded; of one run, one question key
        (any node id) and/or one benchmark. Read-only (what `--why` and the re-ask reasons read)."""
        self.flush()
        where, args = [], []
        for clause, value in (("run_id=?", run_id), ("json_extract(question, '$.key')=?", key),
                              ("benchmark=?", benchmark)):
            if value is not None:
                where.append(clause)
                args.append(value)
        sql = "SELECT run_id, nodeid, benchmark, question, fingerprints FROM run_items"
        sql += (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY rowid"
        for rid, nodeid, bench, question, fps in self._conn().execute(sql, args):
            yield rid, nodeid, bench, json.loads(question), json.loads(fps)

    def question_rows(self, key: str, benchmark: str | None = None) -> list[AnswerRow]:
        """Every stored row (answers and errors) of one question key, any node id, arm and
        fingerprint, oldest first. Read-only."""
        self.flush()
        sql = f"SELECT {', '.join(_READ)} FROM answers WHERE question_key=?"
        args: tuple[str, ...] = (key,)
        if benchmark:
            sql += " AND benchmark=?"
            args = (key, benchmark)
        return [_row(got) for got in self._conn().execute(sql + " ORDER BY created, arm", args)]

    def run_counts(self) -> dict[str, dict[str, tuple[int, int, int]]]:
        """Per run and benchmark: (questions recorded, answered in every arm, with an error in some
        arm). A recorded question that is neither has an arm without any row."""
        self.flush()
        sql = (
            "SELECT run_id, benchmark, COUNT(*), SUM(arms > 0 AND ok = arms), SUM(err > 0) FROM ("
            "SELECT r.run_id AS run_id, r.benchmark AS benchmark, COUNT(j.key) AS arms, "
            "SUM(a.status = 'ok') AS ok, SUM(a.status IS NOT NULL AND a.status != 'ok') AS err "
            "FROM run_items r LEFT JOIN json_each(r.fingerprints) j "
            "LEFT JOIN answers a ON a.nodeid = r.nodeid AND a.arm = j.key AND a.fingerprint = j.value "
            "GROUP BY r.rowid) GROUP BY run_id, benchmark ORDER BY run_id, benchmark"
        )
        out: dict[str, dict[str, tuple[int, int, int]]] = {}
        for run_id, bench, n, ok, err in self._conn().execute(sql):
            out.setdefault(run_id, {})[bench] = (int(n), int(ok or 0), int(err or 0))
        return out

    # ------------------------------------------------------------------ image info
    def image_info(self, path: str, size_bytes: int, mtime_ns: int, sample: str) -> ImageInfo | None:
        """The image's measured info, if the file is as it was then: the same size, mtime and
        content sample (a file rewritten with its old mtime restored differs in its sample)."""
        got = self._conn().execute(
            "SELECT sha256, width, height FROM image_info WHERE path=? AND size_bytes=? AND mtime_ns=? AND sample=?",
            (path, size_bytes, mtime_ns, sample),
        ).fetchone()
        return ImageInfo(*got) if got else None

    def put_image_info(self, path: str, size_bytes: int, mtime_ns: int, sample: str, info: ImageInfo) -> None:
        self._write(
            "INSERT OR REPLACE INTO image_info (path, size_bytes, mtime_ns, sha256, width, height, sample) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (path, size_bytes, mtime_ns, info.sha256, info.width, info.height, sample),
            wait=False,
        )

    # ------------------------------------------------------------------ distortion
    def put_distortion(self, orig_sha256: str, arm_sha256: str, d: Distortion,
                       lpips_weights: str | None = None) -> None:
        """Keep one arm's distortion (`lpips_weights`: the sha256 of the LPIPS weights file, when
        `d.lpips` is set). Not waited for: a lost row is computed again by the next run."""
        self._write(
            "INSERT OR REPLACE INTO distortion (orig_sha256, arm_sha256, psnr, ssim, msssim, lpips, lpips_weights, "
            "created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (orig_sha256, arm_sha256, float(d.psnr), float(d.ssim), d.msssim, d.lpips,
             lpips_weights if d.lpips is not None else None, time.time()),
            wait=False,
        )

    def distortion(self, orig_sha256: str, arm_sha256: str, *,
                   lpips_weights: str | None = None) -> Distortion | None:
        """The stored distortion of one arm's image, or None. With `lpips_weights`, a stored LPIPS
        computed with other weights is left out (lpips None), so the caller computes it again."""
        got = self._conn().execute(
            "SELECT psnr, ssim, msssim, lpips, lpips_weights FROM distortion WHERE orig_sha256=? AND arm_sha256=?",
            (orig_sha256, arm_sha256),
        ).fetchone()
        if got is None:
            return None
        psnr, ssim, msssim, lpips, weights = got
        if lpips_weights is not None and weights != lpips_weights:
            lpips = None
        return Distortion(float(psnr), float(ssim), msssim, lpips)

    def distortions(self, pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], Distortion]:
        """The stored distortion of every (orig sha256, arm sha256) pair that has one (absent
        pairs are left out), in queries of up to 400 pairs (800 parameters: under the 999 of SQLite
        before 3.32)."""
        self.flush()
        wanted = list(dict.fromkeys((str(o), str(a)) for o, a in pairs))
        out: dict[tuple[str, str], Distortion] = {}
        conn = self._conn()
        for sql, args in _pair_queries(
            wanted, "d.orig_sha256, d.arm_sha256, d.psnr, d.ssim, d.msssim, d.lpips", ""
        ):
            for o, a, psnr, ssim, msssim, lpips in conn.execute(sql, args):
                out[(o, a)] = Distortion(float(psnr), float(ssim), msssim, lpips)
        return out

    def lpips_weights_used(self, pairs: Iterable[tuple[str, str]]) -> set[str]:
        """The sha256 of every LPIPS weights file the stored distortions of `pairs` were
        computed with (empty when none had LPIPS), for a report to name them."""
        self.flush()
        wanted = list(dict.fromkeys((str(o), str(a)) for o, a in pairs))
        used: set[str] = set()
        conn = self._conn()
        for sql, args in _pair_queries(wanted, "DISTINCT d.lpips_weights", " WHERE d.lpips_weights IS NOT NULL"):
            used.update(w for (w,) in conn.execute(sql, args))
        return used

    def close(self) -> None:
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join(timeout=60)
            self._writer = None
        with self._all_lock:
            for conn in self._all:
                try:
                    conn.close()
                except sqlite3.ProgrammingError:
                    pass  # created in a thread that is gone; nothing to flush in WAL mode
            self._all.clear()
        self._local = threading.local()


# SQLite's WAL mode needs shared memory and POSIX locks that these do not give reliably
# (sqlite.org/wal.html: "WAL does not work over a network filesystem").
NETWORK_FILESYSTEMS = frozenset({"nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "ceph", "fuse.sshfs",
                                 "fuse.glusterfs", "glusterfs", "beegfs", "afs"})


def filesystem_of(path: Path, mounts: Path = Path("/proc/mounts")) -> str | None:
    """The type of the file system `path` lives on (the longest mount point above it), or
    None where the mount table cannot be read."""
    try:
        table = mounts.read_text().splitlines()
    except OSError:
        return None
    target = str(Path(path).resolve())
    best, fstype = "", None
    for line in table:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, fstype = point, parts[2]
    return fstype


def network_store_warning(path: Path, mounts: Path = Path("/proc/mounts")) -> str | None:
    """One line when the store would live on a network file system, else None."""
    fstype = filesystem_of(Path(path).parent, mounts)
    if fstype is None or fstype.lower() not in NETWORK_FILESYSTEMS:
        return None
    return (f"the results store {path} is on a {fstype} file system, where SQLite's locking is not safe; "
            "pass --store PATH on local disk (e.g. /tmp or the node's scratch)")


def _pair_queries(pairs: list[tuple[str, str]], columns: str, where: str) -> Iterator[tuple[str, list[str]]]:
    """SELECT `columns` of the distortion rows (alias d) of `pairs`, 400 pairs a query, each pair
    found by the primary key (a join with a VALUES list)."""
    for start in range(0, len(pairs), 400):
        chunk = pairs[start:start + 400]
        values = ", ".join("(?, ?)" for _ in chunk)
        sql = (f"WITH w(o, a) AS (VALUES {values}) SELECT {columns} FROM w "
               f"JOIN distortion d ON d.orig_sha256 = w.o AND d.arm_sha256 = w.a{where}")
        yield sql, [v for pair in chunk for v in pair]


def _rollback(conn: sqlite3.Connection | None) -> None:
    try:
        if conn is not None and conn.in_transaction:
            conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass  # nothing of the failed batch was committed either way


def _encodable(value: object) -> object:
    """`value` as SQLite can store it: in a string, a surrogate pair written as two escapes
    becomes its character and a lone surrogate becomes U+FFFD."""
    if not isinstance(value, str):
        return value
    return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _identity(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _item(head: Sequence[str], found: dict[str, AnswerRow]) -> tuple[str, str, dict[str, object], dict[str, AnswerRow]]:
    nodeid, bench, question, fps = head
    rows = {arm: found[arm] for arm in _arm_order(fps) if arm in found}  # the run's arm order
    return nodeid, bench, json.loads(question), rows


def _merged_item(head: Sequence[object], found: dict[str, AnswerRow],
                 own: list[str]) -> tuple[str, dict[str, object], dict[str, AnswerRow], frozenset[str]]:
    nodeid, question, fps = head
    order = _arm_order(str(fps))  # the newest record's arms first, then older runs' (found in rank order)
    rows = {arm: found[arm] for arm in order if arm in found}
    rows.update((arm, row) for arm, row in found.items() if arm not in rows)
    return str(nodeid), json.loads(str(question)), rows, _arm_set(tuple(own))


@functools.lru_cache(maxsize=256)  # a few distinct sets in a run: one object each
def _arm_set(arms: tuple[str, ...]) -> frozenset[str]:
    return frozenset(arms)


@functools.lru_cache(maxsize=64)  # questions about one image share their fingerprints: one parse
def _arm_order(fingerprints: str) -> tuple[str, ...]:
    return tuple(json.loads(fingerprints))


def _row(values: Sequence[object]) -> AnswerRow:
    row = AnswerRow(*values)  # type: ignore[arg-type]  # a row read in AnswerRow's field order
    if row.correct is not None:
        row.correct = bool(row.correct)
    if row.parsed is not None:
        row.parsed = bool(row.parsed)
    if row.clipped is not None:
        row.clipped = bool(row.clipped)
    if row.repaired is not None:
        row.repaired = bool(row.repaired)
    return row
