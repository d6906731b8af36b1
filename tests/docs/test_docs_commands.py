"""Every ``prorl-bench`` / ``prorl-bench-sweep`` command shown in the README and in docs/ still composes and
validates as written.

A command in a page is a promise: a renamed key or a removed option must fail here, not on a reader's
machine. Running every command would take hours, so each one is expanded into its jobs exactly as the CLI
does (``sweep.plan_jobs``: the grid's ``hydra.sweeper.params`` crossed with the command line) and every job
is composed and validated (``sweep.validate_jobs``, the check ``prorl-bench-sweep`` runs before launching).
Commands that name a file the reader must supply (``/path/to/...``, ``<date>``, ``mine.jsonl``) or one
made by an earlier line of the same block (a model under ``/tmp``) are skipped, and the skip list is
printed so it stays visible.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from prorl_bench.cli.sweep import plan_jobs, validate_jobs

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "sweeps" / "README.md"]
PROGRAMS = {"prorl-bench", "prorl-bench-sweep"}
# a command with one of these needs the reader's own file or one an earlier line made: not checkable here
# (hydra/launcher=ray needs the optional ray extra, which CI does not install: docs/sweeps.md)
PLACEHOLDERS = ("/path/to", "<", "...", "…", "DIR", "mine", "/tmp/", "$", "hydra/launcher=slurm", "hydra/launcher=ray")
FLAGS = {"--dry-run", "--no-validate", "-m", "--multirun"}


def _blocks(text: str) -> list[str]:
    return re.findall(r"```(?:bash|sh|shell|console)?\n(.*?)```", text, flags=re.S)


def _commands(page: Path) -> list[str]:
    """Logical command lines (continuations joined, comments cut) of the page's shell blocks."""
    out = []
    for block in _blocks(page.read_text()):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            for part in re.split(r"&&|;", line):
                words = part.strip().split()
                if words and Path(words[0]).name in PROGRAMS:
                    out.append(re.sub(r"\s+", " ", part.strip()))
    return out


def _all_commands() -> list[tuple[str, str]]:
    return [(p.relative_to(ROOT).as_posix(), c) for p in PAGES if p.is_file() for c in _commands(p)]


COMMANDS = _all_commands()


def test_the_pages_show_commands():
    # the extraction itself: a regex that silently matched nothing would make every check below vacuous
    assert len(COMMANDS) >= 15, COMMANDS
    assert any(c.startswith(".venv/bin/prorl-bench-sweep +sweep=ablation_small") for _, c in COMMANDS)


def test_extraction_joins_continuations_and_cuts_comments(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("```bash\nprorl-bench a=1 \\\n    b=2   # note\nls && prorl-bench-sweep c=3\n```\n")
    assert _commands(page) == ["prorl-bench a=1 b=2", "prorl-bench-sweep c=3"]


@pytest.mark.parametrize("page,command", COMMANDS, ids=[f"{p}:{c[:60]}" for p, c in COMMANDS])
def test_documented_command_validates(page, command):
    if any(mark in command for mark in PLACEHOLDERS):
        pytest.skip(f"needs a file of the reader's: {command}")
    args = [a for a in shlex.split(command)[1:] if a not in FLAGS]
    if any(a.startswith("-") for a in args):  # --help, --cfg job, ...: informational, nothing to compose
        pytest.skip(f"informational flags: {command}")
    jobs = plan_jobs(args)
    assert jobs, command
    errors = validate_jobs(jobs)
    assert not errors, f"{page}: `{command}` no longer validates: {errors[:3]}"


@pytest.mark.parametrize("override", ["algo.no_such_key=1", "+algo.no_such_key=1"])
def test_a_stale_command_is_caught(override):
    """The check must be able to fail: a key the schema does not have is refused — by Hydra while the
    jobs are planned (no such key to override) or by validation (a key added with "+") — naming the
    key. Any other exception is a crash and fails this test."""
    from hydra.errors import ConfigCompositionException

    try:
        errors = validate_jobs(plan_jobs([override]))
    except ConfigCompositionException as e:
        assert "algo.no_such_key" in str(e)
        return
    assert errors and "algo.no_such_key" in str(errors)
