"""Coverage of "95%" intervals for the mean of n paired differences: Student t vs percentile bootstrap vs BCa.

The aggregator's interval was chosen by this simulation (docs/studies.md); tests/sweeps/test_stats.py holds
the t interval to >= 93% at n = 8 on a symmetric and a skewed distribution.

    python benchmarks/interval_coverage.py            # n = 8, prints one row per distribution
    python benchmarks/interval_coverage.py --n 16 --reps 4000
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
from scipy import stats as sps

from prorl_bench.sweeps import stats

# name -> (sampler(rng, shape), true mean, skewness)
DISTRIBUTIONS = {
    "normal": (lambda r, s: r.normal(0.0, 1.0, s), 0.0, 0.0),
    "t, 3 df": (lambda r, s: r.standard_t(3, s), 0.0, float("nan")),
    "beta(2,5)": (lambda r, s: r.beta(2.0, 5.0, s), 2.0 / 7.0, 0.60),
    "gamma(4)": (lambda r, s: r.gamma(4.0, 1.0, s), 4.0, 1.0),
    "gamma(2)": (lambda r, s: r.gamma(2.0, 1.0, s), 2.0, 1.41),
    "lognormal(0.5)": (lambda r, s: r.lognormal(0.0, 0.5, s), float(np.exp(0.125)), 1.75),
    "exponential": (lambda r, s: r.exponential(1.0, s), 1.0, 2.0),
}


def coverage(x: np.ndarray, mu: float, method: str, resamples: int) -> float:
    """Fraction of rows of ``x`` whose interval contains ``mu``."""
    hits = 0
    for i, row in enumerate(x):
        if method == "t":
            lo, hi = stats.t_interval(list(row))
        else:
            res = sps.bootstrap((row,), np.mean, method=method, n_resamples=resamples, random_state=i)
            lo, hi = res.confidence_interval.low, res.confidence_interval.high
        hits += lo <= mu <= hi
    return hits / len(x)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=8, help="seeds (differences) per sample")
    p.add_argument("--reps", type=int, default=2000, help="simulated samples per distribution (t interval)")
    p.add_argument("--boot-reps", type=int, default=500, help="simulated samples for the bootstrap intervals")
    p.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples per interval")
    args = p.parse_args()
    warnings.simplefilter("ignore")  # BCa warns on degenerate resamples at tiny n
    print(f"nominal 95%, n = {args.n}; t over {args.reps} samples, bootstrap over {args.boot_reps}")
    print(f"{'distribution':16s} {'skew':>5s} {'t':>6s} {'percentile':>10s} {'BCa':>6s}")
    for name, (draw, mu, skew) in DISTRIBUTIONS.items():
        x = draw(np.random.default_rng(0), (args.reps, args.n))
        t = coverage(x, mu, "t", 0)
        perc = coverage(x[: args.boot_reps], mu, "percentile", args.resamples)
        bca = coverage(x[: args.boot_reps], mu, "BCa", args.resamples)
        print(f"{name:16s} {skew:5.2f} {t:6.3f} {perc:10.3f} {bca:6.3f}")


if __name__ == "__main__":
    main()
