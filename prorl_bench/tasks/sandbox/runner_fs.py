"""The runner's filesystem and privilege steps (part of the runner's text: ``seccomp.py`` + this file +
``runner.py``, run as ``python -I -S -c``; no project imports): the sample's private root (mode ``full``) and
the server's drop to the sample's uid, limits and seccomp filter.
"""

import ctypes
import os
import resource

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_MOVE = 1, 2, 4, 8, 32, 4096, 8192
PR_SET_NO_NEW_PRIVS = 38
_libc = ctypes.CDLL(None, use_errno=True)


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


def drop_privileges(job, keep):
    """In the server, before the program: limits, no new privileges, the sample's uid, the seccomp filter,
    no inherited descriptor but ``keep``."""
    lo = 3
    for fd in sorted(keep) + [65536]:
        os.closerange(lo, fd)
        lo = fd + 1
    fd = os.open("/dev/null", os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
    if job["mode"] == "rlimits":
        os.setpgid(0, 0)  # no pid namespace: the runner kills the server's process group afterwards
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # setuid binaries give nothing
    uid = job["uid"]
    if uid >= 0 and os.getuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    cpu = job["cpu_s"]
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # per process: each call's copy starts at zero
    if job["rlimit_as"]:  # only without a memory cgroup: then the sole bound, per process
        resource.setrlimit(resource.RLIMIT_AS, (job["rlimit_as"], job["rlimit_as"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (job["fsize_bytes"], job["fsize_bytes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (job["nofile"], job["nofile"]))
    try:
        resource.setrlimit(resource.RLIMIT_NPROC, (job["nproc"], job["nproc"]))
    except (ValueError, OSError):
        pass
    if job["seccomp"]:
        install_seccomp_bpf(job["seccomp"])  # noqa: F821 (defined by seccomp.py, prepended)
    os.chdir("/tmp" if job["mode"] == "full" else job["workdir"])
