"""docs/results.md is generated: regenerating it from the committed study summaries gives the committed
page byte for byte (``prorl-bench-report --docs --check``, the installed entry point, from a temporary
directory holding a copy of the summaries)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REPORT = str(Path(sys.executable).with_name("prorl-bench-report"))


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "docs" / "data" / "studies", tmp_path / "docs" / "data" / "studies")
    shutil.copy(ROOT / "docs" / "results.md", tmp_path / "docs" / "results.md")
    return tmp_path


def test_results_page_regenerates_equal(tmp_path):
    out = subprocess.run([REPORT, "--docs", "--check"], capture_output=True, text=True, cwd=_copy(tmp_path))
    assert out.returncode == 0, f"docs/results.md is stale: run `prorl-bench-report --docs`\n{out.stdout}{out.stderr}"


def test_a_changed_value_changes_the_page(tmp_path):
    """The check is not vacuous: one run's endpoint value moved makes the committed page stale."""
    _copy(tmp_path)
    path = sorted((tmp_path / "docs" / "data" / "studies").glob("*.json"))[0]
    s = json.loads(path.read_text())
    run = next(r for b in s["blocks"].values() for r in b["runs"] if r["group"] != s["baseline"])
    run["values"][s["primary"][0]["metric"]] += 0.25
    path.write_text(json.dumps(s))
    out = subprocess.run([REPORT, "--docs", "--check"], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 1
