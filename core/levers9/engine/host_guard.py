"""What containers on a bridge may reach of their own host: replies, nothing else.

The bridge holds an address of the host (the containers' gateway), so without a rule every service the
host listens on at ``0.0.0.0`` or ``::`` (a database, the worker's own metrics, an SSH daemon, a cloud
metadata proxy) would be one connection away from any container. Nothing a container legitimately does
opens a connection to the host: the worker dials into the container (its runner's port, forwarded from
the host's loopback), and so does the gateway's tunnel to a serving container; the container only
answers. So the host accepts from a bridge exactly the packets of connections the host opened, and
refuses the rest:

* one chain per bridge, ``L9IN-<bridge>``, jumped to first thing in the host's ``INPUT`` chain for
  packets that arrive on that bridge: connection-tracking states ``ESTABLISHED`` and ``RELATED`` go
  back to ``INPUT`` (whatever the host's own rules say of them), a new TCP connection is answered with a
  reset (the client sees "connection refused" at once), and every other packet is dropped;
* IPv6 is turned off on the bridge (``net.ipv6.conf.<bridge>.disable_ipv6``), so the host neither has
  a link-local address there nor accepts any IPv6 packet arriving on it, whatever ``ip6tables`` holds.

Why the host's ``INPUT`` chain, and not rules inside each container's network namespace: gVisor's own
network stack sends its packets through a packet socket, which passes by the namespace's ``OUTPUT``
chain, so rules there would not hold for gVisor containers; everything any container sends to the host
arrives through the bridge and meets ``INPUT``. And why not taking the host's address off the bridge:
the worker and the gateway need a route to the containers, and Linux answers on any interface for any of
its addresses, so a route to the host is all a container needs to reach its listeners.

The rules need ``iptables`` (either backend). Where it is missing, or the kernel refuses a rule (no
connection tracking, say), :func:`guard` raises :class:`HostGuardError` with the command's own words, and
the bridge is not used: containers fail to start rather than run with the host open to them.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from levers9.hooks.errors import Levers9Error

__all__ = ["CHAIN_PREFIX", "HostGuardError", "chain_name", "guard", "is_guarded", "unguard"]

#: the per-bridge chain's name is this plus the bridge's name (at most 20 of iptables' 28 characters)
CHAIN_PREFIX = "L9IN-"
#: long enough for a loaded machine, short enough that a wedged iptables does not hang a worker
IPTABLES_TIMEOUT_S = 30.0
INSTALL = "apt-get install -y iptables"
#: where iptables is looked for when PATH (which service managers often cut short) lacks it
FALLBACK_PATHS = (Path("/usr/sbin/iptables"), Path("/sbin/iptables"))

#: the chain's rules, in order
_RULES: tuple[tuple[str, ...], ...] = (
    ("-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"),
    ("-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"),
    ("-j", "DROP"),
)


class HostGuardError(Levers9Error):
    """The rules that keep containers off the host's listeners could not be checked or set; nothing was attached."""


def chain_name(bridge: str) -> str:
    """The bridge's own chain."""
    return f"{CHAIN_PREFIX}{bridge}"


def _iptables() -> str:
    found = shutil.which("iptables") or next((str(p) for p in FALLBACK_PATHS if p.exists()), None)
    if found is None:
        raise HostGuardError(
            "iptables is not installed on this worker, and without it every container on the bridge could connect "
            f"to every service this host listens on; levers9 does not attach containers then ({INSTALL})"
        )
    return found


def _run(args: Sequence[str], binary: str) -> subprocess.CompletedProcess[str]:
    shown = shlex.join(["iptables", *args])
    try:
        return subprocess.run([binary, "-w", *args], capture_output=True, text=True, timeout=IPTABLES_TIMEOUT_S,
                              check=False)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise HostGuardError(f"`{shown}` did not finish within {IPTABLES_TIMEOUT_S:.0f}s") from exc
    except OSError as exc:
        raise HostGuardError(f"`{shown}` could not be started: {exc}") from exc


def _must(args: Sequence[str], binary: str) -> None:
    done = _run(args, binary)
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()) or "no output"
        raise HostGuardError(
            f"`{shlex.join(['iptables', *args])}` failed with exit status {done.returncode}: {said}; containers on "
            "the bridge are not attached while the host's listeners cannot be closed to them"
        )


def _jump(bridge: str) -> list[str]:
    return ["INPUT", "-i", bridge, "-j", chain_name(bridge)]


def is_guarded(bridge: str) -> bool:
    """Whether the bridge's chain holds exactly its rules and ``INPUT`` jumps to it (False without iptables)."""
    try:
        binary = _iptables()
    except HostGuardError:
        return False
    return _complete(bridge, binary)


#: per bridge, the chain's rules as ``iptables -S`` printed them once they were checked rule by rule
_seen: dict[str, list[str]] = {}


def _complete(bridge: str, binary: str) -> bool:
    """One ``iptables -S`` when this process has checked the rules before; each rule with ``-C`` the first time."""
    chain = chain_name(bridge)
    listing = _run(["-S"], binary)
    if listing.returncode != 0:
        return False
    lines = listing.stdout.splitlines()
    rules = [line for line in lines if line.startswith(f"-A {chain} ")]
    jump = f"-A {shlex.join(_jump(bridge))}"
    if jump not in lines or len(rules) != len(_RULES):
        return False
    if _seen.get(bridge) == rules:
        return True
    if any(_run(["-C", chain, *rule], binary).returncode != 0 for rule in _RULES):
        return False
    _seen[bridge] = rules
    return True


def guard(bridge: str) -> None:
    """Make the bridge's rules hold (and IPv6 off on it); quick when they already do. Raises HostGuardError."""
    _ipv6_off(bridge)
    binary = _iptables()
    if _complete(bridge, binary):
        return
    chain = chain_name(bridge)
    if _run(["-S", chain], binary).returncode != 0:
        _must(["-N", chain], binary)
    # Rebuilt whole: the callers hold the bridge's lock, so no other levers9 process edits it meanwhile.
    _must(["-F", chain], binary)
    for rule in _RULES:
        _must(["-A", chain, *rule], binary)
    if _run(["-C", *_jump(bridge)], binary).returncode != 0:
        _must(["-I", "INPUT", "1", *_jump(bridge)[1:]], binary)


def unguard(bridge: str) -> None:
    """Remove the bridge's jump and chain; nothing to remove (or no iptables) is fine."""
    try:
        binary = _iptables()
    except HostGuardError:
        return
    for _ in range(100):  # every copy of the jump, should a crash have left more than one
        if _run(["-D", *_jump(bridge)], binary).returncode != 0:
            break
    chain = chain_name(bridge)
    _seen.pop(bridge, None)
    if _run(["-S", chain], binary).returncode == 0:
        _must(["-F", chain], binary)
        _must(["-X", chain], binary)


def _ipv6_off(bridge: str) -> None:
    """No IPv6 on the bridge: the host gets no link-local address there and drops IPv6 arriving on it."""
    path = Path("/proc/sys/net/ipv6/conf") / bridge / "disable_ipv6"
    if not Path("/proc/sys/net/ipv6").exists():
        return  # a kernel without IPv6 accepts none
    try:
        if path.read_text().strip() != "1":
            path.write_text("1\n")
    except OSError as exc:
        raise HostGuardError(f"turning IPv6 off on bridge {bridge} ({path}) failed: {exc}") from exc
