"""Every relative link in README.md, docs/ and sweeps/README.md names a file that exists and, with a
``#fragment``, a heading of that file (GitHub's slug rule): a moved section or a renamed page fails here
instead of leaving a reader at a dead link."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "sweeps" / "README.md"]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (``-`` and ``_`` kept), spaces to ``-``."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    seen: dict[str, int] = {}
    out = set()
    for line in text.splitlines():
        if m := re.match(r"#{1,6} (.+)", line):
            s = slug(m.group(1))
            out.add(s if s not in seen else f"{s}-{seen[s]}")
            seen[s] = seen.get(s, 0) + 1
    return out


def links(page: Path) -> list[str]:
    return [t for t in LINK.findall(FENCE.sub("", page.read_text())) if not re.match(r"[a-z]+:", t)]


def test_the_slug_rule():
    assert slug("## `ReferenceResetCallback` in a plain TRL script".lstrip("# ")) == (
        "referenceresetcallback-in-a-plain-trl-script"
    )
    assert slug("The reset map (full factorial, both blocks)") == "the-reset-map-full-factorial-both-blocks"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: {dest.name} has no heading with anchor #{fragment}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


PATHLIKE = re.compile(
    r"`((?:prorl_bench|tests|benchmarks|sweeps|conf|docs|hydra_plugins|\.ci)/[\w./-]+\.(?:py|yaml|md|json|png|sh))`"
)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_named_in_backticks_exists(page):
    """`prorl_bench/run/trainer.py`, `sweeps/sweep/prolonged.yaml`, ...: a path the page names as the
    place to look exists in the repository (relative to its root, or to ``prorl_bench/``)."""
    text = page.read_text()
    missing = []
    for m in PATHLIKE.finditer(text):
        p = m.group(1)
        placeholder = re.search(r"[A-Z]{3,}", p) or "*" in p  # conf/algo/NAME.yaml: a name the reader picks
        to_create = re.search(r"\b(add|create|write)\b[^.`]*$", text[max(0, m.start() - 40) : m.start()])
        if not (placeholder or to_create or (ROOT / p).exists() or (ROOT / "prorl_bench" / p).exists()):
            missing.append(p)
    assert not missing, f"{page.relative_to(ROOT)} names files that do not exist: {sorted(set(missing))}"
