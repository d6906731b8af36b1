"""The trusted runner of one sandbox sample (run as ``python -I -S -c <seccomp.py + runner_fs.py + this
file's text>``; no project imports).

It is the first process of the sample (PID 1 of the sample's pid namespace when namespaces are in force) and
never executes the untrusted program itself. It reads its job (program source, entry point, argument lists,
limits) from a memfd, joins the sample's cpu and cpuacct groups (its CPU is the sample's), opens the sample's
cgroup files, builds the sample's private filesystem (mode
``full``), then forks the sample's *server*: a child that joins the sample's cgroup, drops to the sample's
unprivileged uid, applies the rlimits and the seccomp filter, compiles the program and runs its top level
once (within ``import_wall_s``). For each test call the runner makes a pipe and hands its write end to the
server over a ``SOCK_SEQPACKET`` socket (``SCM_RIGHTS``); the server forks a fresh copy of itself that calls
the entry point on that call's arguments and writes the JSON-encoded return value to that pipe (within
``wall_s`` of the call's start, timed by the runner). Between calls every process of the sample but the
server is killed (mode ``full``; in the weaker modes the server is killed too and started again for the
next call). The runner reports one frame per call to the harness over fd ``RESULT_FD`` (argv[2]), a pipe no
process of the sample holds; the program's stdout and stderr are just output. The expected values never
enter the sandbox.

Frames on ``RESULT_FD``: a JSON header line ``{"i": call, "kind": ..., "n": payload bytes, ...}`` followed by
``n`` raw payload bytes (the call's JSON, unparsed: the harness compares it). Kinds: ``result`` (the call
returned or raised: payload ``{"value": v}`` or ``{"error": name}``), ``died`` (the call produced no result:
``code`` or ``signal`` as the server reports it), ``import`` (the top level did not finish: ``code`` or
``signal`` of the server, observed by the runner; ``compiled`` 0 if it died before the program compiled),
``timeout`` (the runner's clock), ``too_large`` (the result passed ``max_result_bytes``), ``main``
(program-only mode: ``code`` or ``signal`` of the one run). Every header has ``oom``: 1 if the
sample's memory cgroup counted an OOM kill or a charge refused at its limit during that phase (the runner
reads the counters; the program cannot write them).
"""

import _json  # the C half of json: json itself (and the re module it imports) costs ~13 ms CPU per sample
import _socket
import marshal
import os
import select
import signal
import sys
import time

RESULT_FD = -1  # set from argv: the write end of the harness's result pipe
WAKE_FD = -1  # readable when a child of the runner changed state (SIGCHLD): the server stopped or died
EXIT_SYNTAX, EXIT_EXCEPTION, EXIT_SETUP = 91, 92, 94
RUNNER_FAILED = 90  # the runner's exit code when the sandbox could not be set up (the harness raises)
READ_BURST, READ_PACE_S, READ_CAP = 64, 0.02, 4096  # reads of one call's result pipe: see CallPipe
_WARM_UP = "def f(a, b=1, *c, **d):\n    for i in range(a):\n        b += [x for x in c if x][i] if c else i\n"


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _exit_code(e):
    return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)


def server(job, cg, ctl):
    """The untrusted side of the sample: never returns. Runs the top level once, then serves calls."""
    signal.set_wakeup_fd(-1)  # the runner's SIGCHLD wake-up is not the server's
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:  # the sandbox's own set-up (no program code has run): a failure here is the sandbox's, not the sample's
        for fd in cg["procs"]:
            os.write(fd, b"0")  # join the sample's cgroup (as root, before the uid drops)
        drop_privileges(job, [ctl.fileno()])  # noqa: F821 (runner_fs.py, prepended)
    except BaseException as e:
        say(f"sandbox: the sample's server could not be set up: {type(e).__name__}: {e}")
        os._exit(EXIT_SETUP)
    try:
        try:
            code = compile(job["source"], "<program>", "exec")
        except BaseException:  # any failure to compile the untrusted text is the program's
            os._exit(EXIT_SYNTAX)
        sock = ctl
        sock.send(b"C")  # compiled: sent before any program code runs
        scope = {"__name__": "__main__"}
        calls, entry_point = job["calls"], job["entry_point"]
        try:
            exec(code, scope)
        except SystemExit as e:
            _flush()
            os._exit(_exit_code(e))
        except BaseException:
            import traceback

            traceback.print_exc(limit=3)
            _flush()
            os._exit(EXIT_EXCEPTION)
        _flush()
        if calls is None:  # program-only mode
            os._exit(0)
        sock.send(b"R")
        while True:
            msg, fds, _, _ = sock.recvmsg(4, 64)
            if not msg:
                os._exit(0)
            wfd = int.from_bytes(fds[0][2][:4], sys.byteorder, signed=True)
            i = int.from_bytes(msg, "little")
            pid = os.fork()
            if pid == 0:
                sock.close()
                call(scope.get(entry_point), calls[i], wfd)
            os.close(wfd)
            _, status = os.waitpid(pid, 0)
            sock.send(b"D" + i.to_bytes(4, "little") + status.to_bytes(4, "little"))
    except SystemExit as e:
        _flush()
        os._exit(_exit_code(e))
    except BaseException:
        os._exit(EXIT_EXCEPTION)


def say(text):
    """A line on the sample's stderr (which the harness shows when the runner fails)."""
    try:
        write_all(2, (text + "\n").encode("utf-8", "replace"))
    except OSError:
        pass


def call(fn, args, wfd):
    """One test call in a fresh copy of the server: never returns."""
    try:
        try:
            data = '{"value": ' + to_json(fn(*args)) + "}"
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as e:
            data = '{"error": ' + to_json(type(e).__name__[:100]) + "}"
        _flush()
        write_all(wfd, data.encode())
        os._exit(0)
    except SystemExit as e:
        _flush()
        os._exit(_exit_code(e))
    except BaseException:
        os._exit(EXIT_EXCEPTION)


def _not_serializable(o):
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def to_json(value):
    """``json.dumps(value, sort_keys=True)`` exactly (the encoder json.dumps itself uses), without importing
    json. Sorted keys make equal values encode to equal bytes: the harness compares bytes first."""
    encode = _json.make_encoder({}, _not_serializable, _json.encode_basestring_ascii, None, ": ", ", ", True,
                                False, True)  # fmt: skip
    return "".join(encode(value, 0))


def _flush():
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except BaseException:
            pass


def start_server(job, cg):
    """Fork the server and wait until its top level ran: (server, None), or (None, failure header). The
    server may send exactly "C" (compiled) then "R" (ready); any other message ends the sample."""
    ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    before = observe(cg)
    deadline = time.monotonic() + job["import_wall_s"]
    pid = os.fork()
    if pid == 0:
        ours.close()
        server(job, cg, theirs)
    theirs.close()
    srv = {"pid": pid, "sock": ours, "pidfd": os.pidfd_open(pid), "status": None}
    got = b""  # the messages so far: "", "C", then "CR"
    poller = select.poll()
    poller.register(ours.fileno(), select.POLLIN)
    poller.register(srv["pidfd"], select.POLLIN)
    poller.register(WAKE_FD, select.POLLIN)
    while got != b"CR":
        left = deadline - time.monotonic()
        events = poller.poll(max(0, int(left * 1000) + 1)) if left > 0 else []
        if not events:
            kill_all(job, srv)
            return None, {"kind": "timeout", **observed(job, cg, before)}
        for fd, _ in events:
            if fd in (srv["pidfd"], WAKE_FD):  # the server ended, or a child of the runner changed state
                while drain(WAKE_FD):
                    pass
                status = server_fate(srv)  # the runner's own child: its status is observed, not reported
                if status is None:
                    continue
                kill_all(job, srv)  # it exited, or it stopped (then it is killed: a stopped top level is a crash)
                if not got and os.WIFEXITED(status) and os.WEXITSTATUS(status) == EXIT_SETUP:
                    return None, {"kind": "setup"}  # the sandbox's set-up failed before any program code ran
                kind = "main" if job["calls"] is None else "import"
                return None, {"kind": kind, "compiled": int(bool(got)), **observed(job, cg, before),
                              **exit_info(status)}  # fmt: skip
            msg = _recv(srv)
            if msg is None:
                poller.unregister(ours.fileno())
            elif len(got) < 2 and msg == b"CR"[len(got) : len(got) + 1]:
                got += msg
            else:
                kill_all(job, srv)
                return None, {"kind": "protocol", **observed(job, cg, before)}
    if job["mode"] == "full" and not kill_others(srv):  # processes the top level started do not persist
        kill_all(job, srv)
        return None, {"kind": "import", "compiled": 1, **observed(job, cg, before), "code": EXIT_EXCEPTION}
    return srv, None


def _recv(srv):
    try:
        return srv["sock"].recv(64) or None
    except OSError:
        return None


class CallPipe:
    """The read end of one call's result pipe, read in large chunks with a bounded number of reads: after
    ``READ_BURST`` reads at most one per ``READ_PACE_S`` (bytes written meanwhile wait in the pipe; a writer
    that fills it blocks, on its own time), and never more than ``READ_CAP`` (then: too large)."""

    def __init__(self, fd, cap):
        self.fd, self.cap, self.buf, self.reads = fd, cap, bytearray(), 0
        self.eof, self.resume = False, 0.0

    def read(self):
        chunk = os.read(self.fd, 65536)
        self.reads += 1
        self.buf += chunk
        self.eof |= not chunk
        if self.reads > READ_BURST:
            self.resume = time.monotonic() + READ_PACE_S
        return bool(chunk)

    def over(self):
        return len(self.buf) > self.cap or self.reads > READ_CAP

    def drain(self):
        """What the call wrote before it ended (descendants may hold the pipe open: no waiting)."""
        os.set_blocking(self.fd, False)
        while not self.eof and not self.over():
            try:
                self.read()
            except BlockingIOError:
                break


def run_call(job, cg, srv, i):
    """Have the server run call ``i``; return (header, payload, server or None if it is gone, how the server
    ended if it died by itself during the call: ``exit_info``, else {}). The server may send one message,
    "D" + i (call i ended; a stale one for call i - 1 is skipped); any other ends the sample. The
    class never comes from what the server says: only from the runner's observation."""
    before = observe(cg)
    fate = server_fate(srv)
    if fate is not None:  # an earlier call stopped or killed the server: the sample ends here
        kill_all(job, srv)
        return {"kind": "died", **observed(job, cg, before), **exit_info(fate)}, b"", None, {}
    rfd, wfd = os.pipe()
    deadline = time.monotonic() + job["wall_s"]
    try:
        srv["sock"].sendmsg(
            [i.to_bytes(4, "little")],
            [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, wfd.to_bytes(4, sys.byteorder, signed=True))],
        )
    except OSError:
        pass  # the server is gone or stopped listening: the call gets no result
    os.close(wfd)
    pipe = CallPipe(rfd, job["max_result_bytes"])
    end = _wait_call(srv, pipe, deadline, i)
    pipe.drain()
    os.close(rfd)
    fate = server_fate(srv) if end == "gone" else None  # stopped or died: the runner's own waitpid
    if end != "done" or pipe.over() or job["mode"] != "full" or not kill_others(srv):
        kill_all(job, srv)
        if end == "gone" and fate is None:  # it had exited (its pidfd said so): kill_all reaped it
            fate = srv["status"]
        info = exit_info(fate) if fate is not None else {}
        srv = None
    else:
        info = {}
    seen = observed(job, cg, before)
    if end in ("timeout", "protocol"):
        return {"kind": end, **seen}, b"", srv, info
    if pipe.over():
        return {"kind": "too_large", **seen}, b"", srv, info
    if pipe.buf:
        return {"kind": "result", **seen}, bytes(pipe.buf), srv, info
    return {"kind": "died", **seen, **info}, b"", srv, {}


def _wait_call(srv, pipe, deadline, i):
    """Wait for call ``i`` to end: "done" (its "D" message, or its pipe closed after data), "timeout" (the
    runner's clock), "gone" (the server died), "protocol" (an unexpected message)."""
    poller = select.poll()
    for fd in (pipe.fd, srv["sock"].fileno(), srv["pidfd"], WAKE_FD):
        poller.register(fd, select.POLLIN)
    stale = i - 1  # the "D" of the previous call may still be queued (the runner ends a call at its pipe's EOF)
    while True:
        now = time.monotonic()
        if now >= deadline:
            return "timeout"
        if pipe.resume and now >= pipe.resume:
            poller.register(pipe.fd, select.POLLIN)
            pipe.resume = 0.0
        wake = min(deadline, pipe.resume or deadline)
        for fd, _ in poller.poll(max(0, int((wake - now) * 1000) + 1)):
            if fd == pipe.fd:
                pipe.read()
                if pipe.eof or pipe.over():
                    poller.unregister(pipe.fd)
                    pipe.resume = 0.0
                    if pipe.buf or pipe.over():
                        return "done"
                elif pipe.resume:
                    poller.unregister(pipe.fd)
            elif fd == srv["pidfd"]:
                return "gone"
            elif fd == WAKE_FD:  # a child changed state: "gone" if it is the server and it stopped (or died)
                while drain(WAKE_FD):
                    pass
                if server_fate(srv) is not None:
                    return "gone"
            else:
                msg = _recv(srv)
                if msg is None:
                    poller.unregister(srv["sock"].fileno())
                elif len(msg) == 9 and msg[:1] == b"D" and int.from_bytes(msg[1:5], "little") == i:
                    return "done"
                elif len(msg) == 9 and msg[:1] == b"D" and stale >= 0 and int.from_bytes(msg[1:5], "little") == stale:
                    stale = -1
                else:
                    return "protocol"


def report(i, header, payload):
    header = dict(header, i=i, n=len(payload))  # str and int values only
    write_all(RESULT_FD, to_json(header).encode() + b"\n" + payload)


def open_cgroup(job):
    """The sample's cgroup files, opened while the host's filesystem is still visible."""
    spec = job["cgroup"]
    if not spec:
        return {"procs": [], "counters": [], "cpu": []}
    return {"procs": [os.open(p, os.O_WRONLY) for p in spec["procs"]],
            "counters": [(os.open(p, os.O_RDONLY), key) for p, key in spec["counters"]],
            "cpu": [(os.open(p, os.O_RDONLY), key, scale) for p, key, scale in spec["cpu"]]}  # fmt: skip


def main():
    global RESULT_FD, WAKE_FD
    job_fd, RESULT_FD = int(sys.argv[1]), int(sys.argv[2])
    WAKE_FD, wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a stopped server wakes the runner (see _wait_call)
    signal.set_wakeup_fd(wake)
    with os.fdopen(job_fd, "rb") as f:
        job = marshal.loads(f.read())  # written by the harness (trusted), like this runner's source
    for path in (job["cgroup"] or {}).get("runner", ()):  # its work for the sample is the sample's CPU
        with open(path, "w") as f:
            f.write("0")
    cg = open_cgroup(job)
    if job["mode"] == "full":
        build_root(job["workdir"], job)  # noqa: F821 (runner_fs.py, prepended)
    # The first compile() of a process builds the compiler's state (~3 ms CPU): done once here, inherited by
    # the server. (The program itself is compiled only in the server: it is untrusted input.)
    compile(_WARM_UP, "<warm-up>", "exec")
    to_json([1, 2.5, "x", {"k": None}])
    calls = job["calls"]
    srv = None
    for i in range(1 if calls is None else len(calls)):
        if srv is None:
            srv, header = start_server(job, cg)
            if header is not None and header["kind"] == "setup":
                say("sandbox: the runner stops: the sample's server could not be set up (see above)")
                os._exit(RUNNER_FAILED)  # the harness raises SandboxBroken with this stderr
            if header is not None:
                report(i, header, b"")
                break
        header, payload, srv, fate = run_call(job, cg, srv, i)
        report(i, header, payload)
        if header["kind"] in ("timeout", "protocol") or header["oom"]:
            break  # the call's time is up, the sample broke the protocol or hit its memory limit: no more calls
        if srv is None and job["mode"] == "full":  # the server, which ran the top level once, is gone: no rerun
            if fate and i + 1 < len(calls):  # it died during call i, after that call's result: the next one
                report(i + 1, {"kind": "died", "oom": 0, "cpu": header["cpu"], **fate}, b"")
            break
    if srv is not None:
        kill_all(job, srv)
    os.close(RESULT_FD)


if __name__ == "__main__":
    main()
