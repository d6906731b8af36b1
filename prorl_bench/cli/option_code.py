"""``load_option_code``: before the command line validates a config, register the config checks that
live with an option's code — a task's own (``task=math_jsonl`` reads its files) and what ``engine=trl``
cannot express — so that a config is validated here as the run validates it, before anything is
written. Config validation (``prorl_bench.config``) imports no layer above it; assembling the layers is
the top layer's job. Called where a config is validated, not at import: ``prorl-bench-sweep`` imports
the CLI without torch.
"""

from __future__ import annotations


def load_option_code() -> None:
    """Import the modules whose options' code registers config checks (once; cheap after the first call)."""
    import prorl_bench.engines  # noqa: F401  (the engines: engine=trl's check)
    import prorl_bench.tasks  # noqa: F401
