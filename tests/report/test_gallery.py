"""The gallery asks, it does not guess: the codec says whether its reconstructions are made again
or looked up (`codecs.disk_cacheable`), and the disk cache finds them by the sha256 of the bytes
a run sent (`engine.diskcache.PayloadLookup`), without changing the cache."""

from __future__ import annotations

import hashlib
from pathlib import Path

from pytest_satbench.engine.diskcache import DiskCache, PayloadLookup
from pytest_satbench.report.gallery import _Recon


def test_the_disk_cache_finds_what_was_sent_by_its_sha256_and_changes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "recon"
    cache = DiskCache(root, max_bytes=1 << 20)
    sent = b"\xff\xd8jpeg bytes as sent"
    cache.put(DiskCache.key_for("img", "arm", "identity"), sent)
    (entry,) = [f for sub in root.iterdir() for f in sub.iterdir()]
    before = entry.stat().st_mtime_ns
    lookup = PayloadLookup(root)
    assert lookup.get(hashlib.sha256(sent).hexdigest()) == sent
    assert lookup.get("00" * 32) is None
    assert entry.stat().st_mtime_ns == before  # read only: nothing refreshed
    entry.write_bytes(entry.read_bytes()[:-1] + b"?")  # damaged since the index was read
    assert PayloadLookup(root).get(hashlib.sha256(sent).hexdigest()) is None
    assert PayloadLookup(tmp_path / "absent").get("00" * 32) is None
    assert not (tmp_path / "absent").exists() and PayloadLookup(None).get("00" * 32) is None


def test_the_codec_says_whether_the_gallery_makes_it_again(tmp_path: Path) -> None:
    recon = _Recon(tmp_path)
    try:
        assert recon.pipeline("jpeg:quality=10") is not None  # cheap: made again
        assert recon.pipeline("onedpiece:ckpt=/nonexistent/s.bin,nlatent=16") is None  # looked up
        assert recon.pipeline("nosuch:level=3") is None  # not installed here: only looked up
    finally:
        recon.close()
