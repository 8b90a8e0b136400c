"""A fake EC2: a real moto server (a subprocess) behind a fault-injecting HTTP proxy (a thread of this process).

The plugin under test gets the proxy's :attr:`FakeEc2.url` as its
``endpoint_url`` and speaks to it with the real boto3, over HTTP only, so the
same fake serves a test in this process and a ``levers9 server`` subprocess
alike. Moto is EC2's real catalog (instance types, offerings per zone, default
VPC and subnets, the Amazon AMIs) and keeps instances, tags and user data; it
runs with ``MOTO_ENABLE_AMI_VALIDATION=true`` so an unknown AMI is refused as
EC2 would (``InvalidAMIID.NotFound``). STS goes through the same port.

The proxy forwards every request as it is, except:

* **injected faults** (:meth:`FakeEc2.fail` and :meth:`FakeEc2.fail_run_instances`):
  a request of the rule's action (``RunInstances`` for the latter), of its
  instance type and/or zone when given (the zone is ``Placement.AvailabilityZone``
  or that of the subnet asked for, ``SubnetId`` or ``NetworkInterface.1.SubnetId``),
  is answered by the proxy with EC2's XML error document
  (``<Response><Errors><Error><Code>…</Code><Message>…</Message></Error></Errors><RequestID>…</RequestID></Response>``)
  and the HTTP status EC2 uses for that code (:data:`STATUS`: 500 for
  ``InsufficientInstanceCapacity``, 503 for ``RequestLimitExceeded``, 401 for
  ``AuthFailure``, 403 for ``UnauthorizedOperation``, 400 otherwise), every
  time or only ``times`` times; moto never sees it;
* **timeout after create** (:meth:`FakeEc2.timeout_after_create`): a
  ``RunInstances`` is forwarded (moto starts the instance), and then the
  connection is closed without an answer (or held ``hold_s`` seconds first, to
  outlast a client's read timeout), as when a response is lost on the way back;
* **ClientToken idempotency**, which moto 5 does not implement (it stores the
  token and starts a new instance for every request): the proxy emulates it at
  the wire, as EC2 documents it. The first answered ``RunInstances`` of a
  (region, token) is remembered with its parameters; a repeat with the same
  parameters gets that very answer without reaching moto, and one with other
  parameters gets ``IdempotentParameterMismatch``; once that instance is
  terminated (moto says ``shutting-down`` or ``terminated``: a spot
  interruption, a test's :meth:`FakeEc2.terminate_all`), a repeat gets
  ``IdempotentInstanceTerminated`` (400), as EC2 answers a token whose
  instance is gone. Faults are not remembered: a refused launch started nothing.

:meth:`FakeEc2.calls` counts the requests the proxy received per action
(``RunInstances``, ``DescribeInstances``...), faulted or not;
:meth:`FakeEc2.call_log` stamps each of them (``time.time()``) as it is received
and as its answer is sent, for the benchmark (``bench/clouds.py``). What tests read
back (:meth:`FakeEc2.instances`, user data decoded) and what they do behind the
plugin's back (:meth:`FakeEc2.stop_instance`, :meth:`FakeEc2.terminate_all`)
goes to moto directly, uncounted, in every region the proxy has seen a request
for (and ``us-east-1``).

Lifecycle: :meth:`FakeEc2.start` starts moto on a free port of 127.0.0.1 and
waits until it answers, then the proxy; :meth:`FakeEc2.stop` (or leaving the
``with`` block) stops the proxy, then moto (SIGTERM, SIGKILL after 10 s), and
removes its log: nothing is left. A moto that does not come up within 60 s is
a ``RuntimeError`` with its output.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from tests.fakes import CloudInstance
from tests.fakes.local_server import LocalServer
from tests.fixtures.ports import free_port

__all__ = ["STATUS", "FakeEc2"]

#: the HTTP status EC2 answers each injected error code with (400, a client error, when not listed): EC2's API
#: reference ("Error codes for the Amazon EC2 API") lists its server errors, all 5xx, and botocore's retry data
#: (``_retry.json``, ec2) gives ``RequestLimitExceeded`` and ``EC2ThrottledException`` as 503
STATUS: dict[str, int] = {
    # server errors: capacity
    "InsufficientInstanceCapacity": 500,
    "InsufficientHostCapacity": 500,
    "InsufficientCapacity": 500,
    "InsufficientAddressCapacity": 500,
    "InsufficientVolumeCapacity": 500,
    "InsufficientReservedInstanceCapacity": 500,
    # server errors: transient
    "InternalError": 500,
    "InternalFailure": 500,
    "ServiceUnavailable": 503,
    "Unavailable": 503,
    "RequestLimitExceeded": 503,
    "EC2ThrottledException": 503,
    "TooManyRequestsException": 429,
    # credentials and permissions
    "AuthFailure": 401,
    "OptInRequired": 401,
    "PendingVerification": 401,
    "InvalidClientTokenId": 403,
    "MissingAuthenticationToken": 403,
    "SignatureDoesNotMatch": 403,
    "UnauthorizedOperation": 403,
    "AccessDenied": 403,
    "Blocked": 403,
}
_REGION = re.compile(r"Credential=[^/]+/\d{8}/([a-z0-9-]+)/")
_ERROR_CODE = re.compile(rb"<Code>([^<]*)</Code>")
_INSTANCE_ID = re.compile(rb"<instanceId>(i-[0-9a-f]+)</instanceId>")
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection"}
_KEYS = {"aws_access_key_id": "AKIAIOSFODNN7EXAMPLE", "aws_secret_access_key": "fake-ec2-secret"}


@dataclass
class _Rule:
    action: str
    code: str
    message: str
    instance_type: str | None
    zone: str | None
    times: int | None

    def matches(self, action: str, instance_type: str | None, zone: str | None) -> bool:
        if self.times is not None and self.times <= 0:
            return False
        if action != self.action:
            return False
        if self.instance_type is not None and instance_type != self.instance_type:
            return False
        return self.zone is None or zone == self.zone


@dataclass
class _Timeout:
    times: int
    hold_s: float


class FakeEc2:
    """moto + the fault-injecting proxy (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._timeouts: list[_Timeout] = []
        self._calls: Counter[str] = Counter()
        self._log: list[tuple[float, str, str]] = []
        self._tokens: dict[tuple[str, str], tuple[str, tuple[int, list[tuple[str, str]], bytes]]] = {}
        self._regions: set[str] = {"us-east-1"}
        self._moto: subprocess.Popen[bytes] | None = None
        self._moto_port = 0
        self._log_dir: Path | None = None
        self._proxy: LocalServer | None = None
        self._subnet_zones: dict[tuple[str, str], str] = {}

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> FakeEc2:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """Where the plugin points ``endpoint_url``: the proxy."""
        assert self._proxy is not None, "FakeEc2 is not started"
        return f"http://127.0.0.1:{self._proxy.port}"

    @property
    def moto_url(self) -> str:
        return f"http://127.0.0.1:{self._moto_port}"

    def start(self) -> None:
        self._log_dir = Path(tempfile.mkdtemp(prefix="fake-ec2-"))
        self._moto_port = free_port()
        env = {**os.environ, "MOTO_ENABLE_AMI_VALIDATION": "true"}
        log = open(self._log_dir / "moto.log", "wb")  # noqa: SIM115 - closed below once the child has it
        try:
            self._moto = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self._moto_port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        finally:
            log.close()
        self._wait_for_moto()
        fake = self

        class Handler(_ProxyHandler):
            owner = fake

        self._proxy = LocalServer(Handler, name="fake-ec2-proxy")

    def _wait_for_moto(self) -> None:
        assert self._moto is not None
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline:
            if self._moto.poll() is not None:
                break
            try:
                connection = http.client.HTTPConnection("127.0.0.1", self._moto_port, timeout=2)
                connection.request("GET", "/moto-api/")
                connection.getresponse().read()
                connection.close()
                return
            except OSError:
                time.sleep(0.1)
        output = (self._log_dir / "moto.log").read_text(errors="replace") if self._log_dir else ""
        self.stop()
        raise RuntimeError(f"moto did not start on port {self._moto_port}:\n{output}")

    def stop(self) -> None:
        if self._proxy is not None:
            self._proxy.close()
            self._proxy = None
        if self._moto is not None:
            if self._moto.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._moto.pid, signal.SIGTERM)
                try:
                    self._moto.wait(10)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(self._moto.pid, signal.SIGKILL)
                    self._moto.wait(10)
            self._moto = None
        if self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)
            self._log_dir = None

    # ------------------------------------------------------------------ faults

    def fail(
        self,
        action: str,
        code: str,
        *,
        message: str | None = None,
        instance_type: str | None = None,
        zone: str | None = None,
        times: int | None = None,
    ) -> None:
        """Answer requests of ``action`` (of ``instance_type`` / in ``zone`` when given) with EC2 error ``code``,
        every time, or only the next ``times`` times."""
        with self._lock:
            self._rules.append(
                _Rule(action, code, message or f"injected {code} (fake EC2)", instance_type, zone, times)
            )

    def fail_run_instances(
        self,
        code: str,
        *,
        message: str | None = None,
        instance_type: str | None = None,
        zone: str | None = None,
        times: int | None = None,
    ) -> None:
        self.fail("RunInstances", code, message=message, instance_type=instance_type, zone=zone, times=times)

    def timeout_after_create(self, times: int = 1, *, hold_s: float = 0.0) -> None:
        """The next ``times`` RunInstances start their instance, then get no answer (closed after ``hold_s``)."""
        with self._lock:
            self._timeouts.append(_Timeout(times, hold_s))

    def clear_faults(self) -> None:
        with self._lock:
            self._rules.clear()
            self._timeouts.clear()

    def calls(self, action: str) -> int:
        """How many requests of ``action`` the proxy received (faulted ones included)."""
        with self._lock:
            return self._calls[action]

    def reset_calls(self) -> None:
        with self._lock:
            self._calls.clear()

    def call_log(self) -> list[tuple[float, str, str]]:
        """``(time.time(), action, detail)`` for each request the proxy received (detail ``request <zone or
        subnet> <instance type>``) and each answer it sent (``response <status> <error code or "ok">``;
        ``closed`` for a connection closed without one), in time order."""
        with self._lock:
            return sorted(self._log)

    def _note(self, stamp: float, action: str, detail: str) -> None:
        with self._lock:
            self._log.append((stamp, action, detail))

    # ------------------------------------------------------------------ moto, directly

    def client(self, region: str = "us-east-1", service: str = "ec2") -> Any:
        """A boto3 client talking to moto itself (not through the proxy: not counted, never faulted)."""
        import boto3

        return boto3.client(service, region_name=region, endpoint_url=self.moto_url, **_KEYS)

    def instances(self) -> list[CloudInstance]:
        """Every instance moto holds, in every region seen, with its user data decoded."""
        found: list[CloudInstance] = []
        for region in sorted(self._seen_regions()):
            client = self.client(region)
            for page in client.get_paginator("describe_instances").paginate():
                for reservation in page["Reservations"]:
                    for instance in reservation["Instances"]:
                        found.append(self._cloud_instance(client, region, instance))
        return found

    def user_data(self, instance_id: str, region: str = "us-east-1") -> str:
        answer = self.client(region).describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
        encoded = (answer.get("UserData") or {}).get("Value")
        return base64.b64decode(encoded).decode() if encoded else ""

    def stop_instance(self, instance_id: str, region: str = "us-east-1") -> None:
        self.client(region).stop_instances(InstanceIds=[instance_id])

    def terminate_all(self) -> None:
        for instance in self.instances():
            if not instance.gone and instance.region is not None:
                self.client(instance.region).terminate_instances(InstanceIds=[instance.id])

    def _seen_regions(self) -> set[str]:
        with self._lock:
            return set(self._regions)

    def _cloud_instance(self, client: Any, region: str, instance: dict[str, Any]) -> CloudInstance:
        state = instance["State"]["Name"]
        return CloudInstance(
            id=instance["InstanceId"],
            state=state,
            running=state in ("pending", "running"),
            gone=state in ("shutting-down", "terminated"),
            user_data=self.user_data(instance["InstanceId"], region),
            tags={t["Key"]: t["Value"] for t in instance.get("Tags") or []},
            instance_type=instance.get("InstanceType"),
            region=region,
            zone=(instance.get("Placement") or {}).get("AvailabilityZone"),
        )

    def _zone_of_subnet(self, region: str, subnet_id: str) -> str | None:
        key = (region, subnet_id)
        if key not in self._subnet_zones:
            subnets = self.client(region).describe_subnets(Filters=[{"Name": "subnet-id", "Values": [subnet_id]}])
            for subnet in subnets["Subnets"]:
                self._subnet_zones[key] = subnet["AvailabilityZone"]
        return self._subnet_zones.get(key)

    # ------------------------------------------------------------------ the proxy's decisions

    def _decide(self, region: str, action: str, params: dict[str, str]) -> tuple[str, Any]:
        """What to do with one request: ("fault", rule), ("replay", answer), ("mismatch", None), ("forward", None),
        or ("timeout", (what it would have been, hold_s)): a timeout also swallows the answer to a replay."""
        instance_type = params.get("InstanceType")
        zone = params.get("Placement.AvailabilityZone")
        subnet = params.get("SubnetId") or params.get("NetworkInterface.1.SubnetId")
        if action == "RunInstances" and zone is None and subnet:
            zone = self._zone_of_subnet(region, subnet)
        with self._lock:
            self._calls[action] += 1
            self._regions.add(region)
            for rule in self._rules:
                if rule.matches(action, instance_type, zone):
                    if rule.times is not None:
                        rule.times -= 1
                    return "fault", rule
            if action != "RunInstances":
                return "forward", None
            decision: tuple[str, Any] = ("forward", None)
            token = params.get("ClientToken")
            remembered = self._tokens.get((region, token)) if token else None
            if remembered is not None:
                fingerprint, answer = remembered
                decision = ("replay", answer) if fingerprint == _fingerprint(params) else ("mismatch", None)
            for timeout in self._timeouts:
                if timeout.times > 0 and decision[0] != "mismatch":
                    timeout.times -= 1
                    return "timeout", (decision, timeout.hold_s)
            return decision

    def _replay_terminated(self, region: str, answer: bytes) -> bool:
        """Whether the instance a remembered RunInstances answer started is terminated (or terminating) in moto."""
        found = _INSTANCE_ID.search(answer)
        if found is None:
            return False
        described = self.client(region).describe_instances(InstanceIds=[found.group(1).decode()])
        states = [i["State"]["Name"] for r in described["Reservations"] for i in r["Instances"]]
        return any(state in ("shutting-down", "terminated") for state in states)

    def _remember(self, region: str, params: dict[str, str], answer: tuple[int, list[tuple[str, str]], bytes]) -> None:
        token = params.get("ClientToken")
        if token and answer[0] == 200:
            with self._lock:
                self._tokens.setdefault((region, token), (_fingerprint(params), answer))


def _fingerprint(params: dict[str, str]) -> str:
    return "&".join(f"{k}={v}" for k, v in sorted(params.items()))


def error_document(code: str, message: str) -> bytes:
    """EC2's XML error response."""
    from xml.sax.saxutils import escape

    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{escape(code)}</Code><Message>{escape(message)}</Message></Error></Errors>"
        f"<RequestID>{uuid.uuid4()}</RequestID></Response>"
    ).encode()


class _ProxyHandler(BaseHTTPRequestHandler):
    owner: FakeEc2
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def _handle(self) -> None:
        received = time.time()
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        form = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
        if "?" in self.path:
            form.update(parse_qs(self.path.split("?", 1)[1], keep_blank_values=True))
        params = {k: v[0] for k, v in form.items()}
        action = params.get("Action", "")
        found = _REGION.search(self.headers.get("Authorization", ""))
        region = found.group(1) if found else "us-east-1"
        where = (
            params.get("Placement.AvailabilityZone")
            or params.get("SubnetId")
            or params.get("NetworkInterface.1.SubnetId")
        )
        self._action = action
        self.owner._note(received, action, f"request {where or '-'} {params.get('InstanceType') or '-'}")
        what, detail = self.owner._decide(region, action, params)
        if what == "fault":
            rule: _Rule = detail
            self._answer(
                STATUS.get(rule.code, 400), [("Content-Type", "text/xml")], error_document(rule.code, rule.message)
            )
            return
        if what == "replay" and self.owner._replay_terminated(region, detail[2]):
            message = "The client token's instance has been terminated (fake EC2)"
            self._answer(400, [("Content-Type", "text/xml")], error_document("IdempotentInstanceTerminated", message))
            return
        if what == "replay":
            self._answer(*detail)
            return
        if what == "mismatch":
            message = "Request with the same client token was used with different parameters (fake EC2)"
            self._answer(400, [("Content-Type", "text/xml")], error_document("IdempotentParameterMismatch", message))
            return
        if what == "timeout":
            (underneath, _), hold_s = detail
            if underneath == "forward":  # a replay was answered already: nothing new to start
                self.owner._remember(region, params, self._forward(body))
            time.sleep(float(hold_s))
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            self.owner._note(time.time(), action, "closed")
            return
        answer = self._forward(body)
        if action == "RunInstances":
            self.owner._remember(region, params, answer)
        self._answer(*answer)

    def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.owner._moto_port, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            connection.request(self.command, self.path, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read()
            kept = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP]
            return response.status, kept, data
        finally:
            connection.close()

    def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response(status)
        for key, value in headers:
            if key.lower() not in ("server", "date"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        sent = time.time()
        found = _ERROR_CODE.search(body) if status >= 400 else None
        code = found.group(1).decode(errors="replace") if found else ("ok" if status < 400 else "error")
        self.owner._note(sent, getattr(self, "_action", ""), f"response {status} {code}")
