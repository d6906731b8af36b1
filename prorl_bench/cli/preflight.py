"""Checks of a ``prorl-bench`` command line that run before Hydra does anything with it.

Hydra creates a single run's directory (``outputs/runs/<date>``) before the job function sees the
config, and reports a launcher that cannot start as a 30-line traceback. So ``app.main`` asks
:func:`check` first; it returns one message (exit status 2, nothing written) or None (Hydra runs):

1. keys the bench does not have: TRL / verl names translated, typos with the closest keys
   (``confhelp.check_overrides``), with or without ``+``;
2. a single run: the config is composed and validated (``config.to_config``) here, so a bad value
   leaves no failed run directory behind;
3. a multirun on a SLURM launcher (``hydra/launcher=slurm`` / ``submitit_slurm``) where SLURM's
   ``srun`` is not on PATH: one line saying so, instead of submitit's traceback.

A command line this module cannot judge (another primary config, Hydra's help flags, an override
Hydra itself rejects) is passed to Hydra unchanged: its own error is then the one shown.
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Sequence

from prorl_bench.config import ConfigError

MULTIRUN = {"-m", "--multirun"}
# flags that print instead of running: the config is not validated for them
INFO_FLAGS = {"--help", "-h", "--hydra-help", "--version", "-sc", "--shell-completion", "--cfg", "-c", "--info",
              "-i", "--resolve", "--package", "-p"}  # fmt: skip
# another primary config: the schema checks here do not know it
OTHER_CONFIG = ("-cn", "--config-name", "-cp", "--config-path", "-cd", "--config-dir", "--experimental-rerun")
SLURM_TARGET = "SlurmLauncher"  # hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher


def rename_moved(args: Sequence[str], prog: str = "prorl-bench") -> list[str]:
    """``args`` with every key given by an old name (``task.code.timeout_s=3``, ``config/options.py``
    ``MOVED``) renamed (``task.timeout_s=3``), a note on stderr for each: the old command line still runs."""
    import sys

    from prorl_bench.config.options import moved_name

    out = []
    for arg in args:
        plus = arg[: len(arg) - len(arg.lstrip("+"))]
        key, eq, value = arg[len(plus) :].partition("=")
        new = moved_name(key) if eq and not arg.startswith("-") else None
        if new is not None:
            print(f"{prog}: {key} is an old name, read as {new} (did you mean {new}={value}?)", file=sys.stderr)
            arg = f"{plus}{new}={value}"
        out.append(arg)
    return out


def _flags(args: Sequence[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in args if a.startswith("-")}


def _overrides(args: Sequence[str]) -> list[str]:
    """The ``key=value`` arguments (a flag's own value, e.g. ``--cfg job``, has no "=")."""
    return [a for a in args if not a.startswith("-") and "=" in a]


def check(args: Sequence[str]) -> str | None:
    """The message to stop with (without running anything), or None to let Hydra run ``args``."""
    flags = _flags(args)
    if flags & {"--help", "-h", "--hydra-help", "--version", "-sc", "--shell-completion"}:
        return None
    if any(f.startswith(OTHER_CONFIG) for f in flags):
        return None
    problem = names_problem(args)
    if problem:
        return problem
    from prorl_bench.cli.confhelp import force_option_params

    overrides = _overrides(force_option_params(list(args)))  # as main() hands them to Hydra
    if flags & MULTIRUN:
        return ray_problem(overrides) or slurm_problem(overrides)
    if flags & INFO_FLAGS:
        return None
    return validate_single_run(overrides)


def names_problem(args: Sequence[str], prog: str = "prorl-bench") -> str | None:
    """Keys the bench does not have (TRL / verl names translated, typos with the closest keys), as
    one message ending with the corrected command line; None when every key exists."""
    from prorl_bench.cli.confhelp import check_overrides

    problems, corrected = check_overrides(list(args))  # flags pass through in place
    if not problems:
        return None
    lines = [f"{prog}: {p}" for p in problems]
    if corrected != list(args):
        lines.append(f"{prog}: nothing was run; with the bench's names: {prog} {' '.join(corrected)}")
    else:
        lines.append(f"{prog}: nothing was run")
    return "\n".join(lines)


def _compose(overrides: list[str], hydra_node: bool = False):
    from hydra import compose, initialize_config_dir

    from prorl_bench.config import register_configs
    from prorl_bench.searchpath import CONF_DIR

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=hydra_node)


def composition_problem(e: Exception, prog: str = "prorl-bench") -> str | None:
    """Hydra's error for a command line that names an option no group has, or that does not parse,
    as the bench's one line (Hydra's own is several lines and exits 1); None for any other error."""
    import difflib

    from hydra.errors import MissingConfigException, OverrideParseException

    if isinstance(e, MissingConfigException) and e.missing_cfg_file and "/" in e.missing_cfg_file:
        group, _, name = e.missing_cfg_file.rpartition("/")
        options = list(e.options or [])
        close = difflib.get_close_matches(name, options, n=2, cutoff=0.6)
        hint = f"; did you mean {group}={' or '.join(close)}?" if close else ""
        return f"{prog}: config error: {group}={name} is not an option: {group} is one of {', '.join(options)}{hint}"
    if isinstance(e, OverrideParseException):
        return f"{prog}: config error: {str(e).splitlines()[0]} (Hydra's override syntax: key=value)"
    return None


def validate_single_run(overrides: list[str]) -> str | None:
    """Compose and validate a single run's config: its ConfigError as the message, else None. An
    unknown option or an override that does not parse is the bench's one line too
    (``composition_problem``); any other composition error is left to Hydra."""
    from prorl_bench.cli.option_code import load_option_code
    from prorl_bench.config import to_config

    load_option_code()
    try:
        cfg = _compose(list(overrides))
    except Exception as e:  # noqa: BLE001 - Hydra reports the composition errors the bench does not word
        return composition_problem(e)
    try:
        with warnings.catch_warnings():  # the run itself warns (once), not this check
            warnings.simplefilter("ignore")
            to_config(cfg)
    except ConfigError as e:
        return f"prorl-bench: config error: {e}"
    return None


def ray_problem(args: Sequence[str], prog: str = "prorl-bench") -> str | None:
    """One line when ``hydra/launcher=ray`` is asked for and the ``ray`` extra is not installed (Hydra's
    own message would be "Could not find 'hydra/launcher/ray'"); None otherwise."""
    from importlib.util import find_spec

    wanted = any(a.lstrip("+~").replace(" ", "") == "hydra/launcher=ray" for a in args)
    if not wanted or find_spec("hydra_plugins.hydra_ray_launcher") is not None:
        return None
    return (
        f"{prog}: hydra/launcher=ray needs the ray extra (Hydra's Ray launcher): pip install -e '.[ray]' "
        "in a checkout, or pip install 'prorl-bench[ray]'; nothing was run"
    )


def slurm_problem(args: Sequence[str], prog: str = "prorl-bench") -> str | None:
    """One line when the multirun's launcher (from the command line or a grid's defaults) is SLURM's
    and this machine has no ``srun``; None otherwise, or when the config does not compose (Hydra
    then reports that itself)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(_overrides(args))
        plain = [o.input_line for o in parsed if not o.is_sweep_override()]
        cfg = _compose(plain, hydra_node=True)
        target = str(cfg.hydra.launcher.get("_target_", ""))
    except Exception:  # noqa: BLE001 - Hydra reports its own errors
        return None
    if not target.endswith(SLURM_TARGET) or shutil.which("srun") is not None:
        return None
    return (
        f"{prog}: the SLURM launcher (hydra/launcher=slurm) submits jobs to a SLURM cluster, but `srun` is not "
        "on PATH here (not a SLURM node); nothing was run. Run it on a SLURM login node, or use "
        "hydra/launcher=joblib (this machine) or hydra/launcher=submitit_local (the same submitit path, local)"
    )
