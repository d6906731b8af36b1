"""The cgroup layer's files (prorl_bench/tasks/sandbox/cgroup.py) on a fake cgroup tree: which hierarchy is
chosen, what a sample's group is given, how its memory-limit counters are read. The real v1 hierarchy is
exercised by tests/tasks/test_sandbox_v3.py; cgroup v2 is only checked here (this project's VMs have no v2
controllers)."""

from __future__ import annotations

import pytest

import prorl_bench.tasks.sandbox.cgroup as cg


def fake(monkeypatch, tmp_path, mounts, own):
    monkeypatch.setattr(cg, "_mounts", lambda: mounts)
    monkeypatch.setattr(cg, "_own_paths", lambda: own)


def test_v2_is_used_where_the_controllers_are_delegated(monkeypatch, tmp_path):
    d = tmp_path / "unified" / "job"
    d.mkdir(parents=True)
    (d / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (d / "cgroup.subtree_control").write_text("cpu memory pids\n")
    fake(monkeypatch, tmp_path, [(str(tmp_path / "unified"), "cgroup2", set())], {"": "/job"})
    layout, why = cg.find_layout()
    assert (layout.version, why) == (2, "") and set(layout.parents.values()) == {str(d)}
    g = cg.SampleCgroup(layout, "u7")
    g.create(256 * 2**20, 64)
    sample = d / g.name
    # pids.max: the sample's 64 and its runner, which joins the one group
    want = {"memory.max": "268435456", "memory.swap.max": "0", "memory.oom.group": "1", "pids.max": "65",
            "cpu.weight": "100"}  # fmt: skip
    assert {k: (sample / k).read_text() for k in want} == want
    assert g.procs_files() == g.runner_files() == [f"{sample}/cgroup.procs"]
    (sample / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n")
    assert g.limit_hits() == 4  # 3 refused charges + 1 OOM kill
    assert g.cpu_counters() == [(f"{sample}/cpu.stat", "usage_usec", 1e-6)]


def test_v2_without_delegation_falls_back_to_v1_or_says_why(monkeypatch, tmp_path):
    d = tmp_path / "unified"
    d.mkdir()
    (d / "cgroup.controllers").write_text("cpu memory pids\n")
    (d / "cgroup.subtree_control").write_text("\n")
    mounts = [(str(d), "cgroup2", set())]
    for c in cg.V1_CONTROLLERS:
        (tmp_path / c).mkdir()
        mounts.append((str(tmp_path / c), "cgroup", {"rw", c}))
    fake(monkeypatch, tmp_path, mounts, {"": "/", **{c: "/" for c in cg.V1_CONTROLLERS}})
    layout, _ = cg.find_layout()
    assert layout.version == 1 and layout.parents["pids"] == str(tmp_path / "pids") + "/"
    g = cg.SampleCgroup(layout, "u8")
    g.create(2**28, 32)
    m = tmp_path / "memory" / g.name
    assert (m / "memory.limit_in_bytes").read_text() == str(2**28)
    assert (tmp_path / "pids" / g.name / "pids.max").read_text() == "32"
    assert (tmp_path / "cpu" / g.name / "cpu.shares").read_text() == "1024"
    (m / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    (m / "memory.failcnt").write_text("5\n")
    assert g.limit_hits() == 7
    assert g.cpu_counters() == [(f"{tmp_path}/cpuacct/{g.name}/cpuacct.usage", "", 1e-9)]
    assert g.runner_files() == [f"{tmp_path}/{c}/{g.name}/cgroup.procs" for c in ("cpu", "cpuacct")]  # CPU only
    fake(monkeypatch, tmp_path, mounts[:2], {"": "/", "memory": "/"})  # no pids, no cpu hierarchy
    assert cg.find_layout() == (None, f"cgroup2 {d}/: controllers not delegated to children (cgroup.subtree_control: "
                                      "[]); cgroup v1: no pids hierarchy")  # fmt: skip


@pytest.mark.parametrize("text,key,want", [("oom_kill 4\n", "oom_kill", 4), ("12\n", "", 12), ("x 1\n", "y", 0)])
def test_read_counter(text, key, want):
    assert cg.read_counter(text, key) == want
