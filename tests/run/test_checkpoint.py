"""Checkpoints are checksummed: a changed or truncated file is named, a resume falls back to the newest
intact one, and a planted pickle runs no code."""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path

import pytest
import torch

from prorl_bench.run.checkpoint import CorruptFileError, load_verified, save_verified
from prorl_bench.run.outputs import read_jsonl
from tests.conftest import strip_timing


# Audit item 4: corrupt checkpoints loaded silently; errors named no file
def test_checksums_catch_a_changed_tensor_and_name_the_file(tmp_path):
    path = tmp_path / "blob.pt"
    save_verified(path, {"w": torch.ones(4)})
    assert torch.equal(load_verified(path)["w"], torch.ones(4))
    data = bytearray(path.read_bytes())
    data[-40] ^= 0xFF  # one byte of the payload, the file still "loads"
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match="blob.pt: SHA-256 mismatch"):
        load_verified(path)
    path.write_bytes(b"")  # zero-length
    with pytest.raises(CorruptFileError, match="blob.pt"):
        load_verified(path)


def test_resume_falls_back_to_the_newest_intact_checkpoint(run_exp):
    knobs = ["checkpoint.every=2", "checkpoint.keep_last=3"]
    _, full = run_exp(knobs, name="full")
    part = full.parent / "part"
    import shutil

    shutil.copytree(full, part)
    newest = part / "checkpoints" / "step_00000006.pt"
    newest.write_bytes(newest.read_bytes()[:1000])  # truncated by a crash
    (part / "summary.json").unlink()
    with pytest.warns(UserWarning, match="step_00000006.pt: SHA-256 mismatch"):
        run_exp(knobs, name="part")
    assert strip_timing(read_jsonl(part / "metrics.jsonl")) == strip_timing(read_jsonl(full / "metrics.jsonl"))


# Audit item 10: resuming unpickled arbitrary objects from the run directory
class _Payload:
    def __reduce__(self):
        return (Path.write_text, (Path(PLANTED), "pwned"))


PLANTED = ""


def test_a_planted_pickle_does_not_run(tmp_path):
    global PLANTED
    PLANTED = str(tmp_path / "pwned.txt")
    path = tmp_path / "checkpoints" / "step_00000001.pt"
    path.parent.mkdir()
    data = pickle.dumps({"step": 1, "x": _Payload()})
    path.write_bytes(data)
    (tmp_path / "checkpoints" / "step_00000001.pt.sha256").write_text(hashlib.sha256(data).hexdigest())
    with pytest.raises(CorruptFileError, match="step_00000001.pt: cannot be loaded safely"):
        load_verified(path)
    assert not Path(PLANTED).exists()
