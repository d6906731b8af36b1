"""``hydra/launcher=population``: a multirun's seeds train as populations (prorl_bench/population)."""
