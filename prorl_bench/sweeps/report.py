"""The HTML report (``prorl-bench-report DIR [DIR ...]``, report_cli.py): one self-contained HTML file
for a sweep (or an explore and a confirm block read together) that opens offline in any browser and
can be sent to a colleague.

It holds what the aggregator's tables hold — the study's question and its verdict table with both
blocks, the comparison tables, the per-seed runs, the provenance per group and the warnings about it —
and the figures inline (base64 PNG), and the exact commands that reproduce it. No script, no external
URL: everything is in the one file. The aggregator writes it next to its tables (``report.html``) at
the end of every sweep; the tables and PNGs stay as they are for scripts.
"""

from __future__ import annotations

import base64
import html
import json
import re
import shlex
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prorl_bench.run.outputs import atomic_write_text
from prorl_bench.sweeps.provenance_check import field, run_provenance
from prorl_bench.sweeps.sweepdir import SweepDirError, recorded_command

# ``res`` below is an ``aggregate.AggregateResult`` (sweep, markdown, figures, provenance_warnings, out_dir);
# not imported: the aggregator calls this module, never the reverse
AggregateResult = Any

REPORT = "report.html"

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2rem auto;max-width:1200px;
padding:0 1rem;color:#1a1a1a;line-height:1.45}
h1{font-size:1.6rem}h2{font-size:1.3rem;border-bottom:1px solid #ddd;padding-bottom:.2rem;margin-top:2rem}
h3{font-size:1.1rem;margin-top:1.5rem}
table{border-collapse:collapse;margin:.6rem 0;font-size:.85rem;display:block;overflow-x:auto}
th,td{border:1px solid #ccc;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#f3f3f3}tr:nth-child(even) td{background:#fafafa}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:.85rem}
pre{background:#f6f8fa;padding:.6rem;overflow-x:auto;border:1px solid #e1e4e8}
.warning{background:#fff4e5;border-left:4px solid #f0a020;padding:.4rem .8rem;margin:.4rem 0}
figure{margin:1rem 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.85rem;color:#555}
"""


def _inline(text: str) -> str:
    """Escape ``text`` for HTML; `code` spans become <code>."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(
        f"<code>{html.escape(p[1:-1])}</code>"
        if p.startswith("`") and p.endswith("`") and len(p) > 1
        else html.escape(p)
        for p in parts
    )


def _cells(line: str) -> list[str]:
    """The cells of a Markdown table row ('|' inside a cell is escaped as '\\|')."""
    inner = line.strip()[1:-1]
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", inner)]


def _table(lines: list[str]) -> str:
    head = _cells(lines[0])
    body = [_cells(ln) for ln in lines[2:]]
    out = ["<table><thead><tr>", *[f"<th>{_inline(h)}</th>" for h in head], "</tr></thead><tbody>"]
    for row in body:
        out += ["<tr>", *[f"<td>{_inline(c)}</td>" for c in row], "</tr>"]
    out.append("</tbody></table>")
    return "".join(out)


def markdown_to_html(md: str) -> str:
    """The subset of Markdown the aggregator writes: headings, tables, bullet lists, paragraphs.
    Each ``##``/``###`` heading opens a <section> whose id names it (``study`` for the study's verdicts)."""
    out: list[str] = []
    lines = md.splitlines()
    i, open_section, ids = 0, False, set()
    while i < len(lines):
        line = lines[i]
        if line.startswith("|"):
            j = i
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            out.append(_table(lines[i:j]))
            i = j
            continue
        if line.startswith("- "):
            items = []
            while i < len(lines) and lines[i].startswith("- "):
                items.append(f"<li>{_inline(lines[i][2:])}</li>")
                i += 1
            out.append("<ul>" + "".join(items) + "</ul>")
            continue
        m = re.match(r"(#{2,4}) (.*)", line)
        if m:
            level = len(m.group(1)) + 1  # the report's own title is the only <h1>
            if level == 4 or level == 3:
                if open_section:
                    out.append("</section>")
                sid = base = _section_id(m.group(2))
                while sid in ids:  # ids are unique (one per block when a heading repeats)
                    sid = f"{base}-{len(ids)}"
                ids.add(sid)
                out.append(f'<section id="{sid}">')
                open_section = True
            out.append(f"<h{level}>{_inline(m.group(2))}</h{level}>")
        elif line.startswith("Note: WARNING: "):
            out.append(f'<p class="warning">{_inline(line[len("Note: ") :])}</p>')
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
        i += 1
    if open_section:
        out.append("</section>")
    return "\n".join(out)


def _section_id(title: str) -> str:
    if title.startswith("Study:"):
        return "study"
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:60] or "section"


def _figures(paths: Sequence[Path]) -> str:
    out = []
    for p in paths:
        data = base64.b64encode(Path(p).read_bytes()).decode()
        name = html.escape(Path(p).name)
        out.append(
            f'<figure><img src="data:image/png;base64,{data}" alt="{name}"><figcaption>{name}</figcaption></figure>'
        )
    return "\n".join(out) or "<p>No figures (none drawn: no run logged a step, or figures were turned off).</p>"


def _distinct(values: Sequence[Any]) -> list[Any]:
    return [v for v in dict.fromkeys(v for v in values if v is not None)]


def reproduce_commands(res: AggregateResult, out_dir: Path) -> list[str]:
    """Shell lines that reproduce the report: the code, each sweep's command, then the report."""
    provs = [run_provenance(r.summary) for r in res.sweep.runs]
    provs = [p for p in provs if p]
    lines: list[str] = []
    commits = _distinct([field(p, ("bench", "commit")) for p in provs])
    versions = _distinct([field(p, ("bench", "version")) for p in provs])
    if len(commits) == 1:
        lines.append(f"git checkout {commits[0]}  # the bench's commit these runs were made from")
        if any(field(p, ("bench", "dirty")) for p in provs):
            lines.append(
                "# WARNING: some runs were made from a modified tree (bench.dirty): "
                "this commit alone does not reproduce them"
            )
        lines.append("pip install -e '.[dev]'")
    elif commits:
        lines.append(f"# the runs come from {len(commits)} commits: {', '.join(c[:12] for c in commits)}")
    elif versions:
        lines.append(f"pip install prorl-bench=={versions[0]}  # an installed package (no git checkout recorded)")
    dirs = res.sweep.dirs if hasattr(res.sweep, "dirs") else [res.sweep.sweep_dir]
    for d in dirs:
        try:
            args, cwd = recorded_command(d)
        except SweepDirError as e:
            lines.append(f"# {d}: no recorded command ({e})")
            continue
        fresh = [a for a in args if not a.startswith("hydra.sweep.dir=")]
        if cwd is not None:
            lines.append(f"cd {shlex.quote(str(cwd))}")
        lines.append("prorl-bench-sweep " + " ".join(shlex.quote(a) for a in fresh) + "  # a fresh sweep directory")
    typed = _distinct([" ".join(shlex.quote(a) for a in p.get("command") or []) or None for p in provs])
    for t in typed:
        lines.append(f"# as typed: {t}")
    lines.append(
        "prorl-bench-report " + " ".join(shlex.quote(str(d)) for d in dirs) + f" --out {shlex.quote(str(out_dir))}"
    )
    return lines


def _provenance_details(res: AggregateResult) -> str:
    """The full provenance of the first run of each group (every field, as recorded)."""
    shown: dict[str, dict[str, Any]] = {}
    for r in res.sweep.runs:
        p = run_provenance(r.summary)
        label = r.group or ",".join(f"{k}={v}" for k, v in r.overrides.items() if k != "seed")
        if p and label not in shown:
            shown[label] = p
    parts = []
    for label, p in shown.items():
        text = json.dumps(p, indent=2, sort_keys=True)
        parts.append(
            f"<details><summary>{_inline(label or 'all runs')}</summary><pre>{html.escape(text)}</pre></details>"
        )
    return "\n".join(parts) or "<p>No run recorded its provenance.</p>"


def _study_first(md: str) -> list[str]:
    """The study's question and verdict table first, then every other table in the aggregator's order."""
    m = re.search(r"^### Study:.*?(?=^### |\Z)", md, flags=re.S | re.M)
    if m is None:
        return [markdown_to_html(md)]
    return [markdown_to_html(m.group(0)), markdown_to_html(md[: m.start()] + md[m.end() :])]


def render(res: AggregateResult, out_dir: Path) -> str:
    """The whole HTML document for an aggregation result."""
    dirs = res.sweep.dirs if hasattr(res.sweep, "dirs") else [res.sweep.sweep_dir]
    title = "prorl-bench report: " + ", ".join(Path(d).name for d in dirs)
    warnings = "".join(f'<p class="warning">WARNING: {_inline(w)}</p>' for w in res.provenance_warnings)
    body = [
        f"<h1>{html.escape(title)}</h1>",
        f"<p>Generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC from "
        + ", ".join(f"<code>{html.escape(str(d))}</code>" for d in dirs)
        + ".</p>",
        warnings,
        *_study_first(res.markdown),
        '<section id="figures"><h2>Figures</h2>',
        _figures(res.figures),
        "</section>",
        '<section id="provenance-details"><h2>Provenance of each group (first run)</h2>',
        _provenance_details(res),
        "</section>",
        '<section id="reproduce"><h2>Reproduce</h2>',
        "<pre>" + html.escape("\n".join(reproduce_commands(res, out_dir))) + "</pre>",
        "</section>",
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def write_report(res: AggregateResult, out_dir: Path | None = None) -> Path:
    """Write ``report.html`` into ``out_dir`` (default: the aggregation's output directory)."""
    out = Path(out_dir) if out_dir is not None else Path(res.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = (out / REPORT).resolve()  # printed: absolute, to open from anywhere
    atomic_write_text(path, render(res, out))
    return path
