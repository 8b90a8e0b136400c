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

Confined containers: what one container may reach beyond its host (a sandbox's ``block_network`` and
``allow_list``). The host is closed to every container by the rules above; everything else a container
reaches (another container on the bridge, other networks routed through the host, the cloud's metadata
address) passes the host's ``FORWARD`` chain, and a confined container's packets meet a chain of its own
there:

* ``L9SB-<veth>``, named by the container's host-side veth (:func:`confined_chain_name`), jumped to first
  thing in ``FORWARD`` for packets that came in through that veth (``-m physdev --physdev-in``: the
  port, not the source address, so it holds for runc and for gVisor, whose netstack sends through the
  same veth); it lets through ``ESTABLISHED`` and ``RELATED`` packets (replies to connections others
  opened to the container: the worker's, which arrive through the host and meet ``INPUT`` anyway, and
  those of whoever reaches a port it exposes), then new packets to each allowed network, and refuses the
  rest: TCP with a reset and UDP with a port-unreachable (so a connection or a DNS lookup fails at
  once), anything else dropped. ``RETURN``, not ``ACCEPT``: the host's own ``FORWARD`` rules still
  decide what they allow;
* the same chain in ``ip6tables`` (with the IPv6 networks allowed): the bridge carries IPv6 between
  containers (link-local addresses) although the host has none on it;
* made whole or not at all (one ``iptables-restore --noflush`` per family) by :func:`confine`, **before**
  the container starts (its veth's name is known from its id), so nothing the container runs ever had
  the network; taken back by :func:`unconfine` once the container is removed. Every rule carries a
  comment naming the container's label and its owner (the directory of the worker that made it):
  :func:`sweep_confined` removes every rule of an owner, at that worker's next start, when a killed
  worker could not take them back;
* bridged packets meet ``iptables`` only through the kernel's ``br_netfilter`` (``bridge-nf-call-iptables``
  on the host or on the bridge): without it a confined container would still reach the others on its
  bridge. :func:`confine` refuses when the module is not loaded, and :func:`check_confined` (called
  once the container is up, before anything is run in it) refuses unless its veth is on a bridge whose
  packets pass both ``iptables`` and ``ip6tables`` and both jumps are in place. levers9 does not turn
  ``br_netfilter`` on itself: it changes every bridge of the host (Docker's included).

A container cannot forge its way past these rules: it has no ``CAP_NET_RAW`` (:mod:`levers9.engine.spec`),
and the rules match the veth the packet came through, not its source address. A firewall manager that
rebuilds ``FORWARD`` drops the jumps, as it would ``INPUT``'s: a container confined before that has the
network from then on (nothing here watches ``FORWARD``), and :func:`check_confined` refuses the next.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from levers9.hooks.errors import Levers9Error

__all__ = [
    "ALLOW_PREFIX",
    "CHAIN_PREFIX",
    "CONFINED_COMMENT",
    "CONFINED_PREFIX",
    "Confinement",
    "HostGuardError",
    "IPNetwork",
    "allow",
    "allow_chain_name",
    "allowances",
    "chain_name",
    "check_confined",
    "confine",
    "confined",
    "confined_chain_name",
    "disallow",
    "guard",
    "is_guarded",
    "sweep_allowances",
    "sweep_confined",
    "unconfine",
    "unguard",
]

#: the per-bridge chain's name is this plus the bridge's name (at most 20 of iptables' 28 characters)
CHAIN_PREFIX = "L9IN-"
#: the per-bridge chain of single ports opened to single containers (see the module's docstring)
ALLOW_PREFIX = "L9AL-"
#: long enough for a loaded machine, short enough that a wedged iptables does not hang a worker
IPTABLES_TIMEOUT_S = 30.0
INSTALL = "apt-get install -y iptables"
#: where iptables is looked for when PATH (which service managers often cut short) lacks it; ip6tables and
#: the restore commands are looked for in the same directories
FALLBACK_PATHS = (Path("/usr/sbin/iptables"), Path("/sbin/iptables"))
#: the chain of one confined container is this plus its host-side veth's name (at most 20 characters)
CONFINED_PREFIX = "L9SB-"
#: every rule of a confined container carries a comment that starts so, then its label and its owner
CONFINED_COMMENT = "levers9 confined"
#: the kernel's switches that make bridged packets meet iptables (br_netfilter), host-wide and per bridge
BRIDGE_NF = Path("/proc/sys/net/bridge")
SYS_NET = Path("/sys/class/net")
IPV6 = Path("/proc/sys/net/ipv6")
_LABEL = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_VETH = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")
#: what an owner's path may hold to be written in a comment (iptables keeps 255 characters of one)
_OWNER = re.compile(r'^/[^"\\\x00-\x1f\x7f]{0,199}$')

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


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


def _run(args: Sequence[str], binary: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    shown = shlex.join([Path(binary).name, *args])
    try:
        return subprocess.run(
            [binary, "-w", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=IPTABLES_TIMEOUT_S,
            check=False,
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


# --------------------------------------------------------------------------- confined containers


@dataclass(frozen=True)
class Confinement:
    """One confined container's rules, as read back from ``iptables -S`` (see the module's docstring)."""

    #: the container's host-side veth, which names its chain
    veth: str
    #: what the worker called it (a sandbox's id)
    label: str
    #: the directory of the worker that confined it
    owner: str


def confined_chain_name(veth: str) -> str:
    """The chain of the container whose host-side veth is ``veth``."""
    return f"{CONFINED_PREFIX}{veth}"


def _tool(name: str) -> str | None:
    """``name`` (ip6tables, iptables-restore) on PATH or beside where iptables is looked for."""
    return shutil.which(name) or next(
        (str(p.parent / name) for p in FALLBACK_PATHS if (p.parent / name).exists()), None
    )


def _families() -> list[tuple[str, int]]:
    """The iptables commands confinement needs, with their IP version: ip6tables too where the kernel has IPv6."""
    return [("iptables", 4), ("ip6tables", 6)] if IPV6.exists() else [("iptables", 4)]


def _binaries(command: str) -> tuple[str, str]:
    """The command and its ``-restore``; HostGuardError naming what is missing."""
    found = _tool(command), _tool(f"{command}-restore")
    if found[0] is None or found[1] is None:
        missing = command if found[0] is None else f"{command}-restore"
        raise HostGuardError(
            f"{missing} is not installed on this worker, and a container whose network is cut or limited "
            f"(block_network, allow_list) is refused without it rather than run with the network ({INSTALL})"
        )
    return found[0], found[1]


def _comment(label: str, owner: str) -> str:
    return f"{CONFINED_COMMENT} {label} owner {owner}"


def _confined_rules(networks: Sequence[IPNetwork], version: int, comment: str) -> list[list[str]]:
    """The chain's rules for IP ``version``, in order (each with the comment)."""
    tag = ["-m", "comment", "--comment", comment]
    unreachable = "icmp-port-unreachable" if version == 4 else "icmp6-port-unreachable"
    return [
        [*tag, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"],
        *(["-d", str(net), *tag, "-j", "RETURN"] for net in networks if net.version == version),
        ["-p", "tcp", *tag, "-j", "REJECT", "--reject-with", "tcp-reset"],
        ["-p", "udp", *tag, "-j", "REJECT", "--reject-with", unreachable],
        [*tag, "-j", "DROP"],
    ]


def _confined_jump(veth: str, comment: str) -> list[str]:
    return ["-m", "physdev", "--physdev-in", veth, "-m", "comment", "--comment", comment]


def _restore_line(words: Sequence[str]) -> str:
    """One line of iptables-restore's input: what has a space is double-quoted (no word holds a quote)."""
    return " ".join(f'"{w}"' if " " in w else w for w in words)


def confine(veth: str, networks: Sequence[IPNetwork], *, label: str, owner: str | Path) -> None:
    """Cut the egress of the container whose host-side veth is ``veth``, but to ``networks``; see the docstring.

    Made before the container starts (the veth need not exist yet), whole or not at all in each family; a
    container confined before gets its rules made again. ``label`` names the container in the rules' comments,
    ``owner`` is the worker's directory :func:`sweep_confined` finds them by. Raises HostGuardError when
    iptables, ip6tables or br_netfilter is missing or a rule is refused (nothing is then left), ValueError for a
    veth, label or owner that cannot be written in a rule.
    """
    owner = str(Path(owner).resolve())
    if not _VETH.match(veth):
        raise ValueError(f"veth {veth!r} is not an interface name")
    if not _LABEL.match(label):
        raise ValueError(f"label {label!r} is not 1-64 letters, digits, '_', '.', ':' or '-'")
    if not _OWNER.match(owner):
        raise ValueError(f"owner {owner!r} cannot be written in a rule's comment (at most 200 characters, no quote)")
    if not BRIDGE_NF.is_dir():
        raise HostGuardError(
            "br_netfilter is not loaded on this worker: packets between containers on a bridge never meet "
            "iptables, so a container whose network is cut (block_network, allow_list) would still reach the "
            "others; load it (modprobe br_netfilter) to run such sandboxes"
        )
    binaries = [(_binaries(command), version) for command, version in _families()]
    unconfine(veth)  # confined before (a crash between): made again from nothing
    chain, comment = confined_chain_name(veth), _comment(label, owner)
    try:
        for (_, restore), version in binaries:
            lines = ["*filter", f":{chain} - [0:0]"]
            lines += [_restore_line(["-A", chain, *rule]) for rule in _confined_rules(networks, version, comment)]
            lines += [_restore_line(["-I", "FORWARD", "1", *_confined_jump(veth, comment), "-j", chain]), "COMMIT", ""]
            made = _run(["--noflush"], restore, stdin="\n".join(lines))
            if made.returncode != 0:
                said = (made.stderr.strip() or made.stdout.strip()) or "no output"
                raise HostGuardError(
                    f"`{Path(restore).name} --noflush` refused the rules that cut {label}'s network (exit status "
                    f"{made.returncode}): {said}"
                )
    except BaseException:
        with contextlib.suppress(HostGuardError):  # the refusal is what the caller needs to hear
            unconfine(veth)
        raise


def _listing(binary: str) -> list[list[str]]:
    """``-S`` of the filter table, each rule split into its words (empty when it cannot be listed)."""
    listing = _run(["-S"], binary)
    if listing.returncode != 0:
        return []
    rules = []
    for line in listing.stdout.splitlines():
        try:
            rules.append(shlex.split(line))
        except ValueError:
            continue  # a comment with an unpaired quote: not one of ours
    return rules


def _after(words: list[str], flag: str) -> str | None:
    try:
        return words[words.index(flag) + 1]
    except (ValueError, IndexError):
        return None


def unconfine(veth: str) -> None:
    """Take back what :func:`confine` made for ``veth``, in every family; nothing to take back is fine.

    Raises HostGuardError when a rule that is there cannot be removed.
    """
    chain = confined_chain_name(veth)
    for command, _ in _families():
        binary, restore = _tool(command), _tool(f"{command}-restore")
        if binary is None or restore is None:
            continue  # nothing could have been made with it
        rules = _listing(binary)
        jumps = [w[2:] for w in rules if w[:2] == ["-A", "FORWARD"] and _after(w, "-j") == chain]
        if not jumps and ["-N", chain] not in rules:
            continue
        lines = ["*filter", *(_restore_line(["-D", "FORWARD", *jump]) for jump in jumps)]
        if ["-N", chain] in rules:
            lines += [f"-F {chain}", f"-X {chain}"]
        removed = _run(["--noflush"], restore, stdin="\n".join([*lines, "COMMIT", ""]))
        if removed.returncode != 0:
            said = (removed.stderr.strip() or removed.stdout.strip()) or "no output"
            raise HostGuardError(
                f"`{Path(restore).name} --noflush` could not remove the rules of {chain} (exit status "
                f"{removed.returncode}): {said}"
            )


def confined() -> list[Confinement]:
    """Every confined container's rules on this host (each veth once, whichever family holds them)."""
    found: dict[str, Confinement] = {}
    for command, _ in _families():
        binary = _tool(command)
        if binary is None:
            continue
        for words in _listing(binary):
            comment = _after(words, "--comment") or ""
            if words[:1] != ["-A"] or not comment.startswith(f"{CONFINED_COMMENT} "):
                continue
            label, sep, owner = comment.removeprefix(f"{CONFINED_COMMENT} ").partition(" owner ")
            target = words[1] if words[1].startswith(CONFINED_PREFIX) else _after(words, "-j") or ""
            if sep and target.startswith(CONFINED_PREFIX):
                veth = target.removeprefix(CONFINED_PREFIX)
                found.setdefault(veth, Confinement(veth=veth, label=label, owner=owner))
    return sorted(found.values(), key=lambda c: c.veth)


def sweep_confined(under: str | Path) -> list[Confinement]:
    """Remove the rules of every container confined by an owner at or below ``under``; those removed.

    A worker calls it as it starts, before it confines anything: what it finds is a killed predecessor's.
    """
    root = Path(under).resolve()
    removed = []
    for confinement in confined():
        owner = Path(confinement.owner)
        if owner == root or root in owner.parents:
            unconfine(confinement.veth)
            removed.append(confinement)
    return removed


def _switch(path: Path) -> bool:
    try:
        return path.read_text().strip() == "1"
    except OSError:
        return False


def check_confined(veth: str) -> None:
    """HostGuardError unless the container behind ``veth`` is held by its rules: its veth is a port of a bridge
    whose packets meet iptables (and ip6tables) and both jumps to its chain are in ``FORWARD``."""
    port = SYS_NET / veth
    if not port.exists():
        raise HostGuardError(
            f"the container's interface {veth} is not on this host: its runtime does not put it on levers9's bridge, "
            "so its network cannot be cut (block_network, allow_list need runc or gvisor on a bridge)"
        )
    master = port / "master"
    bridge = master.resolve().name if master.exists() else ""
    if not bridge or not (SYS_NET / bridge / "bridge").is_dir():
        raise HostGuardError(f"the container's interface {veth} is not a port of a bridge; its network cannot be cut")
    chain = confined_chain_name(veth)
    for command, _ in _families():
        switch = "iptables" if command == "iptables" else "ip6tables"
        if not _switch(BRIDGE_NF / f"bridge-nf-call-{switch}") and not _switch(
            SYS_NET / bridge / "bridge" / f"nf_call_{switch}"
        ):
            raise HostGuardError(
                f"packets between containers on bridge {bridge} do not meet {command} (net.bridge.bridge-nf-call-"
                f"{switch} is 0, and so is the bridge's nf_call_{switch}), so a container whose network is cut would "
                f"still reach the others there; set one of them to 1 to run such sandboxes"
            )
        binary = _tool(command)
        rules = _listing(binary) if binary is not None else []
        if not any(
            w[:2] == ["-A", "FORWARD"] and _after(w, "--physdev-in") == veth and _after(w, "-j") == chain for w in rules
        ):
            raise HostGuardError(f"{command}'s FORWARD chain has no jump to {chain} for {veth}: its rules are gone")
