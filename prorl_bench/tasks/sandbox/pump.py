"""This process's side of a running sample: reading its output and the runner's frames with caps and paced
reads, killing it, and classing its outcome from what was observed."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prorl_bench.tasks.sandbox.errors import SandboxBroken
from prorl_bench.tasks.sandbox.limits import READ_BURST, READ_PACE_S, WALL_MARGIN_S, SandboxLimits


def _descendants(pid: int) -> list[int]:
    """Every descendant of ``pid``, parents first (from /proc/<pid>/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                kids = [int(k) for k in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def _kill_sample(proc: subprocess.Popen, wrapped: bool) -> None:
    """SIGKILL the sample. Behind ``unshare --fork`` the runner (PID 1 of the namespace) is killed, not
    ``unshare``: ``unshare`` reaps it only after the kernel has killed and reaped the whole namespace."""
    for pid in _descendants(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if not wrapped:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass


class _Frames:
    """Frames from the runner, handled as they arrive and dropped: at most one frame is held at a time."""

    def __init__(self, on_frame: Callable[[dict, bytes], None], cap: int) -> None:
        self.on_frame, self.cap, self.buf = on_frame, cap, bytearray()

    def feed(self, chunk: bytes) -> None:
        self.buf += chunk
        while True:
            end = self.buf.find(b"\n")
            if end < 0:
                if len(self.buf) > 4096:
                    raise SandboxBroken(f"sandbox runner sent a malformed frame: {bytes(self.buf[:200])!r}")
                return
            try:
                header = json.loads(self.buf[:end])
                n = int(header["n"])
            except (ValueError, KeyError, TypeError):
                raise SandboxBroken(f"sandbox runner sent a malformed frame: {bytes(self.buf[:200])!r}") from None
            if n > self.cap:
                raise SandboxBroken(f"sandbox runner sent a {n}-byte result (cap {self.cap})")
            if len(self.buf) < end + 1 + n:
                return  # the rest of this frame is still on its way (or cut by a kill: then never handled)
            payload = bytes(self.buf[end + 1 : end + 1 + n])
            del self.buf[: end + 1 + n]
            self.on_frame(header, payload)


@dataclass
class _Streams:
    """What the sample wrote, read with caps while it runs."""

    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    overflow: bool = False
    reads: dict = field(default_factory=lambda: {"stdout": 0, "stderr": 0})

    def take(self, which: str, chunk: bytes, limits: SandboxLimits, keep_stdout: int) -> None:
        self.reads[which] += 1
        if which == "stdout":
            self.stdout_bytes += len(chunk)
            if len(self.stdout) < keep_stdout:  # past it: drained, not kept
                self.stdout += chunk[: keep_stdout - len(self.stdout)]
            self.overflow |= self.stdout_bytes > limits.max_output_bytes
        else:
            self.stderr_bytes += len(chunk)
            self.stderr = (self.stderr + chunk)[-4096:]
            self.overflow |= self.stderr_bytes > limits.max_output_bytes


def _pump(proc: subprocess.Popen, result_fd: int, limits: SandboxLimits, frames: _Frames, deadline: float,
          wrapped: bool, keep_stdout: int) -> tuple[_Streams, bool]:  # fmt: skip
    """Read stdout, stderr and the frames until all close; kill at the output cap or the deadline. Keeps the
    first ``keep_stdout`` bytes of stdout and the last 4 KiB of stderr; stdout and stderr are paced
    (READ_BURST, READ_PACE_S)."""
    s = _Streams()
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
    sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
    sel.register(result_fd, selectors.EVENT_READ, "frames")
    paused: dict = {}  # stream -> (name, when it is read again)
    killed_at: float | None = None
    timed_out = False
    try:
        while sel.get_map() or paused:
            now = time.monotonic()
            for f, (name, when) in list(paused.items()):
                if now >= when:
                    sel.register(f, selectors.EVENT_READ, name)
                    del paused[f]
            if killed_at is None and now >= deadline:
                timed_out, killed_at = True, now
            if killed_at is not None and proc.poll() is None:
                _kill_sample(proc, wrapped)  # again each pass: a runner not yet forked by `unshare` at the first
            if killed_at is not None and now - killed_at > 2.0 and proc.poll() is not None:
                break  # level rlimits: a process that left the group still holds a pipe; stop listening
            wait = 0.05 if killed_at is not None else max(deadline - now, 0.0)
            wait = min([wait, *(max(when - now, 0.0) for _, when in paused.values())])
            for key, _ in sel.select(timeout=wait):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                elif key.data == "frames":
                    frames.feed(chunk)
                else:
                    s.take(key.data, chunk, limits, keep_stdout)
                    if s.reads[key.data] > READ_BURST:
                        sel.unregister(key.fileobj)
                        paused[key.fileobj] = (key.data, time.monotonic() + READ_PACE_S)
                if s.overflow and killed_at is None:
                    killed_at = time.monotonic()
                    _kill_sample(proc, wrapped)
    finally:
        sel.close()
    return s, timed_out


def _error_name(payload: bytes) -> str | None:
    """The exception name of an ``{"error": name}`` payload (parsed only when short), else None."""
    if not payload.startswith(b'{"error": ') or len(payload) > 512:
        return None
    try:
        value = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    return value["error"] if isinstance(value, dict) and isinstance(value.get("error"), str) else None


def _call_result(payload: bytes) -> dict | None:
    """The child's JSON, parsed here (untrusted: malformed, too deep or a huge int is just no result)."""
    try:
        value = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    if isinstance(value, dict) and len(value) == 1 and ("value" in value or isinstance(value.get("error"), str)):
        return value
    return None


_CPU_SIGNALS = (int(signal.SIGXCPU), int(signal.SIGKILL))  # what RLIMIT_CPU sends (soft, then hard limit)


def _status(headers: list[dict], streams: _Streams, timed_out: bool) -> str:
    """The sample's status from what the runner and this process observed: output caps, the cgroup's
    memory and CPU counters, the clocks, the exit status of a process the runner owns (its server) and the
    server's compile marker; never from a message or a signal the program can send itself."""
    if streams.overflow or any(h["kind"] == "too_large" for h in headers):
        return "output_limit"
    if any(h.get("oom") for h in headers):
        return "memory"
    if timed_out or any(h["kind"] == "timeout" for h in headers):
        return "timeout"
    for h in headers:
        kind = h["kind"]
        if kind == "protocol":
            return "exception"  # it wrote to the runner's control socket what the runner did not expect
        if kind == "died":  # a call ended with no result; its exit status is only the server's word
            return "timeout" if h.get("cpu") else ("crashed" if "signal" in h else "exception")
        if kind in ("import", "main"):
            if "signal" in h:  # the server's status, from the runner's own waitpid
                return "timeout" if h.get("cpu") and h["signal"] in _CPU_SIGNALS else "crashed"
            if not h.get("compiled", 1) and h["code"] == 91:
                return "syntax_error"
            if h["code"] != 0 or kind != "main":
                return "exception"
    return "ok"


def _harness_deadline(t0: float, limits: SandboxLimits, n_calls: int, reruns: bool) -> float:
    """When this process kills a sample whose runner has not ended it: every phase's limit and a margin. The
    top level runs once (level full: a server gone or stopped ends the sample); with ``reruns`` (the weaker
    levels restart the server after each call) once more per call."""
    top = limits.wall_s if limits.import_wall_s is None else limits.import_wall_s
    return t0 + n_calls * ((top if reruns else 0.0) + limits.wall_s) + top + WALL_MARGIN_S + 1.0
