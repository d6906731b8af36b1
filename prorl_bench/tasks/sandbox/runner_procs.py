"""The runner's view of the sample's processes and cgroup counters (part of the runner's text: ``seccomp.py``
+ ``runner_fs.py`` + this file + ``runner.py``, run as ``python -I -S -c``; no project imports): killing and
reaping every process of the sample, and what its cgroup counted (memory-limit hits, CPU time).
"""

import os
import select
import signal
import time

# A process killed by RLIMIT_CPU used ``cpu_s`` as the kernel samples it (whole ticks to whoever runs at each
# tick), which on a loaded machine exceeds the cgroup's exact count by several percent (0.96 s counted for a
# 1 s limit here): the phase counts as having reached the limit at CPU_SHARE of it, less CPU_SLACK_S (what a
# process may use before it joins the sample's cgroup). A program that signals itself gains nothing by it.
CPU_SHARE, CPU_SLACK_S = 0.8, 0.05


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return b"X"


def reap(srv):
    """Reap every exited child without blocking; record the server's status if it is among them."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        except InterruptedError:
            continue
        if pid == 0:
            return
        if srv is not None and pid == srv["pid"]:
            srv["status"] = status


def kill_others(srv, patience=5.0):
    """Mode full: kill every process of the sample but the server (this runner is PID 1: /proc is the
    sample's) and wait until each has died (a pidfd turns readable); rescan for processes forked meanwhile.
    False if they keep appearing for ``patience`` seconds (then the caller kills the server too)."""
    deadline = time.monotonic() + patience
    while True:
        victims = [int(d) for d in os.listdir("/proc") if d.isdigit() and int(d) not in (1, srv["pid"])]
        victims = [p for p in victims if _state(p) not in (b"Z", b"X")]
        reap(srv)
        if not victims:
            return True
        if time.monotonic() > deadline:
            return False
        poller, fds = select.poll(), []
        for p in victims:
            try:
                fd = os.pidfd_open(p)
            except OSError:
                continue  # already gone
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)  # by pidfd: never a recycled pid
            except OSError:
                pass
            fds.append(fd)
            poller.register(fd, select.POLLIN)
        waiting = len(fds)
        while waiting:  # a killed process still unmaps its memory: wait for it rather than spin
            left = deadline - time.monotonic()
            events = poller.poll(max(0, int(left * 1000) + 1)) if left > 0 else []
            if not events:
                break
            for fd, _ in events:
                poller.unregister(fd)
                waiting -= 1
        for fd in fds:
            os.close(fd)


def kill_all(job, srv):
    """Kill every process of the sample and reap them (pid namespace: all of them)."""
    if job["mode"] == "rlimits":
        if srv is not None:
            try:
                os.killpg(srv["pid"], signal.SIGKILL)
            except OSError:
                pass
    else:
        try:
            os.kill(-1, signal.SIGKILL)  # as PID 1 of the namespace: everyone else in it
        except OSError:
            pass
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if srv is not None and pid == srv["pid"]:
            srv["status"] = status
    if srv is not None:
        srv["sock"].close()
        os.close(srv["pidfd"])


def _counter(fd, key):
    try:
        text = os.pread(fd, 4096, 0).decode()
    except OSError:
        return 0
    if not key:
        return int(text.strip() or 0)
    for line in text.splitlines():
        k, _, value = line.partition(" ")
        if k == key:
            return int(value)
    return 0


def observe(cg):
    """(memory-limit hits, CPU seconds) of the sample's cgroup so far: OOM kills + refused charges, and
    the CPU every process of the sample used (0, 0 without a cgroup). The program cannot write either."""
    hits = sum(_counter(fd, key) for fd, key in cg["counters"])
    cpu = sum(_counter(fd, key) * scale for fd, key, scale in cg["cpu"])
    return hits, cpu


def observed(job, cg, before):
    """What the runner saw of a phase that began at ``before`` (``observe``): ``oom`` 1 if the sample hit
    its memory limit, ``cpu`` 1 if its processes used ``cpu_s`` of CPU (what RLIMIT_CPU's signals mean)."""
    hits, cpu = observe(cg)
    reached = cpu - before[1] >= CPU_SHARE * job["cpu_s"] - CPU_SLACK_S
    return {"oom": int(hits > before[0]), "cpu": int(bool(cg["cpu"]) and reached)}


def server_fate(srv):
    """The server's status if it has stopped or ended (the runner's own ``waitpid``), else None. A stop is
    reported once by the kernel: it is kept in ``srv["stopped"]``."""
    if srv["status"] is not None or srv.get("stopped") is not None:
        return srv["status"] if srv["status"] is not None else srv["stopped"]
    try:
        pid, status = os.waitpid(srv["pid"], os.WUNTRACED | os.WNOHANG)
    except ChildProcessError:
        return srv["status"]
    if pid == 0:
        return None
    srv["stopped" if os.WIFSTOPPED(status) else "status"] = status
    return status


def drain(fd):
    """Read what a non-blocking pipe holds (a wake-up pipe): True while there was something."""
    try:
        return bool(os.read(fd, 4096))
    except BlockingIOError:
        return False


def exit_info(status):
    if os.WIFSTOPPED(status):  # a stopped server serves no call: as if that signal had killed it
        return {"signal": os.WSTOPSIG(status)}
    return {"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status) else {"code": os.WEXITSTATUS(status)}
