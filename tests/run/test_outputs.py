"""The run's JSONL files (run/outputs.py): a malformed line names its file and line."""

from __future__ import annotations

import pytest

from prorl_bench.run.outputs import read_jsonl


# Audit item 17: a malformed JSONL line failed with no file or line named
def test_a_malformed_jsonl_line_names_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, oops}\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl, line 2: not valid JSON"):
        read_jsonl(path)
