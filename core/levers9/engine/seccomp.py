"""The seccomp profile of every runc and gVisor container: the system calls a container may not make.

The profile is a deny-list: a call not named here is allowed. The container has already lost the
capabilities it would need for most of what is named (mounting, loading modules, setting the clock), so
for those the profile is a second lock; what it adds on its own is the kernel surface that needs no
capability at all and is a classic way from a process to the host kernel: new user namespaces (and every
other namespace), keyrings, BPF, perf events, userfaultfd, io_uring, tracing other processes, and device
nodes. Ordinary software (interpreters, compilers, servers, package managers, GPU libraries) makes none
of these calls, which is why a deny-list is the choice over an allow-list: an allow-list breaks whatever
new system call a newer libc starts to use, and a broken container is not safer than one with a short,
reviewed deny-list.

Invariants:

* every denied call fails with ``EPERM``, except ``clone3``, which fails with ``ENOSYS``: its flags sit
  in a structure seccomp cannot read, and ``ENOSYS`` makes the C library fall back to ``clone``, whose
  flags the profile does check. A runtime that ignores a rule's own errno (runsc, which answers
  ``EPERM`` to all of them) gets the profile without the ``clone3`` rule (``errno_ret=False``): an
  ``EPERM`` there would stop the C library from starting threads, and gVisor's kernel has no
  ``clone3`` anyway (it answers ``ENOSYS`` itself);
* ``clone`` and ``unshare`` are refused when their flags ask for any new namespace, and allowed otherwise
  (threads and ``fork`` use them);
* ``mknod`` and ``mknodat`` are refused for character and block devices only: FIFOs and plain files stay;
* the profile lists the machine's native architecture and its 32-bit compatibility ABIs, so a denied call
  cannot be reached by its number in another ABI; on an architecture this module does not know the
  runtime filters the native one only.

runc applies the profile to the container's first process just before it starts the command, after
runc's own set-up. runsc applies it inside the sandbox, to the application's calls to gVisor's kernel,
when started with ``--oci-seccomp``; without that flag runsc ignores it (gVisor's own host-side filter
then stands alone).
"""

from __future__ import annotations

import errno
import platform
from typing import Any

__all__ = ["DENIED", "NAMESPACE_FLAGS", "architectures", "profile"]

#: system calls no container may make, by why; all fail with EPERM
DENIED: dict[str, tuple[str, ...]] = {
    "mounting and moving file systems": (
        "mount",
        "umount",
        "umount2",
        "pivot_root",
        "fsopen",
        "fsconfig",
        "fsmount",
        "fspick",
        "move_mount",
        "open_tree",
        "mount_setattr",
    ),
    "joining namespaces": ("setns",),
    "kernel modules and rebooting into another kernel": (
        "init_module",
        "finit_module",
        "delete_module",
        "create_module",
        "kexec_load",
        "kexec_file_load",
    ),
    "kernel interfaces that are not namespaced, or a frequent way into kernel bugs": (
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "keyctl",
        "add_key",
        "request_key",
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "lookup_dcookie",
        "fanotify_init",
    ),
    "opening files by handle, around the container's root": ("open_by_handle_at", "name_to_handle_at"),
    "the host's state: clock, swap, accounting, quotas, the kernel log": (
        "reboot",
        "swapon",
        "swapoff",
        "acct",
        "settimeofday",
        "stime",
        "clock_settime",
        "clock_settime64",
        "clock_adjtime",
        "clock_adjtime64",
        "syslog",
        "quotactl",
        "quotactl_fd",
        "nfsservctl",
        "vhangup",
    ),
    "hardware I/O ports and obsolete calls": (
        "iopl",
        "ioperm",
        "uselib",
        "_sysctl",
        "get_kernel_syms",
        "query_module",
        "vm86",
        "vm86old",
    ),
    "reading or writing other processes": ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd"),
}

#: the ``clone``/``unshare`` flags that make a new namespace: CLONE_NEWTIME, NEWNS, NEWCGROUP, NEWUTS,
#: NEWIPC, NEWUSER, NEWPID, NEWNET
NAMESPACE_FLAGS = (0x80, 0x20000, 0x2000000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000)

_CLONE_NEWTIME = 0x80
_S_IFMT = 0o170000
_DEVICE_TYPES = (0o020000, 0o060000)  # S_IFCHR, S_IFBLK

#: libseccomp's names for the native ABI of a machine, then the compatibility ABIs its kernel may run
_ARCHES = {
    "x86_64": ("SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"),
    "aarch64": ("SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"),
    "ppc64le": ("SCMP_ARCH_PPC64LE",),
    "s390x": ("SCMP_ARCH_S390X", "SCMP_ARCH_S390"),
    "riscv64": ("SCMP_ARCH_RISCV64",),
}


def architectures(machine: str | None = None) -> tuple[str, ...]:
    """The ABIs the profile covers on ``machine`` (``platform.machine()`` when None); empty when unknown."""
    return _ARCHES.get(machine or platform.machine(), ())


def _masked(index: int, mask: int, value: int) -> dict[str, Any]:
    """The condition "argument ``index``, masked with ``mask``, equals ``value``"."""
    return {"index": index, "value": mask, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"}


def profile(machine: str | None = None, *, errno_ret: bool = True) -> dict[str, Any]:
    """The OCI ``linux.seccomp`` object for ``machine`` (this machine when None).

    ``errno_ret=False`` is for a runtime that answers every refused call with ``EPERM`` whatever the rule
    says: the ``clone3`` rule, which needs ``ENOSYS``, is left out.
    """
    denied = sorted({name for names in DENIED.values() for name in names})
    rules: list[dict[str, Any]] = [{"names": denied, "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM}]
    if errno_ret:
        rules.append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS})
    # Rules for one call are alternatives: a call matching any one of them is refused.
    flags_arg = 1 if (machine or platform.machine()) in ("s390x", "s390") else 0  # s390 swaps clone's first two
    for flag in NAMESPACE_FLAGS:
        rules.append(
            {
                "names": ["unshare"],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": errno.EPERM,
                "args": [_masked(0, flag, flag)],
            }
        )
        if flag != _CLONE_NEWTIME:  # clone's low byte is the exit signal; a new time namespace needs clone3
            rules.append(
                {
                    "names": ["clone"],
                    "action": "SCMP_ACT_ERRNO",
                    "errnoRet": errno.EPERM,
                    "args": [_masked(flags_arg, flag, flag)],
                }
            )
    for kind in _DEVICE_TYPES:
        rules.append(
            {
                "names": ["mknod"],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": errno.EPERM,
                "args": [_masked(1, _S_IFMT, kind)],
            }
        )
        rules.append(
            {
                "names": ["mknodat"],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": errno.EPERM,
                "args": [_masked(2, _S_IFMT, kind)],
            }
        )
    config: dict[str, Any] = {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": rules}
    arches = architectures(machine)
    if arches:
        config["architectures"] = list(arches)
    return config
