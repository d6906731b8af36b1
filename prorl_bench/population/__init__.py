"""Seed populations: S runs of one configuration that differ only in seed, trained as one computation.

* ``model.StackedPolicy``: S native policies as one module with a leading member dimension.
* ``sampling.generate_population``: member-batched KV-cached sampling, each member with its own generator.
* ``lockstep.Lockstep``: the members' unchanged single-run code in turn-taking threads, sampling batched.
* ``runner.run_population``: train a population into S ordinary run directories.

docs/populations.md says how to use it and what was measured.
"""
