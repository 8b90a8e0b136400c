"""Run a command as an unprivileged user: ``python -I -S as_user.py UID GID WORKDIR -- COMMAND...``.

The process runtime's shim runs this as root in place of the command when
the worker is root (see :mod:`levers9.engine.process`). It drops every
group, then the group id, then the user id (real, effective and saved, so
there is no way back), forbids gaining privileges again through set-uid
programs, enters ``WORKDIR`` as that user and execs the command: same pid,
same process group and session, same inherited output descriptors, so the
shim's supervision, output capture and group kill are unchanged.

Run as a script, never imported, with the standard library only: it sits on
the start-up path of every such call. On failure it exits 126 (cannot drop,
cannot enter the workdir) or 127 (no such command), like ``env``.
"""

from __future__ import annotations

import ctypes
import os
import sys
import warnings  # noqa: F401  # os.execvp imports it; after the switch the standard library may be out of reach

#: prctl option: no set-uid, set-gid or file-capability exec may raise this process's privileges again
_PR_SET_NO_NEW_PRIVS = 38


def _fail(code: int, message: str) -> None:
    sys.stderr.write(f"levers9 process runtime: {message}\n")
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str]) -> None:
    if len(argv) < 6 or argv[4] != "--":
        _fail(126, "usage: as_user.py UID GID WORKDIR -- COMMAND...")
    uid, gid, workdir, command = int(argv[1]), int(argv[2]), argv[3], argv[5:]
    try:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    except OSError as exc:
        _fail(126, f"cannot switch to uid {uid} gid {gid}: {exc.strerror}")
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    except OSError:
        pass  # not Linux: the uid switch above is what matters
    try:
        os.chdir(workdir)
    except OSError as exc:
        _fail(126, f"uid {uid} cannot enter the workdir {workdir}: {exc.strerror}")
    try:
        os.execvp(command[0], command)
    except FileNotFoundError:
        _fail(127, f"{command[0]}: command not found")
    except OSError as exc:
        _fail(126, f"uid {uid} cannot run {command[0]}: {exc.strerror}")


if __name__ == "__main__":
    main(sys.argv)
