"""The seccomp filter of a sandbox sample: the system calls a test program has no use for, refused.

Stdlib only (``ctypes`` over libseccomp, ``libseccomp.so.2``): the harness builds the filter once per process
and exports it as a raw BPF program in the job; the runner (``python -I -S``, no project imports: it runs
``install_seccomp_bpf`` from this file's text, prepended to its own) installs it in the sample's server
process after dropping its privileges, with ``prctl`` alone; every process of the sample inherits it and
no process can remove it. Architectures other than the native one are killed (libseccomp's default), so the
i386 ``int 0x80`` entry cannot bypass the rules.

Refused (``EPERM`` unless noted):

- new namespaces: ``unshare``, ``setns``, ``clone`` with any ``CLONE_NEW*`` flag, ``clone3`` (``ENOSYS``, so
  glibc falls back to ``clone``, whose flags a filter can read; ``clone3`` passes them in memory);
- kernel keyrings (per uid, not per namespace): ``add_key``, ``keyctl``, ``request_key``;
- socket families beyond ``AF_UNIX``/``AF_INET``/``AF_INET6`` (``AF_VSOCK`` ignores network namespaces,
  ``AF_ALG``, ``AF_NETLINK``, ``AF_PACKET``, ...) and ``SOCK_RAW``/``SOCK_PACKET`` of any family;
- other processes and the kernel: ``ptrace``, ``process_vm_readv/writev``, ``pidfd_getfd``, ``kcmp``, ``bpf``,
  ``perf_event_open``, ``userfaultfd``, ``io_uring_*`` (its operations bypass seccomp), mounts and the new mount
  API, ``chroot``, ``pivot_root``, modules, ``kexec``, ``reboot``, swap, ``acct``, quotas, clocks,
  host/domain names, ``syslog``, ``open_by_handle_at``, ``fanotify_init``, ``iopl``/``ioperm``/``modify_ldt``,
  ``statmount``, ``listmount``, ``open_tree_attr`` (by number where libseccomp does not know them);
- the host's page cache: ``fadvise64`` (``POSIX_FADV_DONTNEED`` evicts a shared file's cached pages, e.g. the
  stdlib's), ``madvise`` with ``MADV_COLD``/``MADV_PAGEOUT``, ``process_madvise`` (every other ``madvise``,
  which only touches the caller's own mappings, is allowed: malloc needs it); ``cachestat`` and ``mincore``
  (which pages of a shared file are cached: a channel between samples);
- the machine's writeback and memory placement: ``sync``, ``syncfs`` (host-wide I/O on the trainer's time),
  ``mbind``, ``set_mempolicy``, ``set_mempolicy_home_node``, ``migrate_pages``, ``move_pages``, ``memfd_secret``,
  ``process_mrelease``, ``vmsplice``.

A test per family (``tests/tasks/test_sandbox_v5.py``) calls each one with arguments no kernel accepts, in a
sample and as root with the filter alone: ``EPERM`` in both.
"""

import ctypes
import errno

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_GT, SCMP_CMP_MASKED_EQ = 6, 7
CLONE_NEW_FLAGS = {
    "CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}  # fmt: skip
ALLOWED_FAMILIES = (1, 2, 10)  # AF_UNIX, AF_INET, AF_INET6
SOCK_TYPE_MASK, SOCK_RAW, SOCK_PACKET = 0xF, 3, 10
DENIED_SYSCALLS = (
    "unshare", "setns", "add_key", "keyctl", "request_key", "ptrace", "process_vm_readv", "process_vm_writev",
    "pidfd_getfd", "kcmp", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick",
    "move_mount", "open_tree", "mount_setattr", "init_module", "finit_module", "delete_module", "kexec_load",
    "kexec_file_load", "reboot", "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "settimeofday",
    "clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname", "syslog", "open_by_handle_at",
    "name_to_handle_at", "fanotify_init", "iopl", "ioperm", "modify_ldt", "vhangup", "lookup_dcookie", "uselib",
    "nfsservctl", "_sysctl", "fadvise64", "process_madvise", "open_tree_attr", "statmount", "listmount",
    "cachestat", "mincore", "sync", "syncfs", "mbind", "set_mempolicy", "set_mempolicy_home_node", "migrate_pages",
    "move_pages", "memfd_secret", "process_mrelease", "vmsplice",
)  # fmt: skip
# System calls newer than some libseccomp releases (2.5 resolves none of these): their numbers, the same on
# every architecture since Linux 5.1 numbered new calls alike (asm-generic), used when the name is unknown.
UNIFIED_NUMBERS = {"memfd_secret": 447, "process_mrelease": 448, "set_mempolicy_home_node": 450, "cachestat": 451,
                   "statmount": 457, "listmount": 458, "open_tree_attr": 467}  # fmt: skip
MADV_COLD, MADV_PAGEOUT = 20, 21  # reclaim pages of a mapping: on a shared file, the host's page cache


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]  # fmt: skip


def _errno_action(code):
    return 0x00050000 | (code & 0xFFFF)  # SCMP_ACT_ERRNO(code)


def build_seccomp_filter():
    """The library and a libseccomp context (an opaque pointer) holding every rule; raises OSError if
    libseccomp is missing or refuses a rule."""
    lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_ArgCmp)]  # fmt: skip
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        raise OSError("seccomp_init failed")

    def rule(action, name, *cmps):
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        if nr < 0:
            nr = UNIFIED_NUMBERS.get(name, -1)
        if nr < 0:
            return  # not a system call of this architecture
        arr = (_ArgCmp * max(1, len(cmps)))(*cmps)
        rc = lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), arr)
        if rc < 0:
            raise OSError(-rc, f"seccomp rule for {name}: {errno.errorcode.get(-rc, rc)}")

    eperm = _errno_action(errno.EPERM)
    for name in DENIED_SYSCALLS:
        rule(eperm, name)
    rule(_errno_action(errno.ENOSYS), "clone3")
    for advice in (MADV_COLD, MADV_PAGEOUT):
        rule(eperm, "madvise", _ArgCmp(2, SCMP_CMP_MASKED_EQ, 0xFFFFFFFF, advice))
    for flag in CLONE_NEW_FLAGS.values():
        rule(eperm, "clone", _ArgCmp(0, SCMP_CMP_MASKED_EQ, flag, flag))
    no_family = _errno_action(errno.EAFNOSUPPORT)
    for call in ("socket", "socketpair"):
        # the low 32 bits, as the kernel reads an int (upper bits set would slip past an equality); anything
        # above AF_INET6 is refused whole (GT reads all 64 bits: a value with upper bits set is refused too)
        for family in (0, 3, 4, 5, 6, 7, 8, 9):
            rule(no_family, call, _ArgCmp(0, SCMP_CMP_MASKED_EQ, 0xFFFFFFFF, family))
        rule(no_family, call, _ArgCmp(0, SCMP_CMP_GT, max(ALLOWED_FAMILIES), 0))
    for kind in (SOCK_RAW, SOCK_PACKET):
        for call in ("socket", "socketpair"):
            rule(eperm, call, _ArgCmp(1, SCMP_CMP_MASKED_EQ, SOCK_TYPE_MASK, kind))
    return lib, ctx


def export_seccomp_bpf():
    """The filter as a raw classic-BPF program (bytes: 8-byte ``sock_filter`` entries), built once by the
    harness; the runner installs it with ``install_seccomp_bpf`` and needs no libseccomp."""
    import os

    lib, ctx = build_seccomp_filter()
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    fd = os.memfd_create("prorl_sbx_bpf")
    try:
        rc = lib.seccomp_export_bpf(ctx, fd)
        if rc < 0:
            raise OSError(-rc, f"seccomp_export_bpf: {errno.errorcode.get(-rc, rc)}")
        os.lseek(fd, 0, os.SEEK_SET)
        data = b""
        while chunk := os.read(fd, 65536):
            data += chunk
    finally:
        os.close(fd)
        lib.seccomp_release.argtypes = [ctypes.c_void_p]
        lib.seccomp_release(ctx)
    if not data or len(data) % 8:
        raise OSError(f"seccomp_export_bpf gave {len(data)} bytes")
    return data


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_seccomp_bpf(bpf):
    """Install the exported filter in this process (after no_new_privs); raises OSError on failure."""
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(bpf, len(bpf))
    prog = _SockFprog(len(bpf) // 8, ctypes.cast(buf, ctypes.c_void_p))
    pr_set_seccomp, seccomp_mode_filter = 22, 2
    if libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.byref(prog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_SECCOMP): {errno.errorcode.get(err, err)}")
