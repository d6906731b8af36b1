"""What produced a run: the bench's code, the packages, the machine and the command (one place).

``collect`` returns a JSON-able dict, written into ``summary.json`` (key ``provenance``) and appended to
``config_resolved.yaml`` as comment lines (so the file still loads as the run's config, unchanged):

- ``bench``: ``version`` (the installed package), ``commit`` (git HEAD of the checkout the package was
  imported from; ``null`` for a wheel or when git is absent), ``dirty`` (tracked files differ from
  HEAD, or untracked files sit in the package, conf/, sweeps/ or hydra_plugins/), ``diff_sha256``
  (sha256 of ``git diff HEAD --binary`` and those files: two dirty runs with equal hashes ran the same code);
- ``packages``: versions of the packages that change numbers or the config (``null`` when absent);
- ``torch``: ``num_threads``, ``num_interop_threads``, ``blas`` (BLAS_INFO/LAPACK_INFO of
  ``torch.__config__.show()``), ``config`` (that text whole), ``omp_num_threads`` (the variable);
- ``machine``: ``hostname``, ``platform``, ``python``, ``cpu_model``, ``cpu_count`` (``os.cpu_count()``),
  ``cpu_affinity`` (CPUs this process may use); ``gpu`` (``name``, ``driver``, ``cuda``) where CUDA is used;
- ``command``: the command line the user typed (``PRORL_BENCH_COMMAND``, set by the entry points and
  inherited by launcher workers, else ``sys.argv``) and ``overrides`` (this job's Hydra overrides).

Nothing here may fail a run: every probe that cannot answer records ``null``.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import os
import platform
import re
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

SOURCE_DIRS = ("prorl_bench", "conf", "sweeps", "hydra_plugins")  # where an untracked file changes the code
PACKAGES = ("torch", "transformers", "peft", "trl", "hydra-core", "omegaconf", "numpy")
COMMAND_ENV = "PRORL_BENCH_COMMAND"  # JSON list: the user's command line, for workers that did not see it
YAML_MARK = "# provenance (prorl_bench/run/provenance.py; not part of the config): "
_GIT_TIMEOUT_S = 30  # a hang guard for git on a slow file system, not a deadline

_current: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("provenance", default=None)


def remember_command(argv: Sequence[str] | None = None) -> None:
    """Record the command line the user typed, once, for this process and the workers it starts."""
    if COMMAND_ENV not in os.environ:
        os.environ[COMMAND_ENV] = json.dumps([Path(sys.argv[0]).name, *sys.argv[1:]] if argv is None else list(argv))


def _command() -> list[str]:
    try:
        cmd = json.loads(os.environ[COMMAND_ENV])
        if isinstance(cmd, list) and all(isinstance(x, str) for x in cmd):
            return cmd
    except (KeyError, json.JSONDecodeError):
        pass
    return [Path(sys.argv[0]).name, *sys.argv[1:]]


def _git(root: Path, *args: str) -> bytes | None:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=_GIT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def bench_source(package_dir: Path | None = None) -> dict[str, Any]:
    """The bench's version, commit and dirty state. A commit is reported only when the package was
    imported from the top of a git checkout (an editable install), never from a repository that
    merely contains a virtual environment with a wheel in it."""
    try:
        version = metadata.version("prorl-bench")
    except metadata.PackageNotFoundError:
        version = None
    if package_dir is None:
        package_dir = Path(__file__).resolve().parents[1]
    root = package_dir.parent
    out: dict[str, Any] = {"version": version, "commit": None, "dirty": None, "diff_sha256": None}
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or Path(top.decode().strip()).resolve() != root.resolve():
        return out
    head = _git(root, "rev-parse", "HEAD")
    diff = _git(root, "diff", "HEAD", "--binary")
    # new files the package, its configs or its plugin would load, not yet known to git
    untracked = _git(root, "ls-files", "--others", "--exclude-standard", "-z", "--", *SOURCE_DIRS)
    if head is None or diff is None or untracked is None:
        return out
    h = hashlib.sha256(diff)
    for name in sorted(n for n in untracked.decode().split("\0") if n):
        h.update(b"\0untracked\0" + name.encode() + b"\0")
        try:
            h.update((root / name).read_bytes())
        except OSError:
            pass
    out["commit"] = head.decode().strip()
    out["dirty"] = bool(diff or untracked)
    out["diff_sha256"] = h.hexdigest() if out["dirty"] else None
    return out


def package_versions(names: Sequence[str] = PACKAGES) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def cpu_model() -> str | None:
    """The CPU's model name (Linux /proc/cpuinfo; else what ``platform`` says, or null)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _affinity() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def torch_settings(threads: int | None = None) -> dict[str, Any]:
    """Threads (``threads``: the number the job pins, else torch's current one) and the BLAS torch
    was built with (``torch.__config__``)."""
    import torch

    config = torch.__config__.show()
    blas = re.findall(r"\b((?:BLAS|LAPACK)_INFO=[^,\s]+)", config)
    return {
        "num_threads": torch.get_num_threads() if threads is None else threads,
        "num_interop_threads": torch.get_num_interop_threads(),
        "blas": ", ".join(blas) or None,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "config": config,
    }


def gpu_info() -> dict[str, Any] | None:
    """Name, driver and CUDA version of the current CUDA device; null without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    idx = torch.cuda.current_device()
    driver = None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", f"--id={idx}"],
                             capture_output=True, text=True, timeout=_GIT_TIMEOUT_S)  # fmt: skip
        driver = (out.stdout.strip() or None) if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
    return {"name": torch.cuda.get_device_name(idx), "driver": driver, "cuda": torch.version.cuda}


def machine(uses_cuda: bool) -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": _affinity(),
        "gpu": gpu_info() if uses_cuda else None,
    }


def collect(overrides: Sequence[str] = (), uses_cuda: bool = False, threads: int | None = None) -> dict[str, Any]:
    """Everything above, for the job with these Hydra ``overrides`` running on ``threads`` torch threads."""
    return {
        "bench": bench_source(),
        "packages": package_versions(),
        "torch": torch_settings(threads),
        "machine": machine(uses_cuda),
        "command": _command(),
        "overrides": list(overrides),
    }


@contextmanager
def recording(prov: dict[str, Any]) -> Iterator[None]:
    """While inside, ``outputs.write_summary`` adds ``prov`` to every summary this thread writes
    (a context variable: population members are threads of one process, each with its own)."""
    token = _current.set(prov)
    try:
        yield
    finally:
        _current.reset(token)


def current() -> dict[str, Any] | None:
    return _current.get()


def config_text(resolved_yaml: str, prov: dict[str, Any]) -> str:
    """``config_resolved.yaml``: the resolved config, then the provenance as one comment line (YAML
    loaders ignore it; ``read_yaml_provenance`` reads it back)."""
    return resolved_yaml.rstrip("\n") + "\n" + YAML_MARK + json.dumps(prov, sort_keys=True) + "\n"


def config_only(text: str) -> str:
    """The config part of a ``config_resolved.yaml`` (what ``OmegaConf.to_yaml`` wrote)."""
    return "".join(ln for ln in text.splitlines(keepends=True) if not ln.startswith(YAML_MARK))


def read_yaml_provenance(text: str) -> dict[str, Any] | None:
    for ln in text.splitlines():
        if ln.startswith(YAML_MARK):
            return json.loads(ln[len(YAML_MARK) :])
    return None
