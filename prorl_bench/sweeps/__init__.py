"""Many runs: sweep directories, aggregation, statistics, study maps and plots (`prorl-bench-sweep`: cli/sweep.py)."""
