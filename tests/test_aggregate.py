"""The aggregator on synthetic sweep directories whose statistics are known in advance."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from omegaconf import OmegaConf

from prorl_bench import aggregate as agg
from prorl_bench.sweepdir import SweepDirError, load_sweep

from .sweep_factory import metric_rows, write_multirun_yaml, write_run

OK = {"status": "completed"}

T975_DF2 = 4.3026527  # Student t, 97.5% quantile, 2 degrees of freedom


@pytest.fixture
def sweep_dir(tmp_path):
    """A1: 3 completed seeds with constant rewards 0.2/0.4/0.6; B: completed, failed, incomplete, preempted;
    C: in the grid of multirun.yaml but never started (missing)."""
    d = tmp_path / "sweep"
    d.mkdir()
    write_multirun_yaml(d, {"variant": "A1,B,C", "seed": "0,1,2"}, ["+sweep=ablation", "steps=10"])
    for seed, r in enumerate([0.2, 0.4, 0.6]):
        write_run(
            d,
            ["variant=A1", f"seed={seed}", "+sweep=ablation", "steps=10"],
            metrics=metric_rows([r] * 10),
            validation=[{"step": 5, "val/success_sampled": 0.0}, {"step": 10, "val/success_sampled": r + 0.1}],
            summary={"status": "completed", "error": None, "wall_time_s": 3.0 + seed},
        )
    write_run(
        d,
        ["variant=B", "seed=0", "+sweep=ablation", "steps=10"],
        metrics=metric_rows([0.3] * 10, kl=None, ref_fwd=0, ref_tokens=0, ref_time=0.0),
        summary={"status": "completed", "error": None},
    )
    write_run(
        d,
        ["variant=B", "seed=1", "+sweep=ablation", "steps=10"],
        summary={"status": "failed", "error": "ConfigError: invalid config value seed=-1\ntraceback..."},
    )
    write_run(d, ["variant=B", "seed=2", "+sweep=ablation", "steps=10"], metrics=metric_rows([0.9] * 3))
    write_run(
        d,
        ["variant=B", "seed=3", "+sweep=ablation", "steps=10"],
        metrics=metric_rows([0.9] * 4),
        summary={"status": "preempted", "error": None, "steps_completed": 4},
    )
    return d


def _group(res, name):
    return res.groups.set_index("group").loc[name]


def test_group_statistics_match_hand_computed_values(sweep_dir):
    res = agg.aggregate(sweep_dir, threshold=0.5, window=5, figures=False)
    a1 = _group(res, "A1")
    assert a1["n_completed"] == 3 and a1["n_runs"] == 3
    ci = T975_DF2 * 0.2 / math.sqrt(3)  # s = 0.2 over (0.2, 0.4, 0.6)
    for m in ("success_final", "reward_auc", "reward_final"):
        assert a1[f"{m}_mean"] == pytest.approx(0.4)
        assert a1[f"{m}_ci95"] == pytest.approx(ci, rel=1e-6)
        assert a1[f"{m}_n"] == 3
    assert a1["val_success_final_mean"] == pytest.approx(0.5)
    # only seed 2 (0.6) reaches 0.5; with a 5-step window the first full window ends at step 5
    assert a1["steps_to_threshold_n"] == 1
    assert a1["steps_to_threshold_mean"] == 5.0
    assert a1["time_to_threshold_s_mean"] == pytest.approx(0.5)  # 5 steps x 0.1 s
    assert a1["ref_share_pct_mean"] == pytest.approx(20.0)
    assert a1["time_per_step_ms_mean"] == pytest.approx(100.0)
    assert a1["ref_fwd_per_step_mean"] == 1.0 and a1["ref_tokens_per_step_mean"] == 100.0
    assert a1["kl_mean_mean"] == pytest.approx(0.5) and a1["kl_max_mean"] == pytest.approx(0.5)
    assert a1["wall_time_s_mean"] == pytest.approx(4.0)


def test_failed_incomplete_and_missing_runs_are_reported_not_dropped(sweep_dir):
    res = agg.aggregate(sweep_dir, figures=False)
    b = _group(res, "B")
    assert (b["n_runs"], b["n_completed"], b["n_failed"], b["n_incomplete"], b["n_preempted"]) == (4, 1, 1, 1, 1)
    assert b["success_final_n"] == 1 and b["success_final_mean"] == pytest.approx(0.3)  # completed only
    assert math.isnan(b["kl_mean_mean"])  # no reference in B
    c = _group(res, "C")
    assert (c["n_runs"], c["n_missing"], c["n_completed"]) == (3, 3, 0)
    runs = res.runs.set_index(["group", "seed"])
    assert runs.loc[("B", "1"), "status"] == "failed"
    assert runs.loc[("B", "1"), "error"] == "ConfigError: invalid config value seed=-1"
    assert runs.loc[("B", "2"), "status"] == "incomplete"
    assert runs.loc[("B", "2"), "steps_logged"] == 3
    assert "after 3 logged steps" in runs.loc[("B", "2"), "error"]
    assert runs.loc[("B", "3"), "status"] == "preempted"
    assert runs.loc[("B", "3"), "error"] == "preempted after 4 steps; re-run to resume"
    assert len(res.runs) == 10
    md = res.markdown
    assert "| B | 1/4 ok, 1 failed, 1 preempted, 1 incomplete |" in md
    assert "| C | 0/3 ok, 3 missing |" in md
    assert "ConfigError: invalid config value seed=-1" in md
    on_disk = pd.read_csv(res.out_dir / "runs.csv")
    expected = ["completed"] * 4 + ["failed", "incomplete", "preempted"] + ["missing"] * 3
    assert sorted(on_disk["status"]) == sorted(expected)


def test_groups_vary_without_seed_and_grid_name(sweep_dir):
    sweep = load_sweep(sweep_dir)
    assert sweep.group_keys == ["variant"]
    assert sweep.fixed == {"sweep": "ablation", "steps": "10"}


def test_several_varied_keys_make_readable_labels(tmp_path):
    for kl in ("k2", "k3"):
        for beta in ("0.01", "0.1"):
            write_run(
                tmp_path,
                [f"kl_estimator={kl}", f"algo.beta={beta}", "seed=0"],
                metrics=metric_rows([0.5] * 4),
                summary={"status": "completed"},
            )
    res = agg.aggregate(tmp_path, figures=False)
    assert set(res.groups["group"]) == {f"kl_estimator={k}, beta={b}" for k in ("k2", "k3") for b in ("0.01", "0.1")}
    assert list(res.groups.columns[:3]) == ["group", "kl_estimator", "algo.beta"]


def test_post_event_windows(tmp_path):
    rewards = [0.8] * 4 + [0.2, 0.5, 0.9, 0.9]
    events = [
        {"step": 0, "event": "start", "reason": "run"},
        {"step": 4, "event": "reset", "reason": "periodic", "v_norm_before": 2.0, "v_norm_after": 0.5},
        {"step": 6, "event": "growth", "reason": "schedule"},
    ]
    write_run(
        tmp_path, ["variant=C", "seed=0"], metrics=metric_rows(rewards), events=events, summary=OK, config=_cfg(0)
    )
    write_run(tmp_path, ["variant=A1", "seed=0"], metrics=metric_rows([0.8] * 8), summary=OK, config=_cfg(0))
    res = agg.aggregate(tmp_path, window=1, figures=False)
    c, a1 = _group(res, "C"), _group(res, "A1")
    assert c["n_resets_mean"] == 1 and c["n_growths_mean"] == 1
    assert c["post_reward_mean"] == pytest.approx((0.2 + 0.9) / 2)  # steps 5 and 7 (W=1)
    assert c["v_norm_ratio_mean"] == 0.25
    assert a1["n_resets_mean"] == 0 and math.isnan(a1["post_reward_mean"])  # no events, no window
    cmp = res_comparisons(res)
    # the same window as the per-run figure (W=1): step 5 minus A1's 0.8, step 7 minus 0.8
    assert cmp[("C", "post_reward_vs_baseline")]["diff"] == pytest.approx(((0.2 - 0.8) + (0.9 - 0.8)) / 2)
    assert "W=1 steps" in res.markdown and "W=5" not in res.markdown
    # the default window (5): reset at 4 -> steps 5-8 minus A1's 0.8; growth at 6 -> steps 7-8
    cmp5 = res_comparisons(agg.aggregate(tmp_path, out_dir=tmp_path / "w5", figures=False))
    expected = ((0.2 + 0.5 + 0.9 + 0.9) / 4 - 0.8 + 0.9 - 0.8) / 2
    assert cmp5[("C", "post_reward_vs_baseline")]["diff"] == pytest.approx(expected)


def res_comparisons(res) -> dict:
    table = pd.read_csv(res.out_dir / "comparisons.csv")
    return {(r["group"], r["metric"]): r for _, r in table.iterrows()}


def test_cli_writes_tables_and_figures(sweep_dir, capsys):
    assert agg.main([str(sweep_dir)]) == 0
    out = capsys.readouterr().out
    assert "| A1 | 3/3 ok |" in out
    files = {p.name for p in (sweep_dir / "aggregate").iterdir()}
    assert {"runs.csv", "groups.csv", "table.md", "curves.png", "stage_time.png", "reference_cost.png"} <= files
    for name in ("curves.png", "stage_time.png", "reference_cost.png"):
        assert (sweep_dir / "aggregate" / name).read_bytes()[:4] == b"\x89PNG"


def test_malformed_sweep_dirs_fail_loudly(tmp_path, capsys):
    with pytest.raises(SweepDirError, match="does not exist"):
        load_sweep(tmp_path / "nope")
    with pytest.raises(SweepDirError, match="no run directories"):
        load_sweep(tmp_path)
    run = write_run(tmp_path, ["seed=0"], metrics=metric_rows([0.1, 0.2, 0.3]), summary={"status": "completed"})
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text(lines[0] + "\n" + lines[1][:20] + "\n" + lines[2] + "\n")
    with pytest.raises(SweepDirError, match="metrics.jsonl: malformed JSONL"):
        load_sweep(tmp_path)
    assert agg.main([str(tmp_path)]) == 2
    assert "malformed JSONL" in capsys.readouterr().err
    # a torn *last* line (a job killed mid-write) is tolerated, and said so
    (run / "metrics.jsonl").write_text(lines[0] + "\n" + lines[1] + "\n" + lines[2][:15])
    with pytest.warns(UserWarning, match="torn last line"):
        assert load_sweep(tmp_path).runs[0].metrics.shape[0] == 2
    (run / "summary.json").write_text('{"status": "done"}')
    with pytest.raises(SweepDirError, match="status completed\\|failed\\|preempted"):
        load_sweep(tmp_path)


def test_callback_records_sweep_dir_and_prints_table(sweep_dir, tmp_path, monkeypatch, capsys):
    marker = tmp_path / "marker"
    monkeypatch.setenv(agg.SWEEP_DIR_FILE_ENV, str(marker))
    cfg = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep_dir)}}})
    cb = agg.AggregateCallback(figures=False)
    cb.on_multirun_start(cfg)
    assert marker.read_text() == str(sweep_dir.resolve())
    cb.on_multirun_end(cfg)
    assert "| A1 | 3/3 ok |" in capsys.readouterr().out


# ------------------------------------------------------------------ paired comparisons, no silent pooling

BASE_CFG = {"task": {"name": "reverse_digits", "min_len": 3}, "algo": {"group_size": 8, "lr": 0.001}, "steps": 100}


def _cfg(seed, **changes):
    cfg = {**BASE_CFG, "seed": seed, "algo": {**BASE_CFG["algo"]}, "task": {**BASE_CFG["task"]}}
    for key, value in changes.items():
        top, _, sub = key.partition("__")
        if sub:
            cfg[top][sub] = value
        else:
            cfg[top] = value
    return cfg


def test_paired_difference_finds_what_an_unpaired_interval_hides(tmp_path):
    """Seeds differ a lot (0.3 .. 0.9); the arm adds exactly +0.01 to every seed. Paired: a tight CI
    that excludes 0 and the smallest exact p for n = 6 (2/64); unpaired (Welch) would see nothing."""
    seed_level = [0.3, 0.5, 0.7, 0.9, 0.4, 0.6]
    for seed, level in enumerate(seed_level):
        for arm, bump in (("A1", 0.0), ("C", 0.01)):
            write_run(
                tmp_path, [f"variant={arm}", f"seed={seed}"], metrics=metric_rows([level + bump] * 10),
                summary=OK, config=_cfg(seed),
            )  # fmt: skip
    res = agg.aggregate(tmp_path, figures=False)
    c = res_comparisons(res)[("C", "success_final")]
    assert c["paired"] and c["n"] == 6
    assert c["diff"] == pytest.approx(0.01) and c["lo"] == pytest.approx(0.01) and c["hi"] == pytest.approx(0.01)
    assert c["p"] == pytest.approx(2 / 64)
    assert "vs baseline `A1`" in res.markdown and "(n=6)" in res.markdown
    welch = agg.stats.welch_comparison([x + 0.01 for x in seed_level], seed_level)
    assert welch.p > 0.9  # the same data, unpaired


def test_a_failed_baseline_seed_leaves_the_other_pairs_paired(tmp_path):
    """One baseline seed failed: the comparison stays paired over the seeds both arms have (n = 3),
    instead of falling back to Welch over everything."""
    seed_level = [0.3, 0.5, 0.7, 0.9]
    for seed, level in enumerate(seed_level):
        for arm, bump in (("A1", 0.0), ("C", 0.02)):
            failed = arm == "A1" and seed == 3
            write_run(
                tmp_path, [f"variant={arm}", f"seed={seed}"], metrics=metric_rows([level + bump] * 10),
                summary={"status": "failed", "error": "boom"} if failed else OK, config=_cfg(seed),
            )  # fmt: skip
    res = agg.aggregate(tmp_path, figures=False)
    c = res_comparisons(res)[("C", "success_final")]
    assert c["paired"] and c["n"] == 3 and c["diff"] == pytest.approx(0.02) and c["p"] == pytest.approx(2 / 8)


def test_pooled_sweeps_with_repeated_seeds_are_not_paired_by_seed(tmp_path):
    """The same seeds from two identical sweeps pool into one group; pairing by seed would have to
    drop one run per seed, so the comparison is unpaired over all 4 runs per arm."""
    for sweep in ("s1", "s2"):
        for seed in range(2):
            for arm, level in (("A1", 0.5), ("C", 0.6 if sweep == "s1" else 0.7)):
                write_run(
                    tmp_path / sweep, [f"variant={arm}", f"seed={seed}"], metrics=metric_rows([level] * 4),
                    summary=OK, config=_cfg(seed),
                )  # fmt: skip
    res = agg.aggregate([tmp_path / "s1", tmp_path / "s2"], out_dir=tmp_path / "out", figures=False)
    c = res_comparisons(res)[("C", "success_final")]
    assert not c["paired"] and c["diff"] == pytest.approx(0.15)  # all four C runs count: (0.6 + 0.7) / 2 - 0.5


def test_runs_that_do_not_share_a_base_are_compared_unpaired(tmp_path):
    for seed in range(3):
        rows = metric_rows([0.5] * 4)
        write_run(tmp_path, ["variant=A1", f"seed={seed}"], metrics=rows, summary=OK, config=_cfg(seed))
        # another model: another base policy, so the seed does not pair them
        write_run(
            tmp_path, ["variant=B", f"seed={seed}"], metrics=metric_rows([0.6] * 4), summary=OK,
            config=_cfg(seed, task__min_len=4),
        )  # fmt: skip
    res = agg.aggregate(tmp_path, figures=False)
    c = res_comparisons(res)[("B", "success_final")]
    assert not c["paired"] and "unpaired" in res.markdown


def test_runs_without_resolved_task_settings_are_not_paired_by_seed_alone(tmp_path):
    for seed in range(3):
        for arm, level in (("A1", 0.5), ("C", 0.6)):
            write_run(tmp_path, [f"variant={arm}", f"seed={seed}"], metrics=metric_rows([level] * 4), summary=OK)
    res = agg.aggregate(tmp_path, figures=False)
    assert not res_comparisons(res)[("C", "success_final")]["paired"] and "unpaired" in res.markdown


def test_sweeps_with_different_fixed_settings_are_never_pooled(tmp_path):
    """Two sweeps of the same arms, 100 vs 150 steps: A1 from both must not become one group."""
    for sweep, steps in (("s100", 100), ("s150", 150)):
        for seed in range(2):
            write_run(
                tmp_path / sweep, ["variant=A1", f"seed={seed}"], metrics=metric_rows([0.5] * 4), summary=OK,
                config=_cfg(seed, steps=steps),
            )  # fmt: skip
    res = agg.aggregate([tmp_path / "s100", tmp_path / "s150"], out_dir=tmp_path / "out", figures=False)
    assert set(res.groups["group"]) == {"all [steps=100]", "all [steps=150]"}
    assert "differ in steps" in res.markdown
    # identical settings do pool: 4 seeds in one group
    pooled = agg.aggregate([tmp_path / "s100", tmp_path / "s100"], out_dir=tmp_path / "out2", figures=False)
    assert list(pooled.groups["n_runs"]) == [4]


def test_unknown_baseline_is_an_error(tmp_path):
    write_run(tmp_path, ["variant=A1", "seed=0"], metrics=metric_rows([0.5] * 4), summary=OK)
    with pytest.raises(SweepDirError, match="--baseline 'Z'"):
        agg.aggregate(tmp_path, figures=False, baseline="Z")


def test_no_after_resets_table_without_events():
    """Groups without a completed run have NaN event counts: no "After resets" table of dashes."""
    import pandas as pd

    from prorl_bench.aggregate import event_markdown

    nan = float("nan")
    groups = pd.DataFrame([{"group": "A1", "n_resets_mean": 0.0, "n_growths_mean": 0.0},
                           {"group": "B", "n_resets_mean": nan, "n_growths_mean": nan}])  # fmt: skip
    assert event_markdown(groups) == ""
