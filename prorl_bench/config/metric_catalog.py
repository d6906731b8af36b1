"""The per-run figures a sweep's tables are made of: (column, heading, unit / definition), in table order.

A contract shared by the aggregator (which computes them) and the study schema (whose primary endpoints
must name one of them), kept apart so that validating a study's config does not import the aggregator.
"""

from __future__ import annotations

DEFAULT_THRESHOLD = 0.5  # reward level for steps/time-to-threshold (task reward units, 0..1)
DEFAULT_WINDOW = 5  # RL steps of trailing smoothing for thresholds and recovery

# (column, heading, unit / definition) of every per-run figure, in table order.
METRICS: list[tuple[str, str, str]] = [
    ("success_final", "success (last 10%)", "training success rate, mean over the last 10% of steps"),
    ("val_success_final", "val success", "held-out sampled success rate at the last validation"),
    ("reward_final", "reward (last 10%)", "mean reward over the last 10% of steps"),
    ("reward_auc", "reward AUC", "trapezoidal area under reward/mean divided by the step span (reward units)"),
    ("steps_to_threshold", "steps to thr", "first RL step whose trailing-window mean reward >= threshold"),
    ("time_to_threshold_s", "time to thr (s)", "summed time/step up to that step, seconds"),
    ("kl_mean", "KL mean", "mean kl/ref over steps (configured estimator, nats/token)"),
    ("kl_max", "KL max", "max kl/ref over steps (nats/token)"),
    ("kl_final", "KL final", "kl/ref over the last 10% of steps (nats/token)"),
    ("kl_k1_mean", "KL k1 mean", "mean kl/ref_k1 (unbiased k1 estimate, comparable across estimators)"),
    ("ref_fwd_per_step", "ref fwd/step", "reference forward passes per RL step (count)"),
    ("ref_tokens_per_step", "ref tokens/step", "tokens through the reference per RL step"),
    ("ref_ms_per_step", "ref ms/step", "time/ref_logprob per RL step, milliseconds"),
    ("ref_share_pct", "ref share (%)", "100 * sum time/ref_logprob / sum time/step (percent of step time)"),
    ("time_per_step_ms", "ms/step", "mean time/step, milliseconds"),
    ("n_resets", "resets", "reference resets (events.jsonl event 'reset')"),
    ("n_growths", "growths", "topology growths (events.jsonl event 'growth')"),
    ("val_pass1_final", "val pass@1", "held-out pass@1 (mean success of n samples per prompt), last validation"),
    ("val_passk_final", "val pass@k", "held-out pass@k at the largest configured k (eval.ks), last validation"),
    ("val_pass1_base", "base pass@1", "held-out pass@1 of the base policy (the step-0 validation)"),
    ("val_passk_base", "base pass@k", "held-out pass@k (largest k) of the base policy"),
    ("cov_both_final", "solved: both", "fraction of held-out prompts solved at k_max by base and final policy"),
    ("cov_shrink_final", "solved: base only", "... by the base only: shrinkage (Invisible Leash), last validation"),
    ("cov_expand_final", "solved: trained only", "... by the trained policy only: expansion, last validation"),
    ("cov_neither_final", "solved: neither", "... by neither (val/coverage@{k}/neither), last validation"),
    ("val_pass1_auc", "val pass@1 AUC", "area under held-out pass@1 (every evaluation, step 0 too) / step span"),
    ("curve_plateaued", "plateaued", "1 if the last 5 evaluations of held-out pass@1 pass the plateau rule, else 0"),
    ("curve_steps_to_plateau", "to plateau", "last step of the first 5-evaluation window passing it (nan: never)"),
    ("curve_slope_last", "val slope", "OLS slope of held-out pass@1 per RL step over the last 5 evaluations"),
    ("curve_slope_lo", "val slope lo", "lower end of that slope's 95% t interval"),
    ("curve_slope_hi", "val slope hi", "upper end of that slope's 95% t interval"),
    ("curve_collapse_events", "collapse events", "entropy < 0.5 x its first-10-step median (event ends >= 0.75 x)"),
    ("curve_first_collapse_step", "first collapse", "step the first entropy-collapse event starts (nan: none)"),
    ("val_distinct_final", "distinct/prompt", "distinct completions among one prompt's n samples, last validation"),
    ("kl_base_final", "KL to base", "last finite kl/base: KL of the policy to the initial base (nats/token)"),
    ("post_reward", "post-event reward", "mean reward over the W steps after each reset/growth (reward units)"),
    ("post_success", "post-event success", "mean training success over the W steps after each reset/growth"),
    ("update_ratio", "update-norm ratio", "update_norm over the 3 steps after an event / over the W steps before"),
    ("eff_step_ratio", "eff. step ratio", "(update_norm / lr) after / before an event: the effective-step change"),
    ("kl_old_ratio", "policy-move ratio", "kl/old (how far one step moves the policy) after / before an event"),
    ("v_norm_ratio", "Adam v-norm ratio", "AdamW second-moment norm after / before each reset (events.jsonl)"),
    ("ref_mb", "ref memory (MB)", "bytes the reference model holds (0 for B; a LoRA adapter reference: adapters)"),
    ("peak_rss_mb", "peak RSS (MB)", "peak resident memory of the run's process (ru_maxrss; CPU)"),
    ("wall_time_s", "wall (s)", "whole run wall time incl. warm-up load and validation, seconds"),
    ("route_both_success", "success (both)", "gradient routing: held-out task success, both adapters, last eval"),
    ("route_both_hack", "hack (both)", "gradient routing: held-out hack rate, both adapters, last eval"),
    (
        "route_retain_success",
        "success (forget ablated)",
        "held-out task success with the forget adapter at 0 (a policy without one: as it is)",
    ),  # fmt: skip
    ("route_retain_hack", "hack (forget ablated)", "held-out hack rate, forget adapter at 0 (without one: as is)"),
]
METRIC_NAMES = [m for m, _, _ in METRICS]
