"""Containers run for real under runc and gVisor (runsc), through the hook spec and the plugin manager.

Every test removes what it made, and a fixture checks afterwards that nothing
is left: no mount, cgroup, network namespace, shim, forwarder or directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import levers9_runc
from levers9.engine.spec import CAPABILITIES
from levers9.hooks.errors import CheckpointUnavailable
from levers9.hooks.facade import Hooks
from levers9.hooks.manager import PluginPolicy, load_plugins
from levers9.hooks.types import ContainerSpec, ContainerState, ContainerStatus, Mount, RuntimeContext

RUNTIMES = ["runc", "gvisor"]


@dataclass
class Box:
    hooks: Hooks
    ctx: RuntimeContext
    made: list[str]

    async def run(self, command: list[str], **kw: Any) -> str:
        cid = f"t-{secrets.token_hex(6)}"
        spec = ContainerSpec(container_id=cid, image="host", command=command, **kw)
        self.made.append(cid)
        prepared = await self.hooks.container_prepare(self.ctx, spec)
        await self.hooks.container_start(self.ctx, prepared)
        return cid

    async def wait(self, cid: str, timeout: float = 60) -> ContainerState:
        """Until the container exits (a deadline for a hang, not a timing assertion)."""
        deadline = time.monotonic() + timeout
        while True:
            state = await self.hooks.container_state(self.ctx, cid)
            if state.status is ContainerStatus.EXITED:
                return state
            if time.monotonic() > deadline:
                pytest.fail(f"container {cid} still {state.status} after {timeout} s")
            await asyncio.sleep(0.05)

    async def output(self, cid: str) -> str:
        data, offset = b"", 0
        while True:
            chunk = await self.hooks.container_logs(self.ctx, cid, offset)
            data += chunk.data
            offset = chunk.next_offset
            if chunk.eof:
                return data.decode()
            await asyncio.sleep(0.02)


def leftovers(state_dir: Path, ids: list[str], bridge: str, ctx: RuntimeContext) -> list[str]:
    found = []
    mounts = Path("/proc/self/mountinfo").read_text()
    if str(state_dir) in mounts:
        found.append("a mount under the state dir")
    for cid in ids:
        if ctx.name == "runc":  # a container in a user namespace has its mounts in a directory of its own
            userns_dir = levers9_runc.engine(ctx).userns_dir(cid)
            owner = userns_dir.with_name(f"{userns_dir.name}.owner")
            if userns_dir.exists() or owner.exists() or str(userns_dir) in mounts:
                found.append(f"user namespace mounts of {cid} at {userns_dir}")
        for cg in Path("/sys/fs/cgroup").glob(f"*/levers9/{cid}"):
            found.append(f"cgroup {cg}")
        if (state_dir / "containers" / cid).exists():
            found.append(f"directory of {cid}")
        ps = subprocess.run(["pgrep", "-f", cid], capture_output=True, text=True, check=False).stdout.split()
        if ps:
            found.append(f"processes {ps} mentioning {cid}")
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=False).stdout
    found += [f"veth {line.split(':')[1].strip()}" for line in links.splitlines() if f"master {bridge}" in line]
    return found + ([f"netns left: {netns}"] if any(f"l9-{c}" in netns for c in ids) else [])


@pytest.fixture(params=RUNTIMES)
async def box(request: pytest.FixtureRequest, tmp_path: Path, require: Callable[[str], str]) -> AsyncIterator[Box]:
    name: str = request.param
    require("runsc" if name == "gvisor" else "runc")
    hooks = Hooks(load_plugins(PluginPolicy()))
    bridge = f"l9t{secrets.token_hex(5)}"
    subnet = f"10.{210 + secrets.randbelow(40)}.{secrets.randbelow(250)}.0/24"
    settings = hooks.runtime_settings_model(name)
    assert settings is not None
    cache = tmp_path.parent / "image-cache"  # shared by the tests of this session's worker: unpacked once
    ctx = RuntimeContext(
        name=name,
        settings=settings(bridge=bridge, subnet=subnet, image_cache=str(cache)),
        state_dir=str(tmp_path / name),
    )
    b = Box(hooks, ctx, [])
    try:
        yield b
    finally:
        for cid in b.made:
            await hooks.container_remove(ctx, cid)
        from levers9.engine.node import bridge_for

        bridge_for(ctx.settings).destroy()
        hooks.close()
    left = leftovers(tmp_path / name, b.made, bridge, ctx)
    assert not left, f"left behind: {left}"


async def test_exit_code_and_output(box: Box) -> None:
    cid = await box.run(["python3", "-c", "import sys; print('hello from', sys.argv[0]); sys.exit(3)"])
    state = await box.wait(cid)
    assert state.exit_code == 3
    assert not state.oom_killed
    assert "hello from -c" in await box.output(cid)


async def test_environment_and_secrets_are_inside(box: Box) -> None:
    env = {"GREETING": "hi there", "LEVERS9_SECRET_TOKEN": "s3cr3t-value"}
    cid = await box.run(["python3", "-c", "import os, json; print(json.dumps(dict(os.environ)))"], env=env)
    assert (await box.wait(cid)).exit_code == 0
    inside = json.loads((await box.output(cid)).strip().splitlines()[-1])
    assert inside["GREETING"] == "hi there"
    assert inside["LEVERS9_SECRET_TOKEN"] == "s3cr3t-value"
    assert inside["HOSTNAME"] == cid


async def test_kill_a_running_container(box: Box) -> None:
    cid = await box.run(["sleep", "600"])
    assert (await box.hooks.container_state(box.ctx, cid)).status is ContainerStatus.RUNNING
    await box.hooks.container_kill(box.ctx, cid, signal.SIGKILL)
    state = await box.wait(cid)
    assert state.exit_code == 128 + signal.SIGKILL
    assert not state.oom_killed
    await box.hooks.container_kill(box.ctx, cid, signal.SIGKILL)  # killing an exited container succeeds


async def test_the_memory_limit_is_enforced_and_reported(box: Box) -> None:
    code = "x = bytearray(400 * 1024 * 1024); print('allocated', len(x))"
    cid = await box.run(["python3", "-c", code], memory_mib=96)
    state = await box.wait(cid)
    assert "allocated" not in await box.output(cid)
    assert state.exit_code != 0
    assert state.oom_killed, f"exit {state.exit_code} was not reported as an OOM kill"


async def test_a_forwarded_port_is_reachable(box: Box) -> None:
    server = "import http.server as h; h.HTTPServer(('0.0.0.0', 8000), h.SimpleHTTPRequestHandler).serve_forever()"
    cid = await box.run(["python3", "-c", server], ports=[8000], workdir="/etc")
    state = await box.hooks.container_state(box.ctx, cid)
    assert state.address is not None

    def get() -> bytes:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://{state.address}/passwd", timeout=5) as response:
                    return bytes(response.read())
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    assert await asyncio.to_thread(get)  # /etc/passwd served from inside the container


async def test_remove_kills_a_running_container_and_is_idempotent(box: Box) -> None:
    cid = await box.run(["sleep", "600"])
    await box.hooks.container_remove(box.ctx, cid)
    await box.hooks.container_remove(box.ctx, cid)
    state = await box.hooks.container_state(box.ctx, cid)
    assert state.status is ContainerStatus.UNKNOWN


async def test_network_none_has_only_loopback(box: Box) -> None:
    code = "import socket; print(sorted(n for _, n in socket.if_nameindex()))"
    cid = await box.run(["python3", "-c", code], network="none")
    assert (await box.wait(cid)).exit_code == 0
    assert (await box.output(cid)).strip().splitlines()[-1] == "['lo']"


# --------------------------------------------------------------------------- what a container may not do

#: capability numbers (linux/capability.h) of those a container keeps and those the tests look for
CAP_NUMBERS = {
    "CAP_CHOWN": 0,
    "CAP_DAC_OVERRIDE": 1,
    "CAP_DAC_READ_SEARCH": 2,
    "CAP_FOWNER": 3,
    "CAP_FSETID": 4,
    "CAP_KILL": 5,
    "CAP_SETGID": 6,
    "CAP_SETUID": 7,
    "CAP_SETPCAP": 8,
    "CAP_NET_BIND_SERVICE": 10,
    "CAP_NET_ADMIN": 12,
    "CAP_NET_RAW": 13,
    "CAP_SYS_CHROOT": 18,
    "CAP_SYS_PTRACE": 19,
    "CAP_SYS_ADMIN": 21,
    "CAP_MKNOD": 27,
    "CAP_AUDIT_WRITE": 29,
    "CAP_SETFCAP": 31,
}

#: system call numbers the probe makes directly, by machine
SYSCALLS = {
    "x86_64": {
        "unshare": 272,
        "keyctl": 250,
        "process_vm_readv": 310,
        "io_uring_setup": 425,
        "bpf": 321,
        "clone3": 435,
        "userfaultfd": 323,
    },
    "aarch64": {
        "unshare": 97,
        "keyctl": 219,
        "process_vm_readv": 270,
        "io_uring_setup": 425,
        "bpf": 280,
        "clone3": 435,
        "userfaultfd": 282,
    },
}

# Inside the container: its capability sets, device nodes, raw sockets, and calls the seccomp profile refuses,
# each made in a child of its own (a successful unshare would change the rest), as errno names or "ok".
CONFINEMENT_PROBE = """
import ctypes, errno, json, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
numbers = json.loads(sys.argv[1])

def in_child(fn):
    pid = os.fork()
    if pid == 0:
        try:
            code = fn()
        except OSError as exc:
            code = exc.errno
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return "ok" if code == 0 else errno.errorcode.get(code, str(code))

def syscall(name, *args):
    def call():
        done = libc.syscall(ctypes.c_long(numbers[name]), *[ctypes.c_long(a) for a in args])
        return 0 if done >= 0 else ctypes.get_errno()
    return in_child(call)

def mknod(path, kind):
    return in_child(lambda: os.mknod(path, kind | 0o600, os.makedev(1, 3)) or 0)

def raw_socket():
    return in_child(lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close() or 0)

def mount_tmpfs():
    def call():
        return 0 if libc.mount(b"none", b"/mnt", b"tmpfs", 0, None) == 0 else ctypes.get_errno()
    return in_child(call)

status = dict(line.split(":", 1) for line in open("/proc/self/status") if line.startswith("Cap"))
print(json.dumps({
    "caps": {key: int(value, 16) for key, value in status.items()},
    "mknod_char": mknod("/tmp/null", 0o020000),
    "mknod_block": mknod("/tmp/block", 0o060000),
    "mkfifo": mknod("/tmp/fifo", 0o010000),
    "raw_socket": raw_socket(),
    "mount_tmpfs": mount_tmpfs(),
    "unshare_user": syscall("unshare", 0x10000000),
    "unshare_net": syscall("unshare", 0x40000000),
    "keyctl": syscall("keyctl", 0, -3, 0),
    "process_vm_readv": syscall("process_vm_readv", os.getpid(), 0, 0, 0, 0, 0),
    "io_uring_setup": syscall("io_uring_setup", 1, 0),
    "bpf": syscall("bpf", 0, 0, 0),
    "userfaultfd": syscall("userfaultfd", 1),
    "clone3": syscall("clone3", 0, 0),
}))
"""


async def test_no_device_nodes_raw_sockets_or_host_capabilities(box: Box) -> None:
    numbers = SYSCALLS.get(os.uname().machine)
    assert numbers is not None, f"the probe knows no system call numbers for {os.uname().machine}"
    cid = await box.run(["python3", "-c", CONFINEMENT_PROBE, json.dumps(numbers)])
    assert (await box.wait(cid)).exit_code == 0, await box.output(cid)
    found = json.loads((await box.output(cid)).strip().splitlines()[-1])
    kept = sum(1 << CAP_NUMBERS[name] for name in CAPABILITIES)
    assert found["caps"]["CapBnd"] == kept, f"{found['caps']['CapBnd']:#x} != {kept:#x}"
    for name in ("CapEff", "CapPrm"):
        assert found["caps"][name] == kept, (name, hex(found["caps"][name]))
    for gone in ("CAP_MKNOD", "CAP_NET_RAW", "CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_SYS_PTRACE", "CAP_SETFCAP"):
        assert not kept & (1 << CAP_NUMBERS[gone]), gone
    assert found["mknod_char"] == "EPERM"
    assert found["mknod_block"] == "EPERM"
    assert found["mkfifo"] == "ok"  # FIFOs are not devices
    assert found["raw_socket"] in ("EPERM", "EAFNOSUPPORT")  # gVisor has no raw sockets at all without --net-raw


async def test_the_seccomp_profile_refuses_what_it_lists(box: Box) -> None:
    numbers = SYSCALLS.get(os.uname().machine)
    assert numbers is not None, f"the probe knows no system call numbers for {os.uname().machine}"
    cid = await box.run(["python3", "-c", CONFINEMENT_PROBE, json.dumps(numbers)])
    assert (await box.wait(cid)).exit_code == 0, await box.output(cid)
    found = json.loads((await box.output(cid)).strip().splitlines()[-1])
    refused = (
        "unshare_user",
        "unshare_net",
        "keyctl",
        "process_vm_readv",
        "io_uring_setup",
        "bpf",
        "userfaultfd",
        "mount_tmpfs",
    )
    assert {name: found[name] for name in refused} == dict.fromkeys(refused, "EPERM")
    # so that the C library falls back to clone, whose flags are checked (gVisor's kernel has no clone3 at all)
    assert found["clone3"] == "ENOSYS"


@pytest.mark.parametrize("box", ["runc"], indirect=True)
async def test_runc_root_is_an_unprivileged_host_user(box: Box, tmp_path: Path) -> None:
    """Container uid 0 is host uid 1000000000; root-only host files it is given still read as its own."""
    report = levers9_runc.plugin.levers9_runtime_capabilities(box.ctx)
    assert any(note.startswith("user namespace: on") for note in report.notes), report.notes
    handler = tmp_path / "handler"  # like the worker's handler directory: root's alone
    handler.mkdir(mode=0o700)
    (handler / "secret").write_text("for the container's eyes\n")
    (handler / "secret").chmod(0o600)
    out = tmp_path / "out"
    out.mkdir(mode=0o700)
    script = (
        "cat /proc/self/uid_map; id -u; cat /opt/handler/secret; touch /root/x && echo wrote-root; "
        "echo hi > /opt/out/file && echo wrote-out; "
        'python3 -c \'import socket; socket.create_server(("0.0.0.0", 80)); print("bound-80")\'; '
        "echo READY; exec sleep 600"
    )
    mounts = [
        Mount(source=str(handler), target="/opt/handler"),
        Mount(source=str(out), target="/opt/out", read_only=False),
    ]
    cid = await box.run(["sh", "-c", script], mounts=mounts)
    deadline = time.monotonic() + 60
    while "READY" not in (text := (await box.hooks.container_logs(box.ctx, cid, 0)).data.decode()):
        assert time.monotonic() < deadline, text
        await asyncio.sleep(0.05)
    lines = text.split()
    assert lines[:3] == ["0", "1000000000", "65536"], text  # uid_map: container 0 is host 1000000000
    assert lines[3] == "0", text
    for expected in ("eyes", "wrote-root", "wrote-out", "bound-80"):
        assert expected in lines, text
    state = await box.hooks.container_state(box.ctx, cid)
    assert state.pid is not None
    uids = next(line for line in Path(f"/proc/{state.pid}/status").read_text().splitlines() if line.startswith("Uid:"))
    assert uids.split()[1:] == ["1000000000"] * 4, uids  # real, effective, saved, filesystem: seen from the host
    assert (out / "file").stat().st_uid == 0  # written through the idmapped mount: the host's files stay root's

    # CRIU could not restore it, so the engine refuses to checkpoint it rather than fail half way
    with pytest.raises(CheckpointUnavailable, match="user namespace"):
        levers9_runc.engine(box.ctx).checkpoint(cid, str(tmp_path / "image"))
    assert (await box.hooks.container_state(box.ctx, cid)).status is ContainerStatus.RUNNING

    # and a container the worker may checkpoint gets no user namespace
    cid2 = await box.run(["cat", "/proc/self/uid_map"], checkpointable=True)
    assert (await box.wait(cid2)).exit_code == 0
    assert (await box.output(cid2)).split() == ["0", "0", "4294967295"]


@pytest.mark.parametrize("box", ["runc"], indirect=True)
async def test_mounts_a_killed_worker_left_of_a_user_namespace_container_are_swept(box: Box) -> None:
    """A worker killed half way, then its state deleted: the container's idmapped mounts outside that state
    are found by their owner file and released when the next container is prepared."""
    cid = f"t-{secrets.token_hex(6)}"
    box.made.append(cid)
    await box.hooks.container_prepare(box.ctx, ContainerSpec(container_id=cid, image="host", command=["true"]))
    userns_dir = levers9_runc.engine(box.ctx).userns_dir(cid)
    assert str(userns_dir) in Path("/proc/self/mountinfo").read_text()
    bridge = levers9_runc.engine(box.ctx).bridge
    assert bridge is not None
    bridge.detach(cid)
    shutil.rmtree(Path(box.ctx.state_dir) / "containers" / cid)  # what the worker's exit does to its state

    next_cid = await box.run(["true"])
    assert (await box.wait(next_cid)).exit_code == 0
    assert str(userns_dir) not in Path("/proc/self/mountinfo").read_text()
    assert not userns_dir.exists()
    assert not userns_dir.with_name(f"{userns_dir.name}.owner").exists()


async def test_runc_runs_without_a_user_namespace_where_the_host_does_not_allow_one(
    tmp_path: Path, require: Callable[[str], str]
) -> None:
    """An image cache on a file system without idmapped mounts (overlayfs): the report says so, and why, and
    containers run as before; setting user_namespace false says that instead."""
    require("runc")
    for name in ("lower", "upper", "work", "cache"):
        (tmp_path / name).mkdir()
    options = f"lowerdir={tmp_path / 'lower'},upperdir={tmp_path / 'upper'},workdir={tmp_path / 'work'}"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(tmp_path / "cache")], check=True)
    hooks = Hooks(load_plugins(PluginPolicy()))
    settings = hooks.runtime_settings_model("runc")
    assert settings is not None
    ctx = RuntimeContext(
        name="runc",
        state_dir=str(tmp_path / "runc"),
        settings=settings(
            bridge=f"l9t{secrets.token_hex(5)}", subnet="10.247.0.0/24", image_cache=str(tmp_path / "cache")
        ),
    )
    box = Box(hooks, ctx, [])
    try:
        report = await hooks.runtime_capabilities(ctx)
        note = next(n for n in report.notes if n.startswith("user namespace"))
        assert note.startswith("user namespace: off, this host does not allow it"), note
        assert "idmapped mounts" in note, note
        cid = await box.run(["cat", "/proc/self/uid_map"])
        assert (await box.wait(cid)).exit_code == 0
        assert (await box.output(cid)).split() == ["0", "0", "4294967295"]

        off = RuntimeContext(name="runc", state_dir=ctx.state_dir, settings=settings(user_namespace=False))
        report = await hooks.runtime_capabilities(off)
        assert "user namespace: off (runtime_settings.user_namespace is false)" in report.notes[0], report.notes
    finally:
        for cid in box.made:
            await hooks.container_remove(ctx, cid)
        from levers9.engine.node import bridge_for

        bridge_for(ctx.settings).destroy()
        hooks.close()
        subprocess.run(["umount", str(tmp_path / "cache")], check=True)
    assert not leftovers(tmp_path / "runc", box.made, "-", ctx)


# Inside the container: serves HTTP on 8000, then tries to connect to each host address it is given
SNOOP = """
import http.server, json, socket, sys, threading
server = http.server.HTTPServer(("0.0.0.0", 8000), http.server.SimpleHTTPRequestHandler)
threading.Thread(target=server.serve_forever, daemon=True).start()
port, results = int(sys.argv[1]), {}
for host in sys.argv[2:]:
    try:
        socket.create_connection((host, port), timeout=5).close()
        results[host] = "connected"
    except ConnectionRefusedError:
        results[host] = "refused"
    except OSError as exc:
        results[host] = f"failed: {exc}"
print("RESULTS", json.dumps(results), flush=True)
threading.Event().wait()
"""


def host_ipv4_addresses() -> list[str]:
    links = json.loads(
        subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True, check=True).stdout
    )
    return [a["local"] for link in links if link.get("ifname") != "lo" for a in link.get("addr_info", [])]


async def test_host_listeners_are_closed_to_containers_but_ports_and_the_worker_still_reach_them(box: Box) -> None:
    import ipaddress

    assert box.ctx.settings is not None
    gateway = str(ipaddress.IPv4Network(box.ctx.settings.subnet).network_address + 1)
    with socket.create_server(("0.0.0.0", 0)) as listener:
        port = listener.getsockname()[1]
        others = [a for a in host_ipv4_addresses() if a != gateway]
        cid = await box.run(["python3", "-c", SNOOP, str(port), gateway, *others], ports=[8000], workdir="/etc")
        deadline = time.monotonic() + 60
        while "RESULTS" not in (text := (await box.hooks.container_logs(box.ctx, cid, 0)).data.decode()):
            assert time.monotonic() < deadline, text
            await asyncio.sleep(0.05)
        results = json.loads(text.split("RESULTS", 1)[1].splitlines()[0])
        assert results[gateway] == "refused", results
        assert all(outcome != "connected" for outcome in results.values()), results
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing from the container ever reached it

    state = await box.hooks.container_state(box.ctx, cid)
    assert state.address is not None
    assert state.ip is not None

    def get(address: str) -> bytes:
        with urllib.request.urlopen(f"http://{address}/passwd", timeout=30) as response:
            return bytes(response.read())

    # the published port (how the worker reaches a runner) and the container's own address (how the
    # gateway's tunnel reaches a serving container): both opened by the host, both still work
    assert await asyncio.to_thread(get, state.address)
    assert await asyncio.to_thread(get, f"{state.ip}:8000")
