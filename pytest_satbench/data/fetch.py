"""`fetch` and `verify`: the benchmarks' official files into the layout the loaders read.

For each source (`sources.py`): read the checksums the source publishes, download every file
(`transfer.download`: Range resume, progress bar), check it (shipped checksum, else published,
else the lock file's first-seen SHA-256), move a plain file to its place or unpack an archive,
and record it in the lock file. A file that fails its check is refused with one line, renamed
`*.rejected` and not unpacked. Downloads are kept in `<root>/.satbench-downloads/` (so an
archive can be re-checked by `verify`) unless `--remove-archives`.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

from pytest_satbench.data.transfer import (
    FetchError,
    Lock,
    Transfer,
    Unreachable,
    download,
    get_json,
    hashes,
    move_into,
    unpack,
)
from pytest_satbench.datasets.sources import (
    HUB,
    SOURCES,
    ZENODO,
    File,
    Source,
    by_name,
    for_benchmark,
)

MIRROR_ENV = "SATBENCH_DATA_MIRROR"
DOWNLOADS = ".satbench-downloads"


def resolve(names: list[str]) -> list[Source]:
    """Benchmark or source names -> their sources, each once, in the order asked."""
    table = by_name()
    picked: list[Source] = []
    for name in names:
        src = table.get(name) or for_benchmark(name)
        if src is None:
            known = sorted({b for s in SOURCES for b in s.benchmarks} | set(table))
            raise FetchError(f"no public source is known for {name!r}; known: {', '.join(known)} "
                             "(the demo makes its own data)")
        if src not in picked:
            picked.append(src)
    return picked


def mirror_base(mirror: str | None) -> str | None:
    base = mirror or os.environ.get(MIRROR_ENV) or None
    return base if base is None or base.endswith("/") else base + "/"


@dataclass
class Fetcher:
    root: Path
    mirror: str | None = None
    remove_archives: bool = False
    out: IO[str] = field(default_factory=lambda: sys.stdout)
    err: IO[str] = field(default_factory=lambda: sys.stderr)
    transfers: list[Transfer] = field(default_factory=list)
    unreachable: str = ""

    def __post_init__(self) -> None:
        self.lock = Lock(self.root)

    def base(self, source: Source) -> str:
        if self.mirror:
            return self.mirror
        # $HF_ENDPOINT: the Hub's own setting for a Hub mirror, which huggingface_hub reads too
        return ZENODO if source.host == "zenodo" else (os.environ.get("HF_ENDPOINT") or HUB).rstrip("/") + "/"

    def url(self, source: Source, path: str, revision: str) -> str:
        url = self.base(source) + source.relpath(path, revision)
        return url + "?download=1" if source.host == "zenodo" and not self.mirror else url

    # ------------------------------------------------------------------ published checksums

    def json(self, url: str) -> Any:
        """A published document, or None: an unreachable host is not fatal here (files
        already put in the downloads folder by hand are still checked against the lock)."""
        try:
            return get_json(url)
        except Unreachable as exc:
            self.unreachable = str(exc)
            return None

    def revision(self, source: Source) -> str:
        pinned = self.lock.data["revisions"].get(source.name)
        if source.host != "hub":
            return ""
        if pinned:
            return str(pinned)
        if len(source.revision) == 40:
            return source.revision
        info = self.json(f"{self.base(source)}api/datasets/{source.record}/revision/{source.revision}")
        sha = info.get("sha") if isinstance(info, dict) else None
        if isinstance(sha, str) and len(sha) == 40:
            self.lock.data["revisions"][source.name] = sha
            return sha
        return source.revision

    def published(self, source: Source, revision: str) -> tuple[dict[str, str], list[File]]:
        """{path: "md5:.."/"sha256:.."} the source publishes, and the files of its listings."""
        sums: dict[str, str] = {}
        listed: list[File] = []
        if source.host == "zenodo":
            doc = self.json(self.base(source) + source.api_path())
            for f in (doc or {}).get("files", []) if isinstance(doc, dict) else []:
                name, checksum = f.get("key") or f.get("filename"), f.get("checksum")
                if isinstance(name, str) and isinstance(checksum, str) and checksum.startswith("md5:"):
                    sums[name] = checksum
            return sums, listed
        # one tree page per folder: the Hub pages a listing past 1,000 entries, far more than
        # these folders hold (LHRS-Bench's images: about a hundred)
        folders = {_parent(f.path) for f in source.files}
        folders |= {lst.path for lst in source.listings}
        for folder in sorted(folders):
            entries = self.json(self.base(source) + source.api_path(folder, revision))
            if not isinstance(entries, list):
                if any(lst.path == folder for lst in source.listings):
                    if self.unreachable:
                        raise Unreachable(self.unreachable)
                    raise FetchError(
                        f"{self.base(source)}{source.api_path(folder, revision)}: cannot list {folder} of "
                        f"{source.record}; a mirror must serve the Hub's tree API for it")
                continue
            for e in entries:
                if not isinstance(e, dict) or e.get("type") != "file":
                    continue
                lfs = e.get("lfs")
                if isinstance(lfs, dict) and isinstance(lfs.get("oid"), str):
                    sums[e["path"]] = "sha256:" + lfs["oid"]
                for lst in source.listings:
                    if lst.path == folder:
                        name = PurePosixPath(e["path"]).name
                        listed.append(File(e["path"], f"{lst.dest}/{name}", size=e.get("size")))
        return sums, listed

    # ------------------------------------------------------------------ fetching

    def staged(self, source: Source, path: str) -> Path:
        return self.root / DOWNLOADS / source.name / path

    def fetch(self, sources: list[Source]) -> None:
        for source in sources:
            self.fetch_source(source)

    def fetch_source(self, source: Source) -> None:
        try:
            revision = self.revision(source)
            sums, listed = self.published(source, revision)
            for f in source.files + tuple(listed):
                self.fetch_file(source, f, revision, sums)
        except Unreachable as exc:
            raise FetchError(self.offline_line(source, str(exc))) from None
        finally:
            self.lock.save()

    def offline_line(self, source: Source, reason: str) -> str:
        rev = self.lock.data["revisions"].get(source.name) or source.revision
        where = ZENODO if source.host == "zenodo" else HUB
        names = " ".join(f.path for f in source.files) + "".join(
            f" and every file of {lst.path}/" for lst in source.listings)
        return (f"cannot reach {reason}. Offline: fetch {names} from {where}{source.relpath('', rev)} "
                f"(or a mirror of it) into {self.root / DOWNLOADS / source.name}/ keeping those paths, "
                f"then rerun; or point --mirror / ${MIRROR_ENV} at a mirror")

    def fetch_file(self, source: Source, f: File, revision: str, sums: dict[str, str]) -> None:
        key = f"{source.name}/{f.path}"
        entry = self.lock.file(key)
        dest = self.root / f.dest
        staged = self.staged(source, f.path)
        done = dest / f.top if f.kind != "file" else dest
        if entry and done.exists() and (f.kind != "file" or dest.stat().st_size == entry.get("size")):
            self.err.write(f"{key}: already here ({entry.get('verified')})\n")
            return
        if not staged.is_file():
            if source.host == "hub" and not self.mirror and _hub_available():
                _hub_download(source, f.path, revision, staged, self.root / DOWNLOADS / "_hub" / source.name)
            else:
                t = download(self.url(source, f.path, revision), staged, label=key, progress=self.err)
                self.transfers.append(t)
        sha, md5 = hashes(staged)
        expected, origin = (f.checksum, "the checksum shipped with pytest-satbench") if f.checksum else (
            sums.get(f.path), f"the checksum {source.host.capitalize()} publishes")
        verified = "first-seen"
        if expected:
            algo, want = expected.split(":", 1)
            got = md5 if algo == "md5" else sha
            if got != want.lower():
                self.reject(staged, f"{key}: {algo.upper()} {got} differs from {origin} ({want})")
            verified = algo
        if entry and entry.get("sha256") != sha:
            seen = "first seen" if entry.get("verified") == "first-seen" else "recorded"
            self.reject(staged, f"{key}: SHA-256 {sha} differs from the one {seen} ({entry.get('sha256')}, "
                                f"{self.lock.path}); if the source really changed, remove its entry there")
        if f.kind == "file":
            move_into(staged, dest)
        else:
            count = unpack(staged, f.kind, dest, f.top, f.members)
            self.err.write(f"{key}: unpacked {count} files into {dest / f.top}\n")
        if entry and verified == "first-seen":  # a file checked once keeps how it was checked
            verified = str(entry.get("verified", verified))
        size = (staged if staged.exists() else dest).stat().st_size
        self.lock.put(key, {"sha256": sha, "size": size, "verified": verified,
                            "dest": f.dest, "kind": f.kind, "top": f.top, "revision": revision})
        self.lock.save()
        if f.kind != "file" and self.remove_archives:
            staged.unlink()

    def reject(self, staged: Path, line: str) -> None:
        rejected = staged.with_name(staged.name + ".rejected")
        staged.replace(rejected)
        raise FetchError(f"{line}; refused, not unpacked (kept as {rejected})")


# ---------------------------------------------------------------------------------- verify

COMPLETE, FIRST_SEEN, MISSING, CHANGED = "complete", "unverified-first-seen", "missing files", "changed files"


def verify(root: Path, sources: list[Source]) -> list[tuple[str, str, list[str]]]:
    """Per benchmark: (name, state, details). Nothing is downloaded: plain files and kept
    archives are hashed against the lock file; unpacked folders and the loaders' own
    required paths (`Benchmark.missing`) are looked for."""
    from pytest_satbench.datasets.registry import get

    lock = Lock(root)
    results: list[tuple[str, str, list[str]]] = []
    for source in sources:
        missing: list[tuple[str, str]] = []  # (file path in the source, what is missing)
        changed: list[tuple[str, str]] = []
        first_seen: list[tuple[str, str]] = []
        files = list(source.files)
        for key, entry in sorted(lock.data["files"].items()):
            path = key.split("/", 1)[1]
            if key.startswith(source.name + "/") and all(f.path != path for f in files):
                files.append(File(path, entry.get("dest", ""), kind=entry.get("kind", "file")))
        for f in files:
            key = f"{source.name}/{f.path}"
            entry = lock.file(key)
            target = root / f.dest
            if f.kind == "file":
                if not target.is_file():
                    missing.append((f.path, str(target)))
                    continue
                check = target
            else:
                if not (target / f.top).is_dir():
                    missing.append((f.path, str(target / f.top)))
                    continue
                check = root / DOWNLOADS / source.name / f.path
                if not check.is_file():
                    check = None  # removed after unpacking: its folder is there, nothing to hash
            if entry is None:
                first_seen.append((f.path, f"{key} (not in {lock.path.name}: nothing to check it against)"))
                continue
            if check is not None and hashes(check)[0] != entry.get("sha256"):
                changed.append((f.path, f"{check} (SHA-256 differs from {lock.path.name})"))
            elif entry.get("verified") == "first-seen":
                first_seen.append((f.path, key))
        needs = {f.path for f in files if not f.only}
        for name in source.benchmarks:
            mine = needs | {f.path for f in files if name in f.only}
            own = {kind: [d for p, d in found if p in mine]
                   for kind, found in ((MISSING, missing), (CHANGED, changed), (FIRST_SEEN, first_seen))}
            # what the loader itself looks for, when every file of the table is there
            gone = own[MISSING] or [str(p) for p in get(name).missing(root)]
            if gone:
                results.append((name, MISSING, gone))
            elif own[CHANGED]:
                results.append((name, CHANGED, own[CHANGED]))
            elif own[FIRST_SEEN]:
                results.append((name, FIRST_SEEN, own[FIRST_SEEN]))
            else:
                results.append((name, COMPLETE, []))
    return results


def _parent(path: str) -> str:
    parent = str(PurePosixPath(path).parent)
    return "" if parent == "." else parent


def _hub_available() -> bool:
    try:
        import huggingface_hub  # noqa: F401  (the optional `hub` extra)
    except ImportError:
        return False
    return True


def _hub_download(source: Source, path: str, revision: str, staged: Path, hub_dir: Path) -> None:
    """Through `huggingface_hub` (installed: the `hub` extra) when no mirror is set: its own
    resume, progress and token handling; the file is checked here afterwards like any other."""
    from huggingface_hub import hf_hub_download

    got = hf_hub_download(source.record, path, repo_type="dataset", revision=revision,
                          local_dir=hub_dir)
    staged.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(got, staged)


def source_rows() -> list[dict[str, Any]]:
    """The table for `list` and docs/data.md: one row per file."""
    rows = []
    for s in SOURCES:
        for f in s.files + tuple(File(lst.path + "/*", lst.dest) for lst in s.listings):
            rows.append({
                "source": s.name, "benchmarks": ", ".join(s.benchmarks),
                "url": (ZENODO if s.host == "zenodo" else HUB) + s.relpath(f.path),
                "dest": f.dest + (f"/{f.top}" if f.top else ""),
                "checksum": f.checksum or ("none shipped (none known); Zenodo's MD5 from its record API, "
                                           "else the first-seen SHA-256" if s.host == "zenodo" else
                                           "none shipped (none known); the Hub's LFS SHA-256 from its tree API, "
                                           "else the first-seen SHA-256"),
            })
    return rows
