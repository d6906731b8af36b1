"""The trusted runner of one sandbox sample (run as ``python -I -S -c <this file's text>``; no project imports).

It is the first process of the sample (PID 1 of the sample's pid namespace when namespaces are in force) and
never executes the untrusted program itself. It reads its job (program source, entry point, argument lists,
limits) from a memfd, builds the sample's private filesystem (mode ``full``), then for each test call forks a
fresh child that drops to the sample's unprivileged uid, executes the program, calls the entry point on that
call's arguments and writes the JSON-encoded return value to a pipe made for that call alone. The runner
reports one frame per call to the harness over fd ``RESULT_FD`` (argv[2]), a pipe the children close before the program
runs; the program's stdout and stderr are just output. The expected values never enter the sandbox.

Frames on ``RESULT_FD``: a JSON header line ``{"i": call, "kind": ..., "n": payload bytes, ...}`` followed by
``n`` raw payload bytes (the child's JSON, unparsed: the harness parses it). Kinds: ``result`` (the call
returned or raised: payload ``{"value": v}`` or ``{"error": name}``), ``died`` (the program ran but the call
produced no result: ``code`` or ``signal``), ``import`` (the program did not get as far as the call: ``code``
or ``signal``; 91 syntax error, 92 exception, 93 MemoryError), ``timeout`` (the sample's wall deadline or the
CPU limit), ``too_large`` (the result passed ``max_result_bytes``), ``main`` (program-only mode: ``code`` or
``signal`` of the one run).
"""

import _json  # the C half of json: json itself (and the re module it imports) costs ~13 ms CPU per sample
import ctypes
import marshal
import os
import resource
import select
import signal
import sys
import time

RESULT_FD = -1  # set from argv: the write end of the harness's result pipe
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_MOVE = 1, 2, 4, 8, 32, 4096, 8192
PR_SET_NO_NEW_PRIVS = 38
EXIT_SYNTAX, EXIT_EXCEPTION, EXIT_MEMORY = 91, 92, 93
_libc = ctypes.CDLL(None, use_errno=True)
_WARM_UP = "def f(a, b=1, *c, **d):\n    for i in range(a):\n        b += [x for x in c if x][i] if c else i\n"


def mount(src, dst, fstype, flags, data=None):
    enc = [None if s is None else s.encode() for s in (src, dst, fstype, data)]
    if _libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {src} -> {dst} ({fstype}): {os.strerror(err)}")


def bind(root, path, readonly=True):
    """Bind-mount host ``path`` (dir or file) at the same place under ``root``, read-only, nosuid."""
    target = root + path
    if os.path.isdir(path):
        os.makedirs(target, mode=0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        open(target, "a").close()
    mount(path, target, None, MS_BIND)
    if readonly:
        mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def build_root(root, job):
    """The sample's filesystem: a read-only tmpfs holding read-only binds of what Python needs, fresh tmpfs
    /tmp and /dev/shm, a few device nodes, a fresh /proc; then the root moves there (the host's is unreachable)."""
    size = job["tmpfs_bytes"]
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=755")
    for top in job["system"]:  # /usr, /bin -> usr/bin links (merged /usr), /lib64 ...
        if os.path.islink(top):
            os.symlink(os.readlink(top), root + top)
        elif os.path.isdir(top):
            bind(root, top)
    for path in job["binds"]:  # the interpreter's own prefix (stdlib), ld.so.cache
        if os.path.exists(path) and not os.path.exists(root + path):
            bind(root, path)
    for dev in ("null", "zero", "random", "urandom"):
        bind(root, "/dev/" + dev, readonly=False)  # device nodes: writing them is not writing a file
    for d in ("/tmp", "/dev/shm"):
        os.makedirs(root + d, exist_ok=True)
        mount("tmpfs", root + d, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},nr_inodes=1024,mode=1777")
    os.makedirs(root + "/proc", exist_ok=True)
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for path in job["hide"]:  # project files that fall inside a bound tree (e.g. a package installed in /usr)
        if os.path.isdir(root + path):
            mount("tmpfs", root + path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=755")
        elif os.path.exists(root + path):
            mount("/dev/null", root + path, None, MS_BIND)
    mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(root)
    mount(root, "/", None, MS_MOVE)
    os.chroot(".")
    os.chdir("/")


def drop_privileges(job):
    """In the child, before the program: limits, no new privileges, the sample's uid, no inherited fds."""
    os.closerange(3, job["keep_fd"])
    os.closerange(job["keep_fd"] + 1, 65536)
    fd = os.open("/dev/null", os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
    if job["mode"] == "rlimits":
        os.setpgid(0, 0)  # no pid namespace: the runner kills the call's process group afterwards
    cpu, mem, fsize, nproc = job["cpu_s"], job["memory_bytes"], job["fsize_bytes"], job["nproc"]
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # setuid binaries give nothing
    uid = job["uid"]
    if uid >= 0 and os.getuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    try:
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    except (ValueError, OSError):
        pass
    os.chdir("/tmp" if job["mode"] == "full" else job["workdir"])


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def child(job, call, wfd):
    """The untrusted side of one call: never returns."""
    try:
        job["keep_fd"] = wfd
        drop_privileges(job)
        try:
            code = compile(job["source"], "<program>", "exec")
        except (SyntaxError, ValueError):
            os._exit(EXIT_SYNTAX)
        scope = {"__name__": "__main__"}
        try:
            exec(code, scope)
        except MemoryError:
            os._exit(EXIT_MEMORY)
        except SystemExit as e:
            _flush()
            os._exit(e.code if isinstance(e.code, int) else (0 if e.code is None else 1))
        except BaseException:
            import traceback

            traceback.print_exc(limit=3)
            _flush()
            os._exit(EXIT_EXCEPTION)
        if call is None:  # program-only mode
            _flush()
            os._exit(0)
        os.write(wfd, b"I")  # the program ran: from here on a missing result is the call's
        try:
            data = '{"value": ' + to_json(scope.get(job["entry_point"])(*call)) + "}"
        except BaseException as e:
            if isinstance(e, (SystemExit, KeyboardInterrupt)):
                raise
            data = '{"error": ' + to_json(type(e).__name__) + "}"
        _flush()
        write_all(wfd, data.encode())
        os._exit(0)
    except SystemExit as e:
        _flush()
        os._exit(e.code if isinstance(e.code, int) else 1)
    except BaseException:
        os._exit(EXIT_EXCEPTION)


def _not_serializable(o):
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def to_json(value):
    """``json.dumps(value)`` exactly (the encoder json.dumps itself uses), without importing json."""
    encode = _json.make_encoder({}, _not_serializable, _json.encode_basestring_ascii, None, ": ", ", ", False,
                                False, True)  # fmt: skip
    return "".join(encode(value, 0))


def _flush():
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except BaseException:
            pass


def kill_rest(job, pid):
    """Kill every process of the sample but this one and reap them (pid namespace: all of them)."""
    if job["mode"] == "rlimits":
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    else:
        try:
            os.kill(-1, signal.SIGKILL)  # as PID 1 of the namespace: everyone else in it
        except OSError:
            pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return
        except InterruptedError:
            continue


def run_call(job, call, deadline):
    """Fork one child for ``call``; return (header dict, payload bytes)."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        child(job, call, wfd)
    os.close(wfd)
    pidfd = os.pidfd_open(pid)
    poller = select.poll()
    poller.register(rfd, select.POLLIN)
    poller.register(pidfd, select.POLLIN)
    buf, cap, status, timed_out = bytearray(), job["max_result_bytes"] + 1, None, False
    while status is None:
        left = deadline - time.monotonic()
        events = poller.poll(max(0, int(left * 1000) + 1)) if left > 0 else []
        if not events:
            timed_out = True
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            break
        for fd, _ in events:
            if fd == rfd:
                chunk = os.read(rfd, 65536)
                buf += chunk
                if not chunk or len(buf) > cap:
                    poller.unregister(rfd)  # the end, or too much: read no further
                if len(buf) > cap:
                    os.kill(pid, signal.SIGKILL)
            elif fd == pidfd:
                _, status = os.waitpid(pid, 0)
    os.set_blocking(rfd, False)
    while len(buf) <= cap:  # what the child wrote before it exited; descendants may hold the pipe open
        try:
            chunk = os.read(rfd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        buf += chunk
    kill_rest(job, pid)
    os.close(rfd)
    os.close(pidfd)
    return classify(call, status, bytes(buf), timed_out, cap)


def classify(call, status, buf, timed_out, cap):
    exit_info = {"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status) else {"code": os.WEXITSTATUS(status)}
    sig = exit_info.get("signal")
    if timed_out or sig == signal.SIGXCPU:
        return {"kind": "timeout", **exit_info}, b""
    if len(buf) > cap:
        return {"kind": "too_large"}, b""
    if call is None:
        return {"kind": "main", **exit_info}, b""
    if not buf.startswith(b"I"):
        return {"kind": "import", **exit_info}, b""
    if len(buf) == 1:
        return {"kind": "died", **exit_info}, b""
    return {"kind": "result"}, buf[1:]


def report(i, header, payload):
    header = dict(header, i=i, n=len(payload))  # str and int values only
    write_all(RESULT_FD, to_json(header).encode() + b"\n" + payload)


def main():
    global RESULT_FD
    t0 = time.monotonic()
    job_fd, RESULT_FD = int(sys.argv[1]), int(sys.argv[2])
    with os.fdopen(job_fd, "rb") as f:
        job = marshal.loads(f.read())  # written by the harness (trusted), like this runner's source
    deadline = t0 + job["wall_s"]
    if job["mode"] == "full":
        build_root(job["workdir"], job)
    calls = job["calls"]
    # The first compile() of a process builds the compiler's state (~3 ms CPU): done once here, inherited by
    # every call's child. (The program itself is compiled only in the children: it is untrusted input.)
    compile(_WARM_UP, "<warm-up>", "exec")
    to_json([1, 2.5, "x", {"k": None}])
    for i, call in enumerate([None] if calls is None else calls):
        header, payload = run_call(job, call, deadline)
        report(i, header, payload)
        if header["kind"] in ("timeout", "import"):
            break  # the program cannot reach the next call either (or the sample's time is up)
    os.close(RESULT_FD)


if __name__ == "__main__":
    main()
