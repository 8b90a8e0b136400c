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
* one exception, for the image builder's egress proxy (:mod:`levers9.builder.egress`), which listens on the
  gateway while a build runs: the bridge's chain first jumps to a second chain, ``L9AL-<bridge>``, which
  holds one rule per build container, accepting TCP from exactly that container's address to exactly the
  proxy's address and port (:func:`allow`, taken back with :func:`disallow`). Rebuilding the bridge's
  chain never touches it, so the containers of a build running meanwhile keep their way out; it is empty
  when no build runs, and every other port of the host stays refused to every container. A worker killed
  during a build cannot take its rules back: :func:`sweep_allowances` removes every rule whose port
  nothing listens on any more (each proxy sweeps as it starts, before it admits anyone);
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

import ipaddress
import shlex
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from levers9.hooks.errors import Levers9Error

__all__ = [
    "ALLOW_PREFIX",
    "CHAIN_PREFIX",
    "HostGuardError",
    "allow",
    "allow_chain_name",
    "allowances",
    "chain_name",
    "disallow",
    "guard",
    "is_guarded",
    "sweep_allowances",
    "unguard",
]

#: the per-bridge chain's name is this plus the bridge's name (at most 20 of iptables' 28 characters)
CHAIN_PREFIX = "L9IN-"
#: the per-bridge chain of single ports opened to single containers (see the module's docstring)
ALLOW_PREFIX = "L9AL-"
#: long enough for a loaded machine, short enough that a wedged iptables does not hang a worker
IPTABLES_TIMEOUT_S = 30.0
INSTALL = "apt-get install -y iptables"
#: where iptables is looked for when PATH (which service managers often cut short) lacks it
FALLBACK_PATHS = (Path("/usr/sbin/iptables"), Path("/sbin/iptables"))


def _rules(bridge: str) -> tuple[tuple[str, ...], ...]:
    """The bridge's chain's rules, in order."""
    return (
        ("-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"),
        ("-j", allow_chain_name(bridge)),
        ("-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"),
        ("-j", "DROP"),
    )


class HostGuardError(Levers9Error):
    """The rules that keep containers off the host's listeners could not be checked or set; nothing was attached."""


def chain_name(bridge: str) -> str:
    """The bridge's own chain."""
    return f"{CHAIN_PREFIX}{bridge}"


def allow_chain_name(bridge: str) -> str:
    """The bridge's chain of ports opened to single containers."""
    return f"{ALLOW_PREFIX}{bridge}"


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
        return subprocess.run(
            [binary, "-w", *args], capture_output=True, text=True, timeout=IPTABLES_TIMEOUT_S, check=False
        )
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
    expected = _rules(bridge)
    if jump not in lines or len(rules) != len(expected):
        return False
    if _seen.get(bridge) == rules:
        return True
    if any(_run(["-C", chain, *rule], binary).returncode != 0 for rule in expected):
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
    if _run(["-S", allow_chain_name(bridge)], binary).returncode != 0:
        _must(["-N", allow_chain_name(bridge)], binary)  # created empty, never flushed here: builds may hold rules
    if _run(["-S", chain], binary).returncode != 0:
        _must(["-N", chain], binary)
    # Rebuilt whole: the callers hold the bridge's lock, so no other levers9 process edits it meanwhile.
    _must(["-F", chain], binary)
    for rule in _rules(bridge):
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
    _seen.pop(bridge, None)
    for chain in (chain_name(bridge), allow_chain_name(bridge)):  # the first refers to the second: it goes first
        if _run(["-S", chain], binary).returncode == 0:
            _must(["-F", chain], binary)
            _must(["-X", chain], binary)


def _allowance(source: str, destination: str, port: int) -> list[str]:
    """The rule accepting TCP from ``source`` to ``destination:port``; ValueError names a bad argument."""
    for name, address in (("source", source), ("destination", destination)):
        if ipaddress.ip_address(address).version != 4:
            raise ValueError(f"{name} {address!r} is not an IPv4 address (the bridge has no IPv6)")
    if not 0 < port < 65536:
        raise ValueError(f"port {port} is not a TCP port (1-65535)")
    return [
        "-s",
        f"{source}/32",
        "-d",
        f"{destination}/32",
        "-p",
        "tcp",
        "-m",
        "tcp",
        "--dport",
        str(port),
        "-j",
        "ACCEPT",
    ]


def allow(bridge: str, source: str, destination: str, port: int) -> None:
    """Let the container at ``source`` open TCP connections to the host's ``destination:port``, and no other.

    The bridge must be guarded (:func:`guard`, which every container's attachment does first). Idempotent.
    Raises HostGuardError when iptables refuses, ValueError for an address or port that is not one.
    """
    rule = _allowance(source, destination, port)
    binary = _iptables()
    chain = allow_chain_name(bridge)
    if _run(["-C", chain, *rule], binary).returncode != 0:
        _must(["-A", chain, *rule], binary)


def disallow(bridge: str, source: str, destination: str, port: int) -> None:
    """Take back what :func:`allow` gave (every copy of it); nothing to take back (or no chain) is fine."""
    rule = _allowance(source, destination, port)
    try:
        binary = _iptables()
    except HostGuardError:
        return
    for _ in range(100):
        if _run(["-D", allow_chain_name(bridge), *rule], binary).returncode != 0:
            break


def allowances(bridge: str) -> list[str]:
    """The rules :func:`allow` put in the bridge's chain, as ``iptables -S`` prints them (empty without one)."""
    try:
        binary = _iptables()
    except HostGuardError:
        return []
    listing = _run(["-S", allow_chain_name(bridge)], binary)
    if listing.returncode != 0:
        return []
    return [line for line in listing.stdout.splitlines() if line.startswith("-A ")]


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


def sweep_allowances(bridge: str, listening: Callable[[str, int], bool]) -> list[str]:
    """Remove the bridge's allowances whose proxy is gone (``listening(address, port)`` is False); the removed.

    A proxy listens before it admits anyone and takes its rules back before it stops, so a rule whose
    port has no listener was left by a process that died (a worker killed during a build). Should its
    address go to another container, that container would reach whatever listens on the port next.
    """
    removed = []
    for line in allowances(bridge):
        words = line.split()
        try:
            source = words[words.index("-s") + 1].removesuffix("/32")
            destination = words[words.index("-d") + 1].removesuffix("/32")
            port = int(words[words.index("--dport") + 1])
        except (ValueError, IndexError):
            continue  # not a rule allow() writes: someone else's, left alone
        if not listening(destination, port):
            disallow(bridge, source, destination, port)
            removed.append(line)
    return removed
