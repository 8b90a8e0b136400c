"""A network namespace joined to this host by a veth pair, from which connections out work and connections in do not.

The host side of the pair gets ``HOST_IP``; the namespace gets ``NS_IP``, its
loopback, and a default route through the host. With ``drop_inbound`` an
iptables rule in the namespace drops every new inbound TCP connection (SYN),
so the namespace stands for a machine behind NAT: it can dial the host, the
host cannot dial it. Everything is removed at the end, also when the test fails.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

__all__ = ["Namespace", "namespace"]


@dataclass(frozen=True)
class Namespace:
    name: str
    host_ip: str
    ns_ip: str

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return _run(*self.exec_prefix(), *args)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def _need_tools() -> None:
    missing = [
        f"{tool} (apt package {package})"
        for tool, package in (("ip", "iproute2"), ("iptables", "iptables"))
        if shutil.which(tool) is None
    ]
    if missing:
        pytest.fail(f"this test needs {', '.join(missing)}")
    if os.geteuid() != 0:
        pytest.fail("this test makes a network namespace: run it as root")


@contextlib.contextmanager
def namespace(*, drop_inbound: bool) -> Iterator[Namespace]:
    _need_tools()
    tag = secrets.token_hex(3)
    subnet = 16 + secrets.randbelow(200)
    ns = Namespace(f"l9nat-{tag}", f"10.233.{subnet}.1", f"10.233.{subnet}.2")
    host_end, ns_end = f"l9h{tag}", f"l9n{tag}"
    created_ns = created_link = False
    try:
        _run("ip", "netns", "add", ns.name)
        created_ns = True
        _run("ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end)
        created_link = True
        _run("ip", "link", "set", ns_end, "netns", ns.name)
        _run("ip", "addr", "add", f"{ns.host_ip}/24", "dev", host_end)
        _run("ip", "link", "set", host_end, "up")
        ns.run("ip", "addr", "add", f"{ns.ns_ip}/24", "dev", ns_end)
        ns.run("ip", "link", "set", ns_end, "up")
        ns.run("ip", "link", "set", "lo", "up")
        ns.run("ip", "route", "add", "default", "via", ns.host_ip)
        if drop_inbound:
            # new connections from outside are dropped; those the namespace opens (and loopback) work
            ns.run("iptables", "-A", "INPUT", "-i", ns_end, "-p", "tcp", "--syn", "-j", "DROP")
        yield ns
    finally:
        if created_link:
            subprocess.run(["ip", "link", "del", host_end], capture_output=True, timeout=30)
        if created_ns:
            subprocess.run(["ip", "netns", "del", ns.name], capture_output=True, timeout=30)
