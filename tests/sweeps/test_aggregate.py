"""The aggregator on synthetic sweep directories whose statistics are known in advance."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from omegaconf import OmegaConf

from prorl_bench.sweeps import aggregate as agg
from prorl_bench.sweeps import callback, stats
from prorl_bench.sweeps.sweepdir import SweepDirError, load_sweep
from tests.sweep_factory import metric_rows, write_multirun_yaml, write_run

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
    monkeypatch.setenv(callback.SWEEP_DIR_FILE_ENV, str(marker))
    cfg = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep_dir)}}})
    cb = callback.AggregateCallback(figures=False)
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
    assert "vs baseline `A1`" in res.markdown and "(n=6, descriptive)" in res.markdown
    welch = stats.welch_comparison([x + 0.01 for x in seed_level], seed_level)
    assert welch.p > 0.9  # the same data, unpaired


def test_a_base_per_seed_neither_splits_groups_nor_unpairs_them(tmp_path):
    """'warmup.seed=${seed}' (a base per seed, as the routing study runs): warmup.seed differs between
    the runs of one arm exactly as the seed does, so each arm stays one group, paired by seed with the
    baseline; a warm-up seed that is not the seed still splits (those runs did not share their base)."""
    for seed in range(4):
        for arm, bump in (("A1", 0.0), ("C", 0.01)):
            write_run(
                tmp_path / "per_seed", [f"variant={arm}", f"seed={seed}", "warmup.seed=${seed}"],
                metrics=metric_rows([0.3 + 0.1 * seed + bump] * 10), summary=OK,
                config=_cfg(seed, warmup={"seed": seed}),
            )  # fmt: skip
            write_run(
                tmp_path / "mixed", [f"variant={arm}", f"seed={seed}"], metrics=metric_rows([0.5] * 10),
                summary=OK, config=_cfg(seed, warmup={"seed": seed % 2}),
            )  # fmt: skip
    res = agg.aggregate(tmp_path / "per_seed", figures=False)
    assert sorted(res.groups["group"]) == ["A1", "C"]
    c = res_comparisons(res)[("C", "success_final")]
    assert c["paired"] and c["n"] == 4 and c["diff"] == pytest.approx(0.01)
    mixed = agg.aggregate(tmp_path / "mixed", figures=False)
    assert len(mixed.groups) == 4  # each arm split by its two bases
    for seed in range(4):  # the default: one base (warmup.seed 0) for every seed, seed 0 included
        for arm, bump in (("A1", 0.0), ("C", 0.01)):
            write_run(
                tmp_path / "fixed", [f"variant={arm}", f"seed={seed}"], metrics=metric_rows([0.3 + bump] * 10),
                summary=OK, config=_cfg(seed, warmup={"seed": 0}),
            )  # fmt: skip
    fixed = agg.aggregate(tmp_path / "fixed", figures=False)
    assert sorted(fixed.groups["group"]) == ["A1", "C"] and res_comparisons(fixed)[("C", "success_final")]["paired"]


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
    dirs = [tmp_path / "s100", tmp_path / "s150"]
    with pytest.raises(SweepDirError, match="pass --baseline"):  # two candidates, one from each sweep
        agg.aggregate(dirs, out_dir=tmp_path / "out", figures=False)
    res = agg.aggregate(dirs, out_dir=tmp_path / "out", figures=False, baseline="all [steps=150]")
    assert set(res.groups["group"]) == {"all [steps=100]", "all [steps=150]"}
    assert "vs baseline `all [steps=150]` (from sweep [2])" in res.markdown
    assert "differ in steps" in res.markdown
    # identical settings do pool: 4 seeds in one group
    pooled = agg.aggregate([tmp_path / "s100", tmp_path / "s100"], out_dir=tmp_path / "out2", figures=False)
    assert list(pooled.groups["n_runs"]) == [4]


def test_unknown_baseline_is_an_error(tmp_path):
    write_run(tmp_path, ["variant=A1", "seed=0"], metrics=metric_rows([0.5] * 4), summary=OK)
    with pytest.raises(SweepDirError, match="--baseline 'Z'"):
        agg.aggregate(tmp_path, figures=False, baseline="Z")


# ------------------------------------------------------------------ studies: primary family, verdicts, blocks

STUDY = {
    "question": "Does the transform change success?",
    "primary": [{"metric": "success_final", "direction": "higher", "margin": 0.03}],
    "baseline": "keep",
    "blocks": {"explore": "range(0,8)", "confirm": "range(8,16)"},
}


def _write_study_sweep(d, seeds, effects, block):
    """opt_reset arms keep (baseline) and others; effects[arm](seed) is added to a seed level from
    step 6 on (so reward AUC and final success differ); one reset at step 4 in every run, so the
    post-event reward and success windows exist (and are equal)."""
    events = [{"step": 4, "event": "reset", "reason": "periodic"}]
    for seed in seeds:
        level = 0.3 + 0.05 * (seed % 7)
        for arm, effect in effects.items():
            cfg = {**_cfg(seed), "study": {**STUDY, "block": block}}
            write_run(
                d, [f"opt_reset={arm}", f"seed={seed}"] + ([f"study.block={block}"] if block != "explore" else []),
                metrics=metric_rows([level] * 5 + [level + effect(seed)] * 5), events=events, summary=OK, config=cfg,
            )  # fmt: skip


def test_study_family_is_primary_by_arms_and_the_rest_is_descriptive(tmp_path):
    """8 seeds; hard is 0.1 worse on every seed, soft within ±0.005 of keep. Holm over primary x arms
    (2 cells) leaves hard's exact p 2/256 at 2 x 2/256 < 0.05: different. Holm over every cell (the
    old family, 12 cells here) would give 12 x 2/256 = 0.094: nothing could be significant."""
    effects = {"keep": lambda s: 0.0, "hard": lambda s: -0.1, "soft": lambda s: 0.005 * (-1) ** s}
    _write_study_sweep(tmp_path, range(8), effects, "explore")
    res = agg.aggregate(tmp_path, figures=False)
    cmp = res_comparisons(res)
    hard, soft = cmp[("hard", "success_final")], cmp[("soft", "success_final")]
    assert hard["family"] == soft["family"] == "primary"
    assert hard["p"] == pytest.approx(2 / 256) and hard["p_holm"] == pytest.approx(2 * 2 / 256)
    assert hard["verdict"] == "different" and soft["verdict"] == "equivalent"
    assert soft["p_equiv"] < 0.05 and soft["p_holm"] == pytest.approx(1.0)
    auc = cmp[("hard", "reward_auc")]
    assert auc["family"] == "descriptive" and math.isnan(auc["p_holm"]) and not isinstance(auc["verdict"], str)
    # post-event reward and success are the same numbers under exact rewards: one test, said so
    assert cmp[("hard", "post_reward_vs_baseline")]["family"] == "descriptive"
    dup = cmp[("hard", "post_success_vs_baseline")]
    assert dup["family"] == "duplicate" and dup["duplicate_of"] == "post_reward_vs_baseline"
    md = res.markdown
    assert "### Study: Does the transform change success?" in md and "explore (seeds 0–7)" in md
    assert "→ different (worse)" in md and "→ equivalent within ±0.03" in md
    assert "same test as Δ post-event reward" in md and "(n=8, descriptive)" in md
    assert "no difference" not in md.lower()


def test_confirm_block_side_by_side_with_replication(tmp_path, capsys):
    """Explore (seeds 0-7) and confirm (8-15) in two directories: hard's loss replicates; soft's
    equivalence does not (on the confirm seeds half of them lose 0.1)."""
    explore, confirm = tmp_path / "explore", tmp_path / "confirm"
    _write_study_sweep(
        explore,
        range(8),
        {"keep": lambda s: 0.0, "hard": lambda s: -0.1, "soft": lambda s: 0.005 * (-1) ** s},
        "explore",
    )
    _write_study_sweep(
        confirm,
        range(8, 16),
        {"keep": lambda s: 0.0, "hard": lambda s: -0.08, "soft": lambda s: -0.1 * (s % 2)},
        "confirm",
    )
    assert agg.main([str(explore), str(confirm), "--no-figures", "--out", str(tmp_path / "out")]) == 0
    md = capsys.readouterr().out
    assert f"[1] {explore}" in md and f"[2] {confirm}" in md  # the heading names every directory
    assert "vs baseline `keep` (from sweep [1])" in md and "vs baseline `keep` (from sweep [2])" in md
    assert "### Block `explore` (seeds 0–7)" in md and "### Block `confirm` (seeds 8–15)" in md
    study = md[md.index("### Study:") :]
    rows = {line.split("|")[1].strip(): line for line in study.splitlines() if "| Δ success |" in line}
    assert rows["hard"].rstrip(" |").endswith("| replicated")
    assert rows["soft"].rstrip(" |").endswith("| not replicated")
    groups = pd.read_csv(tmp_path / "out" / "groups.csv")
    assert sorted(zip(groups["block"], groups["group"])) == sorted(
        (b, g) for b in ("explore", "confirm") for g in ("keep", "hard", "soft")
    )
    cmp = pd.read_csv(tmp_path / "out" / "comparisons.csv")
    assert set(cmp["block"]) == {"explore", "confirm"}
    # a Holm family per block: 2 primary cells in each
    assert (cmp[cmp["family"] == "primary"].groupby("block").size() == 2).all()


def test_two_sweeps_labels_show_effective_settings_and_the_baseline_source(tmp_path):
    """Issue 25.7: one sweep varies +arm, the other variant. Labels come from each run's own sweep
    (no `arm=, variant=A1` with an empty key); A1 runs with equal settings from both pool (sources
    [1+2]); the heading names both directories and where the baseline comes from."""
    s1, s2 = tmp_path / "s1", tmp_path / "s2"
    for seed in range(2):
        for arm in ("A1", "C"):
            write_run(s1, [f"+arm={arm}", f"seed={seed}", "steps=12"], metrics=metric_rows([0.5] * 4), summary=OK,
                      config=_cfg(seed, variant=arm))  # fmt: skip
        for arm in ("A1", "B"):
            write_run(s2, [f"variant={arm}", f"seed={seed + 2}"], metrics=metric_rows([0.6] * 4), summary=OK,
                      config=_cfg(seed + 2, variant=arm))  # fmt: skip
    res = agg.aggregate([s1, s2], out_dir=tmp_path / "out", figures=False)
    groups = res.groups.set_index("group")
    assert set(groups.index) == {"A1", "B", "C"}
    assert groups.loc["A1", "sweeps"] == "1+2" and groups.loc["B", "sweeps"] == "2"
    assert "=," not in res.markdown and "=]" not in res.markdown
    assert f"[1] {s1.resolve()}" in res.markdown and f"[2] {s2.resolve()}" in res.markdown
    assert "vs baseline `A1` (from sweep [1+2])" in res.markdown


def test_a_narrowed_study_grid_still_finds_its_declared_baseline(tmp_path):
    """adam_step_hazard run with opt_reset.step=keep on the command line: only the factor varies, so
    the groups are `0.0` and `1.0`; the declared baseline `factor=1.0, step=keep` is the group `1.0`."""
    study = {**STUDY, "baseline": "factor=1.0, step=keep"}
    for seed in range(3):
        for factor, level in (("0.0", 0.2), ("1.0", 0.5)):
            write_run(
                tmp_path, [f"opt_reset.factor={factor}", "opt_reset.step=keep", f"seed={seed}"],
                metrics=metric_rows([level] * 4), summary=OK, config={**_cfg(seed), "study": study},
            )  # fmt: skip
    res = agg.aggregate(tmp_path, figures=False)
    assert "vs baseline `1.0`" in res.markdown and "is the group `1.0` here" in res.markdown
    cmp = res.comparisons.set_index(["group", "metric"])  # (the CSV would read the label 0.0 as a float)
    assert cmp.loc[("0.0", "success_final"), "family"] == "primary"
    with pytest.raises(SweepDirError, match="--baseline 'Z'"):
        agg.aggregate(tmp_path, figures=False, baseline="Z")
    # another baseline than the declared one: the comparisons are descriptive, and the report says why
    res = agg.aggregate(tmp_path, figures=False, baseline="0.0")
    assert "is not the study's declared" in res.markdown
    assert res.comparisons.set_index(["group", "metric"]).loc[("1.0", "success_final"), "family"] == "descriptive"


def test_missing_jobs_of_a_study_block_are_listed(tmp_path):
    """multirun.yaml keeps the grid's seed parameter unresolved (${study.blocks.${study.block}}): the
    reader resolves it, so a confirm job that never started shows as missing instead of vanishing."""
    import yaml

    study = {**STUDY, "blocks": {"explore": "0,1", "confirm": "2,3"}, "block": "confirm"}
    params = {"opt_reset": "keep,hard", "seed": "${study.blocks.${study.block}}"}
    multirun = {
        "study": study,
        "hydra": {
            "sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper", "params": params},
            "overrides": {"task": ["study.block=confirm"]},
        },
    }
    (tmp_path / "multirun.yaml").write_text(yaml.safe_dump(multirun))
    for arm, seed in (("keep", 2), ("keep", 3), ("hard", 2)):
        write_run(tmp_path, [f"opt_reset={arm}", f"seed={seed}", "study.block=confirm"], metrics=metric_rows([0.5] * 4),
                  summary=OK, config={**_cfg(seed), "study": study})  # fmt: skip
    runs = agg.aggregate(tmp_path, figures=False).runs.set_index(["group", "seed"])
    assert runs.loc[("hard", "3"), "status"] == "missing" and runs.loc[("hard", "3"), "block"] == "confirm"
    assert len(runs) == 4


def test_no_after_resets_table_without_events():
    """Groups without a completed run have NaN event counts: no "After resets" table of dashes."""
    import pandas as pd

    from prorl_bench.sweeps.markdown import event_markdown

    nan = float("nan")
    groups = pd.DataFrame([{"group": "A1", "n_resets_mean": 0.0, "n_growths_mean": 0.0},
                           {"group": "B", "n_resets_mean": nan, "n_growths_mean": nan}])  # fmt: skip
    assert event_markdown(groups) == ""


def test_runs_are_listed_in_numeric_seed_order(tmp_path):
    """Seed 2 before seed 10 in runs.csv and the runs table (seeds arrive as override text)."""
    for seed in (10, 2, 1, 0):
        write_run(tmp_path, [f"seed={seed}"], metrics=metric_rows([0.5] * 4), summary=OK)
    res = agg.aggregate(tmp_path, figures=False)
    assert [int(s) for s in res.runs["seed"]] == [0, 1, 2, 10]


def test_curve_rules_are_columns_of_the_runs_and_groups_tables(tmp_path):
    """The plateau, collapse and held-out-area rules (run/curve_rules.py) from each run's files: a curve
    saturating at step 120 (evaluations every 10) plateaus at 160; a linear one never; entropy that
    falls to 0.2 of its start at step 21 is one collapse event, starting at step 33 where the 0.2s are the
    majority of the trailing 25-step median's window (steps 9-33). A run without pass@1 columns has nan."""
    val_sat = [{"step": s, "val/pass@1": 0.1 + 0.005 * min(s, 120)} for s in range(0, 301, 10)]
    val_lin = [{"step": s, "val/success_sampled": 0.1 + 0.002 * s} for s in range(0, 301, 10)]
    rows = metric_rows([0.5] * 40)
    for r in rows:
        r["entropy"] = 1.0 if r["step"] <= 20 else 0.2
    write_run(tmp_path, ["variant=C", "seed=0"], metrics=rows, validation=val_sat, summary=OK)
    write_run(tmp_path, ["variant=A1", "seed=0"], metrics=metric_rows([0.5] * 40), validation=val_lin, summary=OK)
    write_run(tmp_path, ["variant=B", "seed=0"], metrics=metric_rows([0.5] * 40), validation=[{"step": 5}], summary=OK)
    res = agg.aggregate(tmp_path, figures=False)
    runs = pd.read_csv(res.out_dir / "runs.csv").set_index("group")
    c, a1, b = runs.loc["C"], runs.loc["A1"], runs.loc["B"]
    assert c["curve_steps_to_plateau"] == 160 and c["curve_plateaued"] == 1.0 and c["curve_slope_last"] == 0.0
    assert c["val_pass1_auc"] == pytest.approx(0.58)  # (120 x (0.1 + 0.7) / 2 + 180 x 0.7) / 300
    assert c["curve_collapse_events"] == 1 and c["curve_first_collapse_step"] == 33
    assert a1["curve_plateaued"] == 0.0 and math.isnan(a1["curve_steps_to_plateau"])
    assert a1["curve_slope_last"] == pytest.approx(0.002) and a1["curve_slope_lo"] > 0
    assert math.isnan(a1["curve_collapse_events"])  # no entropy logged
    assert all(math.isnan(b[m]) for m in ("val_pass1_auc", "curve_plateaued", "curve_slope_last"))
    assert _group(res, "C")["curve_steps_to_plateau_mean"] == 160


def _write_declared(d, seeds, effects, block, blocks):
    """As _write_study_sweep, with the seed blocks the runs record."""
    for seed in seeds:
        level = 0.3 + 0.05 * (seed % 7)
        for arm, effect in effects.items():
            cfg = {**_cfg(seed), "study": {**STUDY, "blocks": blocks, "block": block}}
            write_run(
                d, [f"opt_reset={arm}", f"seed={seed}"] + ([f"study.block={block}"] if block != "explore" else []),
                metrics=metric_rows([level] * 5 + [level + effect(seed)] * 5), summary=OK, config=cfg,
            )  # fmt: skip


def test_an_extended_block_is_one_study_with_the_widest_declaration(tmp_path):
    """Explore first ran seeds 0-7 (blocks 0-7 / 8-15); the seed plan asked for 10, so seeds 8-9 ran as
    explore and confirm as 10-19 under blocks 0-9 / 10-19. One study: explore has n = 10 and hard's exact
    p is 2/1024 (below 2/256, the floor at n = 8), the declaration is the widest, and a note says so. A seed
    that ran in two blocks makes every comparison descriptive."""
    old = {"explore": "range(0,8)", "confirm": "range(8,16)"}
    new = {"explore": "range(0,10)", "confirm": "range(10,20)"}
    effects = {"keep": lambda s: 0.0, "hard": lambda s: -0.1}
    _write_declared(tmp_path / "e1", range(8), effects, "explore", old)
    _write_declared(tmp_path / "e2", range(8, 10), effects, "explore", new)
    _write_declared(tmp_path / "c", range(10, 20), effects, "confirm", new)
    res = agg.aggregate([tmp_path / "e1", tmp_path / "e2", tmp_path / "c"], tmp_path / "out", figures=False)
    hard = res.comparisons[(res.comparisons["group"] == "hard") & (res.comparisons["metric"] == "success_final")]
    assert set(hard["block"]) == {"explore", "confirm"} and set(hard["n"]) == {10}
    assert list(hard["p"]) == pytest.approx([2 / 1024] * 2) and set(hard["verdict"]) == {"different"}
    assert "a block was extended" in res.markdown and "explore: range(0,10)" in res.markdown
    # a seed in two blocks: the old declaration's confirm seed 8 next to the new explore seed 8
    _write_declared(tmp_path / "c_old", [8], effects, "confirm", old)
    res = agg.aggregate([tmp_path / "e1", tmp_path / "e2", tmp_path / "c_old"], tmp_path / "out2", figures=False)
    assert "seeds [8] ran in two blocks" in res.markdown
    assert "primary" not in set(res.comparisons["family"])  # no verdicts: every comparison descriptive
