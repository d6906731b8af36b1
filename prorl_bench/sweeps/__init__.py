"""Many runs: the sweep CLI, aggregation, statistics, studies and plots."""
