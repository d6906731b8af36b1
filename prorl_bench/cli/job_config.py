"""``prorl-bench --cfg job``: the config the run will use, as ``config_resolved.yaml`` records it.

Hydra's composed config carries every built-in option's parameter keys with their defaults in each
axis's section (so that ``-m reset=none,periodic reset.every=25`` composes: ``reset.every`` must exist
whichever option a job selects), which is what Hydra's own ``--cfg job`` prints: ``reset=none``
showed ``every: 50`` and ``kl_threshold: null``, keys the run never reads. The run keeps only the
selected option's (``config.complete``); this prints that, so what is shown is what is run.

Only a single run's plain ``--cfg job`` (optionally ``--resolve``) is answered here; any other flag
(``--cfg hydra``/``all``, ``--package``, another primary config, ``--info``) goes to Hydra unchanged,
and so does a line Hydra cannot compose (Hydra reports its own composition error)."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence

from prorl_bench.config import ConfigError

CFG_FLAGS = ("--cfg", "-c")


def _split(args: Sequence[str]) -> tuple[str | None, bool, list[str], list[str]]:
    """(the --cfg value or None, --resolve given, other flags, overrides) of a command line."""
    value, resolve, flags, overrides = None, False, [], []
    it = iter(args)
    for a in it:
        if a in CFG_FLAGS:
            value = next(it, None)
        elif a.startswith("--cfg="):
            value = a.split("=", 1)[1]
        elif a == "--resolve":
            resolve = True
        elif a.startswith("-"):
            flags.append(a)
        else:
            overrides.append(a)
    return value, resolve, flags, overrides


def job_config_text(args: Sequence[str]) -> str | None:
    """The YAML ``--cfg job`` prints for ``args`` (the selected options' keys only), or None when the
    command line is not a single run's plain ``--cfg job`` or does not compose (Hydra handles it).
    ConfigError when it composes but does not validate: the run would refuse it."""
    value, resolve, flags, overrides = _split(args)
    if value != "job" or flags:
        return None
    from omegaconf import OmegaConf

    from prorl_bench.cli.option_code import load_option_code
    from prorl_bench.cli.preflight import _compose
    from prorl_bench.config import complete

    load_option_code()  # validated as the run validates it
    try:
        cfg = _compose(overrides)
    except Exception:  # noqa: BLE001 - Hydra reports its own composition errors, unchanged
        return None
    with warnings.catch_warnings():  # the run warns about hazards when it runs, not this listing
        warnings.simplefilter("ignore")
        cfg = complete(cfg)
    if resolve:
        OmegaConf.resolve(cfg)
    return OmegaConf.to_yaml(cfg)


def show_job_config(args: Sequence[str], prog: str = "prorl-bench") -> bool:
    """Print ``--cfg job``'s YAML for ``args`` and return True; False when Hydra should handle the line.
    A config that does not validate is the run's error message and exit status 2."""
    try:
        text = job_config_text(args)
    except ConfigError as e:
        print(f"{prog}: config error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if text is None:
        return False
    print(text, end="")
    return True
