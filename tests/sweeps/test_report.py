"""``prorl-bench-report``: one self-contained HTML file, opened in a real headless browser (Chromium from
the operating system, driven by Playwright) with the network off: no console error, every figure
rendered, the study's verdict table with both blocks and its rows, provenance and the commands.

Without Chromium (``/usr/bin/chromium``; ``apt-get install chromium``) or the ``playwright`` package the
browser test is skipped with the reason, except under CI (``CI`` set), where it fails instead."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from prorl_bench.sweeps import report
from tests.run.test_provenance import _prov
from tests.sweep_factory import metric_rows, write_multirun_yaml, write_run

# slow: the fixture draws the real figures (seaborn) for 24 runs, and the browser starts (~10-40 s loaded)
pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
STUDY = {
    "question": "Does the transform change success?",
    "primary": [{"metric": "success_final", "direction": "higher", "margin": 0.03}],
    "baseline": "keep",
    "blocks": {"explore": "range(0,4)", "confirm": "range(4,8)"},
}
ARMS = {"keep": 0.0, "hard": -0.1, "soft": 0.0}


def _block(d: Path, seeds: range, block: str) -> None:
    d.mkdir()
    fixed = ["steps=10"] + ([f"study.block={block}"] if block != "explore" else [])
    write_multirun_yaml(d, {"opt_reset": ",".join(ARMS), "seed": ",".join(map(str, seeds))}, fixed)
    events = [{"step": 4, "event": "reset", "reason": "periodic"}]
    for seed in seeds:
        level = 0.3 + 0.05 * seed
        for arm, effect in ARMS.items():
            cfg = {"seed": seed, "steps": 10, "study": {**STUDY, "block": block}}
            write_run(
                d, [f"opt_reset={arm}", f"seed={seed}", *fixed],
                metrics=metric_rows([level] * 5 + [level + effect] * 5), events=events, config=cfg,
                summary={"status": "completed", "steps_completed": 10, "provenance": _prov()},
            )  # fmt: skip


@pytest.fixture(scope="module")
def study_report(tmp_path_factory) -> tuple[Path, str]:
    """The report of an explore and a confirm block, made by the installed entry point from a
    directory outside the checkout (no PYTHONPATH)."""
    tmp = tmp_path_factory.mktemp("report")
    _block(tmp / "explore", range(4), "explore")
    _block(tmp / "confirm", range(4, 8), "confirm")
    exe = str(Path(sys.executable).with_name("prorl-bench-report"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([exe, "explore", "confirm", "--out", "out"], cwd=tmp, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    path = tmp / "out" / report.REPORT
    assert out.stdout.strip().endswith(f"report: {path}")
    return path, path.read_text()


def test_the_report_is_one_self_contained_file(study_report):
    path, text = study_report
    # no resource outside the file: every src/href is inline data (or an anchor), no URL at all
    refs = re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)""", text)
    assert refs and all(r.startswith(("data:image/png;base64,", "#")) for r in refs), refs
    assert "http://" not in text and "https://" not in text and "<script" not in text
    pngs = sorted(p.name for p in path.parent.glob("*.png"))  # the PNGs stay for scripts, and are all inlined
    assert pngs and text.count("data:image/png;base64,") == len(pngs)
    for name in ("runs.csv", "groups.csv", "table.md"):
        assert (path.parent / name).is_file()
    assert "prorl-bench-report" in text and "git checkout " + "a" * 40 in text  # the commands, the commit


def _browser_or_skip():
    why = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        why, sync_playwright = "the playwright package is not installed (pip install -e '.[dev]')", None
    if why is None and not os.access(CHROMIUM, os.X_OK):
        why = f"{CHROMIUM} is missing (apt-get install chromium)"
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser test: {why}")
        pytest.skip(why)
    return sync_playwright


def test_the_report_renders_in_a_headless_browser_offline(study_report, tmp_path):
    sync_playwright = _browser_or_skip()
    path, _ = study_report
    args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
    errors, requests = [], []
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, args=args, headless=True, offline=True
        )
        try:
            page = ctx.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(path.as_uri(), wait_until="load")
            images = page.eval_on_selector_all(  # decode() rejects an image the browser cannot decode whole
                "img", "els => Promise.all(els.map(e => e.decode().then(() => true, () => false)"
                ".then(ok => [e.alt, ok && e.complete, e.naturalWidth])))",
            )  # fmt: skip
            head = page.eval_on_selector_all("#study table thead th", "els => els.map(e => e.textContent)")
            rows = page.eval_on_selector_all(
                "#study table tbody tr", "els => els.map(r => Array.from(r.cells, c => c.textContent))"
            )
            headings = page.eval_on_selector_all("h2, h3, h4", "els => els.map(e => e.textContent)")
        finally:
            ctx.close()
    assert errors == []
    assert [u for u in requests if not u.startswith(("file:", "data:"))] == []
    pngs = sorted(p.name for p in path.parent.glob("*.png"))
    assert sorted(alt for alt, _, _ in images) == pngs
    assert all(complete and width > 0 for _, complete, width in images), images
    assert any("explore" in h for h in head) and any("confirm" in h for h in head) and head[-1] == "replication"
    assert sorted((r[0], r[1]) for r in rows) == [("hard", "Δ success"), ("soft", "Δ success")]
    table_md = (path.parent / "table.md").read_text()  # the browser shows the aggregator's verdicts, cell for cell
    assert all("| " + " | ".join(r) + " |" in table_md for r in rows) and all("→" in r[2] for r in rows)
    assert headings[0].startswith("Study: Does the transform change success?")  # the question comes first
    assert any(h.startswith("Runs (") for h in headings) and "Provenance (per group)" in headings
    assert "Reproduce" in headings
