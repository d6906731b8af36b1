"""Limits, results, classes and isolation levels of the sandbox (see the package's docstring)."""

from __future__ import annotations

from dataclasses import dataclass, field

FAIL_CLASSES = (
    "ok", "syntax_error", "exception", "wrong_answer", "timeout", "memory", "crashed", "output_limit", "no_code",
    "scorer_error",
)  # fmt: skip
LEVELS = ("full", "netns+pidns", "rlimits")
WALL_MARGIN_S = 0.5  # the harness kills a sample this long after its wall limit if the runner has not ended it
RUNNER_FAILED = 90  # exit code of a runner that could not set the sample up (a harness error, raised loudly)
# The trainer's reads of a sample's stdout and stderr: after READ_BURST reads of a stream, at most one per
# READ_PACE_S (what is written meanwhile waits in the pipe; a writer that fills it blocks on its own time), so
# a program writing a byte at a time costs the trainer a bounded number of reads per second of its limits.
READ_BURST, READ_PACE_S = 64, 0.02


@dataclass(frozen=True)
class SandboxLimits:
    """Per-sample limits: ``wall_s`` (each call; a plain program: its run), ``import_wall_s`` (the top level;
    None: ``wall_s``) and ``cpu_s`` (per process) in seconds, the ``*_bytes`` in bytes."""

    wall_s: float = 5.0
    cpu_s: int = 5
    memory_bytes: int = 512 * 2**20  # the sample's cgroup (all its processes together); else RLIMIT_AS
    fsize_bytes: int = 1 * 2**20
    nproc: int = 64  # the sample's cgroup pids.max, and RLIMIT_NPROC of its uid
    # When running as root, each sample gets its own unprivileged uid, never used before on this machine,
    # from a counter that starts at ``uid`` (uids.py). -1: keep the caller's uid.
    uid: int = 200000
    import_wall_s: float | None = None
    nofile: int = 64  # RLIMIT_NOFILE
    max_output_bytes: int = 1 * 2**20  # stdout, and separately stderr: past it the sample is killed
    max_result_bytes: int = 1 * 2**20  # one call's JSON-encoded return value
    tmpfs_bytes: int = 8 * 2**20  # the private /tmp and /dev/shm (level full), each


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one sample.

    ``status``: ok | syntax_error | exception | timeout | memory | killed | output_limit. ``calls``: per
    requested call, ``{"value": v}`` (the JSON-decoded return value), ``{"error": name}`` (it raised), or
    None (no result: the program exited, crashed or ran out of time first, or the call never ran).
    ``stdout`` (at most ``max_output_bytes``) and ``stderr`` (its last 4 KiB) are the program's output."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    calls: tuple = field(default=(), repr=False)


@dataclass(frozen=True)
class Isolation:
    """The isolation in force here: ``level`` (one of LEVELS) and why a stronger one is unavailable."""

    level: str
    reason: str = ""
    missing: tuple = ()  # the layers this machine cannot give ("cgroup: why", "seccomp: why")

    def exposed(self) -> str:
        """What a program can reach at this level that it cannot under ``full`` with every layer."""
        gaps = []
        if any(m.startswith("cgroup") for m in self.missing):
            gaps.append("memory, processes and CPU bounded per process only (shared memory and memfd unbounded; "
                        "a sample can slow its neighbours)")  # fmt: skip
        if any(m.startswith("seccomp") for m in self.missing):
            gaps.append("new user namespaces (a full capability set inside one), kernel keyrings, AF_VSOCK and "
                        "other socket families, ptrace, bpf, io_uring")  # fmt: skip
        if self.level == "full":
            return "; ".join(gaps) or "nothing beyond the limits (see docs/code_task.md)"
        what = ("every world-readable file of this machine (the project, its problem files with the expected "
                "answers, other users' files), world-writable directories such as /tmp and /dev/shm, "
                "Unix sockets under them")  # fmt: skip
        if self.level == "rlimits":
            what += ", the network, and the host's processes (a process that leaves its group may outlive the sample)"
        return "; ".join([what, *gaps])
