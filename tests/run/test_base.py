"""The warm-up base cache (run/base.py): a damaged file is named, set aside and retrained; a held lock is
announced and times out."""

from __future__ import annotations

import subprocess
import sys

import pytest

from prorl_bench.run.outputs import read_jsonl
from tests.conftest import FAST, make_config, strip_timing


# Audit item 4: corrupt base caches loaded silently (a zero-length file gave a bare EOFError)
def test_a_damaged_base_cache_is_named_set_aside_and_retrained(tmp_path):
    from prorl_bench.run.trainer import train

    cfg = make_config(FAST + ["steps=2"])
    cache = tmp_path / "cache"
    train(cfg, tmp_path / "a", cache)
    base = next(p for p in cache.iterdir() if p.suffix == ".pt")
    good = base.read_bytes()
    base.write_bytes(b"")  # zero-length: used to give a bare "EOFError: "
    with pytest.warns(UserWarning, match=f"{base.name}: SHA-256 mismatch.*retraining"):
        train(cfg, tmp_path / "b", cache)
    assert base.read_bytes() == good and base.with_name(base.name + ".corrupt").exists()
    assert strip_timing(read_jsonl(tmp_path / "b" / "metrics.jsonl")) == strip_timing(
        read_jsonl(tmp_path / "a" / "metrics.jsonl")
    )


# Audit item 17: a held base-cache lock waited silently
def test_a_held_base_lock_is_announced_and_times_out(tmp_path):
    from prorl_bench.run.base import _base_lock

    path = tmp_path / "base.pt"
    holder = subprocess.Popen(
        [sys.executable, "-c", f"from filelock import FileLock; import time; l = FileLock({str(path) + '.lock'!r}); "
         "l.acquire(); print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.warns(UserWarning, match="waiting for .*base.pt.lock"):
            with pytest.raises(TimeoutError, match="base.pt.lock still held"):
                with _base_lock(path, timeout=0.5):
                    pass
    finally:
        holder.kill()
        holder.wait()
    with _base_lock(path):  # free again: taken at once, no warning
        pass
