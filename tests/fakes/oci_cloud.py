"""A fake OCI region: the Identity and Core Services (compute) REST APIs, version ``20160918``, over HTTP.

:class:`FakeOci` runs a threaded HTTP server on 127.0.0.1 (a free port) that
answers the requests the real ``oci`` SDK sends when a client's
``service_endpoint`` is :attr:`FakeOci.url`, so the SDK runs unchanged: the
plugin under test, a test's own client and a ``levers9 server`` subprocess all
reach it over HTTP. Written from the OCI API reference (paths, camelCase
bodies, the error table of "API Errors", the ``opc-*`` headers); nothing of
the SDK is patched.

What it answers:

* ``GET /20160918/availabilityDomains?compartmentId=`` (Identity);
* ``GET /20160918/shapes`` (``compartmentId``, ``availabilityDomain``, ``imageId``,
  ``limit``/``page``): the recorded shapes of ``tests/data/gpu/oci_list_shapes.json``
  in every domain (image compatibility is not modelled: every image lists every shape);
* ``POST /20160918/instances`` (LaunchInstance) with ``opc-retry-token``: the
  same token with the same body answers the instance it created; with another
  body, 409 ``Conflict``; once that instance is terminated, 409
  ``InvalidatedRetryToken`` (the reference says a token is invalidated by a
  later conflicting operation, not which code a changed body gets: the fake's
  choice);
* ``GET /20160918/instances/{id}``, ``GET /20160918/instances`` (``compartmentId``
  required, optional ``lifecycleState``, ``availabilityDomain``, ``displayName``;
  paginated, newest first), ``DELETE /20160918/instances/{id}``
  (``preserveBootVolume``...): 204; an instance already ``TERMINATED`` answers
  409 ``IncorrectState``; an unknown id 404 ``NotAuthorizedOrNotFound``;
* ``POST /20160918/computeCapacityReports``: ``AVAILABLE`` unless :meth:`FakeOci.capacity`
  says otherwise.

Invariants: every response carries ``opc-request-id``; errors are
``{"code": ..., "message": ...}`` with the reference's status; every request
must carry a valid draft-cavage HTTP signature (RSA-SHA256) by a key the fake
knows (:meth:`FakeOci.add_key`) over ``date (request-target) host`` (plus
``content-length content-type x-content-sha256`` with a body, whose digest is
checked), with a ``date`` within five minutes, else 401 ``NotAuthenticated``.
List pages hold :attr:`FakeOci.page_size` items unless ``limit`` asks fewer;
``opc-next-page`` names the next. Instances go PROVISIONING -> RUNNING after
``provision_delay`` seconds and TERMINATING -> TERMINATED ``terminate_delay``
seconds after their delete (0: at once), and stay listed as TERMINATED.

Fault injection (each fault applies to requests that match it, ``times`` times
or for ever): :meth:`fail` / :meth:`fail_launch` (an error answer),
:meth:`refuse_launch` (an error code at its documented status, :data:`STATUS`),
:meth:`rate_limit` (429 ``TooManyRequests`` with ``retry-after``),
:meth:`drop_launch_response` (the launch takes effect, then the connection is
closed without an answer), :meth:`capacity` (the capacity report's status for a
shape and domain; ``OUT_OF_HOST_CAPACITY`` also makes launches there answer
500 ``InternalError`` "Out of host capacity."). :meth:`calls` counts requests
per operation, :meth:`instances` reports what the fake holds, :meth:`launch_body`
the LaunchInstanceDetails an instance got and :meth:`terminations` the query
of each TerminateInstance it got; :meth:`call_log` stamps (``time.time()``) each
request as it arrives and each answer as it is sent, for ``bench/clouds.py``. A lost answer hits a replayed retry token as
much as a new launch (it is the network's doing).
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import json
import re
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from tests.fakes import CloudInstance
from tests.fakes.local_server import LocalServer

__all__ = ["API_VERSION", "SHAPES_FILE", "STATUS", "FakeOci", "Fault"]

API_VERSION = "20160918"
SHAPES_FILE = Path(__file__).resolve().parents[1] / "data" / "gpu" / "oci_list_shapes.json"

#: how far a request's ``date`` may be from the fake's clock (OCI allows five minutes)
MAX_CLOCK_SKEW_S = 300.0
#: OCI's short region codes: ``Instance.region`` answers these two regions by their code, others by name
_REGION_CODES = {"us-ashburn-1": "iad", "us-phoenix-1": "phx"}
_SIGNATURE_PARAM = re.compile(r'(\w+)="([^"]*)"')
#: the HTTP status OCI's API Errors reference gives each error code (a code it lists under two statuses, such as
#: InvalidParameter, has its first); 500 ``InternalError`` is the compute service's "Out of host capacity." answer
STATUS: dict[str, int] = {
    "CannotParseRequest": 400,
    "InvalidParameter": 400,
    "LimitExceeded": 400,
    "MissingParameter": 400,
    "QuotaExceeded": 400,
    "RelatedResourceNotAuthorizedOrNotFound": 400,
    "NotAuthenticated": 401,
    "NotAllowed": 403,
    "NotAuthorized": 403,
    "SignUpRequired": 403,
    "NotAuthorizedOrNotFound": 404,
    "NotFound": 404,
    "NamespaceNotFound": 404,
    "MethodNotAllowed": 405,
    "Conflict": 409,
    "ExternalServerIncorrectState": 409,
    "IncorrectState": 409,
    "InvalidatedRetryToken": 409,
    "NotAuthorizedOrResourceAlreadyExists": 409,
    "NoEtagMatch": 412,
    "TooManyRequests": 429,
    "InternalError": 500,
    "InternalServerError": 500,
    "MethodNotImplemented": 501,
    "ServiceUnavailable": 503,
}


@dataclass
class Fault:
    """One injected failure: which requests it hits, what they get, and how many more times."""

    op: str
    status: int
    code: str
    message: str
    shape: str | None = None
    domain: str | None = None
    #: how many more requests it hits; None: every one
    times: int | None = None
    retry_after: float | None = None
    #: ``error``: answer the error; ``drop``: do the operation, then close the connection without answering
    kind: str = "error"

    def matches(self, op: str, shape: str | None, domain: str | None) -> bool:
        if self.op != op or (self.times is not None and self.times <= 0):
            return False
        return (self.shape is None or self.shape == shape) and (self.domain is None or self.domain == domain)


@dataclass
class _Instance:
    id: str
    body: dict[str, Any]
    retry_token: str | None
    created: float
    time_created: str
    terminated_at: float | None = None
    forced_state: str | None = None
    #: the query of each TerminateInstance it got (``preserveBootVolume``...)
    terminations: list[dict[str, str]] = field(default_factory=list)


class _ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after


class _Dropped(Exception):
    """The operation took effect; the connection is closed without an answer."""


class FakeOci:
    """One fake OCI region (see the module docstring); use as a context manager or call start/stop."""

    def __init__(
        self,
        *,
        region: str = "us-ashburn-1",
        availability_domains: tuple[str, ...] = ("Uocm:US-ASHBURN-AD-1", "Uocm:US-ASHBURN-AD-2"),
        compartments: tuple[str, ...] = (),
        images: tuple[str, ...] = (),
        subnets: tuple[str, ...] = (),
        page_size: int = 100,
        provision_delay: float = 0.0,
        terminate_delay: float = 0.0,
    ) -> None:
        self.region = region
        self.availability_domains = list(availability_domains)
        #: compartments (or tenancy OCIDs) that exist; empty: any is accepted
        self.compartments = set(compartments)
        #: images and subnets a launch may name; empty: any is accepted
        self.images = set(images)
        self.subnets = set(subnets)
        self.page_size = page_size
        self.provision_delay = provision_delay
        self.terminate_delay = terminate_delay
        self.shapes: list[dict[str, Any]] = json.loads(SHAPES_FILE.read_text())
        self._keys: dict[str, rsa.RSAPublicKey] = {}
        self._faults: list[Fault] = []
        self._capacity: dict[tuple[str | None, str], str] = {}
        self._instances: dict[str, _Instance] = {}
        self._tokens: dict[str, str] = {}
        self._calls: Counter[str] = Counter()
        self._log: list[tuple[float, str, str]] = []
        self._lock = threading.RLock()
        self._server: LocalServer | None = None
        self.port = 0

    # ------------------------------------------------------------------ life cycle

    @property
    def url(self) -> str:
        """The endpoint to give the SDK as ``service_endpoint`` (no trailing slash, no API version)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeOci:
        fake = self

        class Handler(_Handler):
            oci = fake

        self._server = LocalServer(Handler, name="fake-oci")
        self.port = self._server.port
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self._server = None

    def __enter__(self) -> FakeOci:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ what a test sets up

    def add_key(self, key_id: str, public_key: rsa.RSAPublicKey) -> None:
        """Accept signatures by ``public_key`` under ``key_id`` (``<tenancy>/<user>/<fingerprint>`` or ``ST$<token>``)."""
        with self._lock:
            self._keys[key_id] = public_key

    def fail(
        self,
        op: str,
        status: int,
        code: str,
        message: str,
        *,
        shape: str | None = None,
        domain: str | None = None,
        times: int | None = None,
        retry_after: float | None = None,
    ) -> Fault:
        """Answer requests of ``op`` (``LaunchInstance``, ``ListShapes``...) with an error."""
        fault = Fault(op, status, code, message, shape, domain, times, retry_after)
        with self._lock:
            self._faults.append(fault)
        return fault

    def fail_launch(
        self,
        status: int,
        code: str,
        message: str,
        *,
        shape: str | None = None,
        domain: str | None = None,
        times: int | None = None,
    ) -> Fault:
        """Answer LaunchInstance (of ``shape`` in ``domain``, when given) with an error, before it takes effect."""
        return self.fail("LaunchInstance", status, code, message, shape=shape, domain=domain, times=times)

    def refuse_launch(
        self,
        code: str,
        message: str | None = None,
        *,
        shape: str | None = None,
        domain: str | None = None,
        times: int | None = None,
    ) -> Fault:
        """Answer LaunchInstance with OCI's error ``code`` at the status the reference gives it (:data:`STATUS`)."""
        return self.fail_launch(
            STATUS[code], code, message or f"injected {code} (fake OCI)", shape=shape, domain=domain, times=times
        )

    def rate_limit(
        self, op: str = "LaunchInstance", *, times: int | None = 1, retry_after: float | None = 2.0
    ) -> Fault:
        """Answer ``op`` with 429 ``TooManyRequests`` (and ``retry-after`` when given)."""
        return self.fail(
            op, 429, "TooManyRequests", "Too many requests for the tenancy", times=times, retry_after=retry_after
        )

    def drop_launch_response(self, *, times: int = 1) -> Fault:
        """Let LaunchInstance take effect, then close the connection without answering (a lost response)."""
        fault = Fault("LaunchInstance", 0, "", "", times=times, kind="drop")
        with self._lock:
            self._faults.append(fault)
        return fault

    def capacity(self, shape: str | None, domain: str, status: str) -> None:
        """What the capacity report says for ``shape`` (None: every shape) in ``domain``.

        ``OUT_OF_HOST_CAPACITY`` also refuses launches there with 500 ``InternalError``
        "Out of host capacity.", as OCI does.
        """
        with self._lock:
            self._capacity[(shape, domain)] = status

    def set_state(self, instance_id: str, state: str) -> None:
        """Force an instance's lifecycle state (``STOPPED``, ``TERMINATED`` for a preemption...)."""
        with self._lock:
            self._instances[instance_id].forced_state = state

    # ------------------------------------------------------------------ what a test reads

    def calls(self, op: str) -> int:
        """How many requests of ``op`` arrived (whatever they were answered)."""
        with self._lock:
            return self._calls[op]

    def call_log(self) -> list[tuple[float, str, str]]:
        """``(time.time(), op, detail)`` for each request that arrived (detail ``request <shape> <domain>``, or
        ``request``) and each answer sent (``response <status> <error code or "ok">``; ``closed`` for a
        connection closed without one), in time order."""
        with self._lock:
            return sorted(self._log)

    def note(self, stamp: float, op: str, detail: str) -> None:
        with self._lock:
            self._log.append((stamp, op, detail))

    def instances(self) -> list[CloudInstance]:
        with self._lock:
            found = []
            for instance in self._instances.values():
                state = self._state(instance)
                body = instance.body
                user_data = (body.get("metadata") or {}).get("user_data") or ""
                found.append(
                    CloudInstance(
                        id=instance.id,
                        state=state,
                        running=state == "RUNNING",
                        gone=state in ("TERMINATING", "TERMINATED"),
                        user_data=base64.b64decode(user_data).decode() if user_data else "",
                        tags=dict(body.get("freeformTags") or {}),
                        instance_type=body.get("shape"),
                        region=self.region,
                        zone=body.get("availabilityDomain"),
                    )
                )
            return found

    def launch_body(self, instance_id: str) -> dict[str, Any]:
        """The LaunchInstanceDetails body (camelCase, as the SDK sent it) an instance was launched with."""
        with self._lock:
            copy: dict[str, Any] = json.loads(json.dumps(self._instances[instance_id].body))
            return copy

    def terminations(self, instance_id: str) -> list[dict[str, str]]:
        """The query parameters of every TerminateInstance an instance got, in order."""
        with self._lock:
            return [dict(q) for q in self._instances[instance_id].terminations]

    def terminate_all(self) -> None:
        with self._lock:
            now = time.monotonic()
            for instance in self._instances.values():
                if instance.terminated_at is None:
                    instance.terminated_at = now

    # ------------------------------------------------------------------ the API

    def _state(self, instance: _Instance) -> str:
        if instance.forced_state is not None:
            return instance.forced_state
        now = time.monotonic()
        if instance.terminated_at is not None:
            return "TERMINATED" if now >= instance.terminated_at + self.terminate_delay else "TERMINATING"
        return "RUNNING" if now >= instance.created + self.provision_delay else "PROVISIONING"

    def _view(self, instance: _Instance) -> dict[str, Any]:
        body = instance.body
        source = dict(body.get("sourceDetails") or {})
        return {
            "id": instance.id,
            "availabilityDomain": body["availabilityDomain"],
            "compartmentId": body["compartmentId"],
            "displayName": body.get("displayName") or instance.id[-12:],
            "faultDomain": "FAULT-DOMAIN-1",
            "freeformTags": body.get("freeformTags") or {},
            "definedTags": body.get("definedTags") or {},
            "imageId": source.get("imageId"),
            "launchMode": "NATIVE",
            "lifecycleState": self._state(instance),
            "metadata": body.get("metadata") or {},
            "region": _REGION_CODES.get(self.region, self.region),
            "shape": body["shape"],
            "sourceDetails": source,
            "preemptibleInstanceConfig": body.get("preemptibleInstanceConfig"),
            "timeCreated": instance.time_created,
        }

    def _take_fault(self, op: str, shape: str | None, domain: str | None, kind: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.kind == kind and fault.matches(op, shape, domain):
                    if fault.times is not None:
                        fault.times -= 1
                    return fault
        return None

    def _raise_fault(self, op: str, shape: str | None = None, domain: str | None = None) -> None:
        """Raise the error fault matching the request, if any."""
        fault = self._take_fault(op, shape, domain, "error")
        if fault is not None:
            raise _ApiError(fault.status, fault.code, fault.message, fault.retry_after)

    def _compartment(self, compartment_id: str | None) -> str:
        if not compartment_id:
            raise _ApiError(400, "MissingParameter", "compartmentId is required")
        if self.compartments and compartment_id not in self.compartments:
            raise _ApiError(404, "NotAuthorizedOrNotFound", "Authorization failed or requested resource not found.")
        return compartment_id

    def _page(self, items: list[Any], query: dict[str, str]) -> tuple[list[Any], str | None]:
        try:
            start = int(query.get("page", "0") or 0)
            limit = min(int(query.get("limit", self.page_size)), self.page_size)
        except ValueError as exc:
            raise _ApiError(400, "InvalidParameter", f"bad page or limit: {exc}") from exc
        if limit < 1:
            raise _ApiError(400, "InvalidParameter", "limit must be at least 1")
        end = start + limit
        return items[start:end], (str(end) if end < len(items) else None)

    def list_availability_domains(self, query: dict[str, str]) -> list[dict[str, Any]]:
        compartment = self._compartment(query.get("compartmentId"))
        self._raise_fault("ListAvailabilityDomains")
        return [
            {
                "name": name,
                "id": f"ocid1.availabilitydomain.oc1..{hashlib.sha1(name.encode()).hexdigest()[:20]}",
                "compartmentId": compartment,
            }
            for name in self.availability_domains
        ]

    def list_shapes(self, query: dict[str, str]) -> tuple[list[dict[str, Any]], str | None]:
        self._compartment(query.get("compartmentId"))
        domain = query.get("availabilityDomain")
        if domain is not None and domain not in self.availability_domains:
            raise _ApiError(400, "InvalidParameter", f"availabilityDomain {domain} is not in region {self.region}")
        self._raise_fault("ListShapes", domain=domain)
        shapes = [s for s in self.shapes if "shape" not in query or s["shape"] == query["shape"]]
        return self._page(shapes, query)

    def capacity_report(self, body: dict[str, Any]) -> dict[str, Any]:
        compartment = self._compartment(body.get("compartmentId"))
        domain = body.get("availabilityDomain")
        if domain not in self.availability_domains:
            raise _ApiError(400, "InvalidParameter", f"availabilityDomain {domain} is not in region {self.region}")
        wanted = body.get("shapeAvailabilities") or []
        if not wanted:
            raise _ApiError(400, "MissingParameter", "shapeAvailabilities is required")
        self._raise_fault("CreateComputeCapacityReport", domain=domain)
        answers = []
        with self._lock:
            for item in wanted:
                shape = item.get("instanceShape")
                status = self._capacity.get((shape, domain)) or self._capacity.get((None, domain)) or "AVAILABLE"
                answers.append(
                    {
                        "instanceShape": shape,
                        "faultDomain": item.get("faultDomain"),
                        "instanceShapeConfig": item.get("instanceShapeConfig"),
                        "availableCount": 0 if status != "AVAILABLE" else 1,
                        "availabilityStatus": status,
                    }
                )
        return {
            "compartmentId": compartment,
            "availabilityDomain": domain,
            "shapeAvailabilities": answers,
            "timeCreated": _now_text(),
        }

    def launch(self, body: dict[str, Any], retry_token: str | None) -> tuple[dict[str, Any], bool]:
        """Launch (or find the launch of ``retry_token``); returns the instance and whether to drop the answer."""
        for required in ("availabilityDomain", "compartmentId", "shape"):
            if not body.get(required):
                raise _ApiError(400, "MissingParameter", f"{required} is required")
        source = body.get("sourceDetails") or {}
        image = source.get("imageId") or body.get("imageId")
        subnet = (body.get("createVnicDetails") or {}).get("subnetId") or body.get("subnetId")
        if not image:
            raise _ApiError(400, "MissingParameter", "sourceDetails.imageId is required")
        if not subnet:
            raise _ApiError(400, "MissingParameter", "createVnicDetails.subnetId is required")
        with self._lock:
            # a lost answer is the network's doing: it hits a replayed token as much as a new launch
            drop = self._take_fault("LaunchInstance", body.get("shape"), body.get("availabilityDomain"), "drop")
            try:
                if retry_token is not None and retry_token in self._tokens:
                    earlier = self._instances[self._tokens[retry_token]]
                    if earlier.body != body:
                        raise _ApiError(409, "Conflict", "The retry token was used for a request with other parameters")
                    if self._state(earlier) in ("TERMINATING", "TERMINATED"):
                        raise _ApiError(
                            409,
                            "InvalidatedRetryToken",
                            "The instance created with this retry token has been terminated",
                        )
                    return self._view(earlier), drop is not None
                self._compartment(body["compartmentId"])
                domain, shape = body["availabilityDomain"], body["shape"]
                if domain not in self.availability_domains:
                    raise _ApiError(
                        400, "InvalidParameter", f"availabilityDomain {domain} is not in region {self.region}"
                    )
                if not any(s["shape"] == shape for s in self.shapes):
                    raise _ApiError(400, "InvalidParameter", f"Shape {shape} is not valid")
                if self.images and image not in self.images:
                    raise _ApiError(
                        400,
                        "RelatedResourceNotAuthorizedOrNotFound",
                        f"Authorization failed or image {image} not found",
                    )
                if self.subnets and subnet not in self.subnets:
                    raise _ApiError(
                        400,
                        "RelatedResourceNotAuthorizedOrNotFound",
                        f"Authorization failed or subnet {subnet} not found",
                    )
                self._raise_fault("LaunchInstance", shape=shape, domain=domain)
                sold_out = self._capacity.get((shape, domain)) or self._capacity.get((None, domain))
                if sold_out == "OUT_OF_HOST_CAPACITY":
                    raise _ApiError(500, "InternalError", "Out of host capacity.")
                instance = _Instance(
                    id=f"ocid1.instance.oc1.{_REGION_CODES.get(self.region, self.region)}.{uuid.uuid4().hex}",
                    body=body,
                    retry_token=retry_token,
                    created=time.monotonic(),
                    time_created=_now_text(),
                )
                self._instances[instance.id] = instance
                if retry_token is not None:
                    self._tokens[retry_token] = instance.id
                view = self._view(instance)
                view["lifecycleState"] = "PROVISIONING"
                return view, drop is not None
            except _ApiError:
                if drop is not None:
                    raise _Dropped from None  # the error's answer is lost as well
                raise

    def get_instance(self, instance_id: str) -> dict[str, Any]:
        self._raise_fault("GetInstance")
        with self._lock:
            instance = self._instances.get(instance_id)
            if instance is None:
                raise _ApiError(404, "NotAuthorizedOrNotFound", "Authorization failed or requested resource not found.")
            return self._view(instance)

    def list_instances(self, query: dict[str, str]) -> tuple[list[dict[str, Any]], str | None]:
        compartment = self._compartment(query.get("compartmentId"))
        self._raise_fault("ListInstances")
        with self._lock:
            views = [self._view(i) for i in self._instances.values() if i.body["compartmentId"] == compartment]
        for key in ("lifecycleState", "availabilityDomain", "displayName"):
            if key in query:
                views = [v for v in views if v[key] == query[key]]
        views.sort(key=lambda v: v["timeCreated"], reverse=True)
        return self._page(views, query)

    def terminate(self, instance_id: str, query: dict[str, str]) -> None:
        self._raise_fault("TerminateInstance")
        with self._lock:
            instance = self._instances.get(instance_id)
            if instance is None:
                raise _ApiError(404, "NotAuthorizedOrNotFound", "Authorization failed or requested resource not found.")
            instance.terminations.append(dict(query))
            state = self._state(instance)
            if state == "TERMINATED":
                raise _ApiError(409, "IncorrectState", f"Instance {instance_id} is already terminated")
            if instance.terminated_at is None:
                instance.terminated_at = time.monotonic()
                if instance.forced_state is not None and instance.forced_state != "TERMINATED":
                    instance.forced_state = None

    # ------------------------------------------------------------------ signatures

    def verify(self, method: str, target: str, headers: dict[str, str], body: bytes) -> None:
        """Check the request's draft-cavage signature; raise 401 ``NotAuthenticated`` when it does not hold."""
        denied = _ApiError(
            401,
            "NotAuthenticated",
            "The required information to complete authentication was not provided or was incorrect.",
        )
        authorization = headers.get("authorization", "")
        if not authorization.startswith("Signature "):
            raise denied
        params = dict(_SIGNATURE_PARAM.findall(authorization))
        if params.get("algorithm") != "rsa-sha256" or params.get("version") != "1":
            raise denied
        with self._lock:
            key = self._keys.get(params.get("keyId", ""))
        if key is None:
            raise denied
        signed = params.get("headers", "").split()
        required = ["date", "(request-target)", "host"]
        if method in ("POST", "PUT", "PATCH"):
            required += ["content-length", "content-type", "x-content-sha256"]
            digest = base64.b64encode(hashlib.sha256(body).digest()).decode()
            if headers.get("x-content-sha256") != digest or headers.get("content-length") != str(len(body)):
                raise denied
        if any(name not in signed for name in required):
            raise denied
        lines = []
        for name in signed:
            if name == "(request-target)":
                lines.append(f"(request-target): {method.lower()} {target}")
            elif name in headers:
                lines.append(f"{name}: {headers[name]}")
            else:
                raise denied
        try:
            sent = email.utils.parsedate_to_datetime(headers["date"])
            if abs(time.time() - sent.timestamp()) > MAX_CLOCK_SKEW_S:
                raise denied
            key.verify(
                base64.b64decode(params.get("signature", "")),
                "\n".join(lines).encode(),
                padding.PKCS1v15(),
                hashes.SHA256(),
            )
        except (InvalidSignature, ValueError, TypeError) as exc:
            raise denied from exc

    def count(self, op: str) -> None:
        with self._lock:
            self._calls[op] += 1


def _request_detail(op: str, body: bytes) -> str:
    if op != "LaunchInstance":
        return "request"
    try:
        document = json.loads(body or b"{}")
    except ValueError:
        return "request"
    if not isinstance(document, dict):
        return "request"
    return f"request {document.get('shape') or '-'} {document.get('availabilityDomain') or '-'}"


def _now_text() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


class _Handler(BaseHTTPRequestHandler):
    """Routes one request to :class:`FakeOci`; answers JSON with ``opc-request-id``."""

    oci: FakeOci
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def _route(self, method: str, path: str) -> tuple[str, str | None]:
        prefix = f"/{API_VERSION}"
        if not path.startswith(prefix + "/"):
            return "", None
        rest = path[len(prefix) :]
        routes = {
            ("GET", "/availabilityDomains"): "ListAvailabilityDomains",
            ("GET", "/shapes"): "ListShapes",
            ("POST", "/instances"): "LaunchInstance",
            ("GET", "/instances"): "ListInstances",
            ("POST", "/computeCapacityReports"): "CreateComputeCapacityReport",
        }
        if (method, rest.rstrip("/")) in routes:
            return routes[(method, rest.rstrip("/"))], None
        match = re.fullmatch(r"/instances/([^/]+)", rest)
        if match:
            return {"GET": "GetInstance", "DELETE": "TerminateInstance"}.get(method, ""), match.group(1)
        return "", None

    def _handle(self, method: str) -> None:
        received = time.time()
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        headers = {k.lower(): v for k, v in self.headers.items()}
        op, instance_id = self._route(method, parts.path)
        fake = self.oci
        self._op = op or f"{method} {parts.path}"
        fake.note(received, self._op, _request_detail(op, body))
        try:
            if not op:
                raise _ApiError(404, "NotFound", f"no operation {method} {parts.path}")
            fake.count(op)
            fake.verify(method, self.path, headers, body)
            data: Any = None
            next_page: str | None = None
            status = 200
            if op == "ListAvailabilityDomains":
                data = fake.list_availability_domains(query)
            elif op == "ListShapes":
                data, next_page = fake.list_shapes(query)
            elif op == "ListInstances":
                data, next_page = fake.list_instances(query)
            elif op == "GetInstance":
                data = fake.get_instance(instance_id or "")
            elif op == "TerminateInstance":
                fake.terminate(instance_id or "", query)
                status = 204
            else:
                try:
                    document = json.loads(body or b"{}")
                except ValueError as exc:
                    raise _ApiError(400, "CannotParseRequest", f"the body is not JSON: {exc}") from exc
                if not isinstance(document, dict):
                    raise _ApiError(400, "CannotParseRequest", "the body must be a JSON object")
                if op == "CreateComputeCapacityReport":
                    data = fake.capacity_report(document)
                else:
                    data, drop = fake.launch(document, headers.get("opc-retry-token"))
                    if drop:
                        raise _Dropped
        except _Dropped:
            self.close_connection = True
            fake.note(time.time(), self._op, "closed")
            return
        except _ApiError as exc:
            extra = {"retry-after": f"{exc.retry_after:g}"} if exc.retry_after is not None else {}
            self._answer(exc.status, {"code": exc.code, "message": exc.message}, extra)
            return
        extra = {"opc-next-page": next_page} if next_page else {}
        if op in ("LaunchInstance", "GetInstance"):
            extra["etag"] = hashlib.sha1(json.dumps(data, sort_keys=True).encode()).hexdigest()
        if op == "LaunchInstance":
            extra["opc-work-request-id"] = f"ocid1.coreservicesworkrequest.oc1..{uuid.uuid4().hex}"
        self._answer(status, None if status == 204 else data, extra)

    def _answer(self, status: int, data: Any, extra: dict[str, str]) -> None:
        payload = b"" if data is None else json.dumps(data).encode()
        self.send_response(status)
        self.send_header("opc-request-id", uuid.uuid4().hex.upper())
        if payload:
            self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        for name, value in extra.items():
            self.send_header(name, value)
        self.end_headers()
        if payload:
            self.wfile.write(payload)
        code = data.get("code") if status >= 400 and isinstance(data, dict) else None
        self.oci.note(time.time(), getattr(self, "_op", ""), f"response {status} {code or 'ok'}")

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_PUT(self) -> None:
        self._handle("PUT")
