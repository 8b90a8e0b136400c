"""The API-server half of a fake Kubernetes cluster: the object store, admission, and the REST routes, as JSON.

:class:`KubeApi` answers the requests the real ``kubernetes`` Python client
sends (written from the Kubernetes API reference and the API conventions: paths,
``Status`` error bodies, list shapes, selectors, defaulting), so the client runs
unchanged against it; :mod:`tests.fakes.k8s_cluster` serves it on
``127.0.0.1`` and adds the controllers, scheduler and kubelet that change the
objects afterwards. Nothing here starts a thread or a process.

What it serves:

* ``GET /version``, ``/api``, ``/api/v1``, ``/apis``, ``/apis/{group}/{version}``
  (discovery, minimal but well formed), ``/healthz``, ``/livez``, ``/readyz``;
* core/v1 ``namespaces`` (list, get, create), ``nodes`` (list, get),
  ``pods`` (list namespaced and across namespaces, get, delete, ``pods/log``),
  ``secrets`` and ``serviceaccounts`` (create, get, list, delete),
  ``resourcequotas`` (create, get, list, delete), ``events`` (create, get, list
  namespaced and across namespaces); batch/v1 ``jobs`` (create, get, list,
  delete); authorization.k8s.io/v1 ``selfsubjectaccessreviews`` (create).
  Anything else: 404 ``NotFound`` for an unknown path, 405 ``MethodNotAllowed``
  for a verb a resource does not serve here (update, patch, watch, deletecollection);
* lists take ``labelSelector`` (equality ``a=b``/``a==b``/``a!=b``, set-based
  ``a in (x,y)``/``a notin (x)``, ``a``, ``!a``, ``a>1``/``a<1``; comma is AND),
  ``fieldSelector`` (``=``, ``==``, ``!=``, on the fields the real server
  indexes for each resource; any other field is 400 ``field label not
  supported``), ``limit`` and ``continue``;
* every object gets ``metadata.uid``, a ``resourceVersion`` from one counter
  (strictly increasing across all writes), ``creationTimestamp``, and
  ``namespace`` where namespaced; ``generateName`` is honoured.

Errors are ``Status`` objects (``kind: Status``, ``apiVersion: v1``,
``status: Failure``, ``message``, ``reason``, ``code``, ``details``), worded as
the real server words them: 401 ``Unauthorized`` (no or wrong bearer token), 404
``NotFound`` (``jobs.batch "x" not found``; creating in a missing namespace:
``namespaces "x" not found``), 409 ``AlreadyExists``, 422 ``Invalid`` (the
object fails validation; ``details.causes`` names each field), 400
``BadRequest`` (a body that is not JSON, a bad selector), 403 ``Forbidden`` from
a deny rule (RBAC wording: ``User "u" cannot create resource "jobs" in API group
"batch" in the namespace "n"``) or from quota admission (``exceeded quota: Q,
requested: ..., used: ..., limited: ...``; ``failed quota: Q: must specify
requests.cpu for: main`` when a quota tracks cpu or memory and a container
names none).

Defaulting and admission as the real server does it, for what the fake runs:
a Job gets ``backoffLimit`` 6, ``completions``/``parallelism`` 1,
``completionMode``, ``suspend``, ``podReplacementPolicy``, a ``selector`` on
``batch.kubernetes.io/controller-uid`` and the four ``job-name`` /
``controller-uid`` labels on its template; a container's limits without requests
become its requests; pods get the default tolerations for ``not-ready`` and
``unreachable``; a pod naming a ServiceAccount that does not exist is refused.
Quota: creating a Job where a quota in the namespace has ``count/jobs.batch`` and
``used + 1 > hard`` is 403; a pod whose requests (``requests.cpu``/``cpu``,
``requests.memory``/``memory``, ``limits.*``, ``requests.<extended>``,
``pods``, ``count/pods``) would pass a quota's ``hard`` is refused the same way
(the Job controller turns that into a ``FailedCreate`` event); Pod Security
admission, where the pod's namespace is labelled
``pod-security.kubernetes.io/enforce`` ``baseline`` or ``restricted``: a pod
that breaks the level's checks is 403 ``pods "p" is forbidden: violates
PodSecurity "restricted:latest": <check> (<what the pod must do>), ...`` in
the admission controller's words (:func:`pod_security_violations`: host
namespaces, privileged, capabilities, hostPath volumes, host ports; and for
``restricted`` volume types, privilege escalation, capabilities ``drop:
[ALL]``, non-root, seccomp profile);
``status.hard``/``status.used`` of every quota are kept current
(:meth:`KubeApi.refresh_quotas`).

Deletion: a pod bound to a node and not finished is deleted gracefully
(``deletionTimestamp`` and ``deletionGracePeriodSeconds`` set; the kubelet
removes it once its process is gone, :meth:`KubeApi.remove`); any other pod, and
every other object, goes at once. ``propagationPolicy`` (query or
``DeleteOptions`` body; the body wins, as on the real server) decides what
happens to dependents: ``Orphan`` removes the owner's ``ownerReferences`` from
them; ``Background`` leaves them to the garbage collector
(:meth:`KubeApi.collect_garbage`: every object whose owners are all gone is
deleted); ``Foreground`` keeps the owner, with ``deletionTimestamp`` and the
``foregroundDeletion`` finalizer, until its dependents are gone. With no policy,
Jobs default to ``Orphan`` (batch/v1 kept that default for compatibility) and
everything else to ``Background``.

Deliberate limits (each answers an explicit error rather than pretending): no
watch, patch, update, ``dryRun``; Jobs must have ``completions`` and
``parallelism`` 1 and ``restartPolicy: Never``. Fault injection:
:meth:`KubeApi.fail` answers matching requests with a given ``Status``.
:attr:`KubeApi.calls` logs ``(method, path, status)`` of every request.

Invariants: every read and write happens under :attr:`KubeApi.lock` (shared
with the controllers); stored objects are never handed out, only deep copies. A
request that raises anything but an API error is a bug of the fake: it is
answered 500 ``InternalError`` and its traceback kept in :attr:`KubeApi.errors`.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import random
import re
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlsplit

__all__ = [
    "RESOURCES",
    "ApiError",
    "Call",
    "KubeApi",
    "LabelRequirement",
    "Resource",
    "format_quantity",
    "labels_match",
    "parse_label_selector",
    "parse_quantity",
    "pod_requests",
]

JsonObject = dict[str, Any]

SERVER_VERSION = {
    "major": "1",
    "minor": "31",
    "gitVersion": "v1.31.0",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2024-08-13T07:28:49Z",
    "goVersion": "go1.22.5",
    "compiler": "gc",
    "platform": "linux/amd64",
}
#: the suffix alphabet the API server uses for ``generateName`` (no vowels, no look-alike digits)
NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
JOB_UID_LABELS = ("batch.kubernetes.io/controller-uid", "controller-uid")
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|)$"
)
_SUFFIXES: dict[str, Fraction] = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}
#: the ResourceQuota keys besides ``count/<resource>[.<group>]`` and ``requests.<extended resource>``
_QUOTA_STANDARD = frozenset(
    {
        "pods",
        "cpu",
        "memory",
        "ephemeral-storage",
        "requests.cpu",
        "requests.memory",
        "requests.ephemeral-storage",
        "limits.cpu",
        "limits.memory",
        "limits.ephemeral-storage",
        "requests.storage",
        "persistentvolumeclaims",
        "services",
        "secrets",
        "configmaps",
        "replicationcontrollers",
        "resourcequotas",
    }
)
_NATIVE_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage", "pods", "storage"})
_FIELD_PATHS = (
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.hostIP",
    "status.podIP",
    "status.podIPs",
)


def now_text() -> str:
    """The current time as the API writes it (RFC 3339, UTC, whole seconds)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def random_suffix(length: int = 5) -> str:
    return "".join(random.choice(NAME_ALPHABET) for _ in range(length))


# --------------------------------------------------------------------------- errors


class ApiError(Exception):
    """An error answer; :meth:`status` is the ``Status`` object the body carries."""

    def __init__(self, code: int, reason: str, message: str, details: JsonObject | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> JsonObject:
        body: JsonObject = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


class Cause(NamedTuple):
    """One field a 422 names: the field's path, the cause's reason (``FieldValueRequired``...), what is wrong."""

    field: str
    reason: str
    message: str


def _details(resource: Resource, name: str) -> JsonObject:
    details: JsonObject = {"name": name, "kind": resource.plural}
    if resource.group:
        details["group"] = resource.group
    return details


def not_found(resource: Resource, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{resource.qualified} "{name}" not found', _details(resource, name))


def already_exists(resource: Resource, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{resource.qualified} "{name}" already exists', _details(resource, name))


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message, {})


def invalid(resource: Resource, name: str, causes: list[Cause]) -> ApiError:
    """422: ``Job.batch "x" is invalid: <field>: <message>`` (several causes in brackets, as the server joins them)."""
    texts = [f"{c.field}: {c.message}" for c in causes]
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    kind = f"{resource.kind}.{resource.group}" if resource.group else resource.kind
    details: JsonObject = {
        "name": name,
        "kind": resource.kind,
        "causes": [{"reason": c.reason, "message": c.message, "field": c.field} for c in causes],
    }
    if resource.group:
        details["group"] = resource.group
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {joined}', details)


def forbidden(resource: Resource, name: str, why: str) -> ApiError:
    return ApiError(403, "Forbidden", f'{resource.qualified} "{name}" is forbidden: {why}', _details(resource, name))


# --------------------------------------------------------------------------- resources


def _meta(name: str) -> Callable[[JsonObject], str]:
    return lambda obj: str((obj.get("metadata") or {}).get(name) or "")


def _path(*keys: str) -> Callable[[JsonObject], str]:
    def get(obj: JsonObject) -> str:
        value: Any = obj
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, bool):
            return "true" if value else "false"
        return "" if value is None else str(value)

    return get


_COMMON_FIELDS: dict[str, Callable[[JsonObject], str]] = {
    "metadata.name": _meta("name"),
    "metadata.namespace": _meta("namespace"),
}


@dataclass(frozen=True)
class Resource:
    """A REST resource: where it lives, what it is called, the verbs and field selectors the fake serves for it."""

    plural: str
    kind: str
    group: str
    version: str
    namespaced: bool
    verbs: frozenset[str]
    fields: Mapping[str, Callable[[JsonObject], str]] = field(default_factory=dict)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """``jobs.batch``, ``pods``: how error messages name the resource."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def field_getter(self, name: str) -> Callable[[JsonObject], str]:
        getter = {**_COMMON_FIELDS, **self.fields}.get(name)
        if getter is None:
            raise bad_request(f"field label not supported: {name}")
        return getter


def _resource(plural: str, kind: str, group: str, namespaced: bool, verbs: str, **fields: Any) -> Resource:
    return Resource(plural, kind, group, "v1", namespaced, frozenset(verbs.split()), fields.get("fields", {}))


RESOURCES: dict[tuple[str, str], Resource] = {
    (r.group, r.plural): r
    for r in (
        _resource(
            "namespaces", "Namespace", "", False, "get list create", fields={"status.phase": _path("status", "phase")}
        ),
        _resource(
            "nodes", "Node", "", False, "get list", fields={"spec.unschedulable": _path("spec", "unschedulable")}
        ),
        _resource(
            "pods",
            "Pod",
            "",
            True,
            "get list delete",
            fields={
                "spec.nodeName": _path("spec", "nodeName"),
                "spec.restartPolicy": _path("spec", "restartPolicy"),
                "spec.schedulerName": _path("spec", "schedulerName"),
                "spec.serviceAccountName": _path("spec", "serviceAccountName"),
                "spec.hostNetwork": lambda o: "true" if (o.get("spec") or {}).get("hostNetwork") else "false",
                "status.phase": _path("status", "phase"),
                "status.podIP": _path("status", "podIP"),
                "status.nominatedNodeName": _path("status", "nominatedNodeName"),
            },
        ),
        _resource("secrets", "Secret", "", True, "get list create delete", fields={"type": _path("type")}),
        _resource("serviceaccounts", "ServiceAccount", "", True, "get list create delete"),
        _resource("resourcequotas", "ResourceQuota", "", True, "get list create delete"),
        _resource(
            "events",
            "Event",
            "",
            True,
            "get list create",
            fields={
                "involvedObject.kind": _path("involvedObject", "kind"),
                "involvedObject.namespace": _path("involvedObject", "namespace"),
                "involvedObject.name": _path("involvedObject", "name"),
                "involvedObject.uid": _path("involvedObject", "uid"),
                "involvedObject.apiVersion": _path("involvedObject", "apiVersion"),
                "involvedObject.resourceVersion": _path("involvedObject", "resourceVersion"),
                "involvedObject.fieldPath": _path("involvedObject", "fieldPath"),
                "reason": _path("reason"),
                "reportingComponent": _path("reportingComponent"),
                "source": _path("source", "component"),
                "type": _path("type"),
            },
        ),
        _resource(
            "jobs",
            "Job",
            "batch",
            True,
            "get list create delete",
            fields={"status.successful": _path("status", "succeeded")},
        ),
        _resource("selfsubjectaccessreviews", "SelfSubjectAccessReview", "authorization.k8s.io", False, "create"),
    )
}
GROUP_VERSIONS = {"batch": "v1", "authorization.k8s.io": "v1"}


def resource(plural: str, group: str = "") -> Resource:
    return RESOURCES[(group, plural)]


# --------------------------------------------------------------------------- quantities


def parse_quantity(text: Any) -> Fraction:
    """A Kubernetes quantity (``"500m"``, ``"4Gi"``, ``"1"``, ``"1e3"``) as an exact number; ValueError if malformed."""
    if isinstance(text, bool) or not isinstance(text, str | int):
        raise ValueError(f"quantity {text!r} must be a string such as '500m' or '4Gi'")
    match = _QUANTITY.match(str(text).strip())
    if match is None:
        raise ValueError(
            f"quantity {text!r} must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        )
    number, suffix = match.groups()
    value = Fraction(number)
    if suffix[:1] in ("e", "E"):
        return value * Fraction(10) ** int(suffix[1:])
    return value * _SUFFIXES[suffix]


def format_quantity(value: Fraction, name: str) -> str:
    """A quantity as the API prints it: cpu in cores or millicores, bytes with the largest exact binary suffix."""
    if name.endswith("cpu"):
        if value.denominator == 1:
            return str(value.numerator)
        millis = -(-value * 1000 // 1)
        return f"{millis}m"
    whole = -(-value // 1)
    if name.endswith(("memory", "storage")) and whole:
        for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
            if whole % _SUFFIXES[suffix] == 0:
                return f"{whole // _SUFFIXES[suffix]}{suffix}"
    return str(whole)


def pod_requests(pod: JsonObject) -> dict[str, Fraction]:
    """What a pod asks the scheduler for: the sum of its containers' requests (limits already defaulted into them)."""
    total: dict[str, Fraction] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        for name, quantity in ((container.get("resources") or {}).get("requests") or {}).items():
            total[name] = total.get(name, Fraction(0)) + parse_quantity(quantity)
    return total


def _pod_limits(pod: JsonObject) -> dict[str, Fraction]:
    total: dict[str, Fraction] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        for name, quantity in ((container.get("resources") or {}).get("limits") or {}).items():
            total[name] = total.get(name, Fraction(0)) + parse_quantity(quantity)
    return total


# --------------------------------------------------------------------------- selectors


class LabelRequirement(NamedTuple):
    """One requirement of a label selector: ``operator`` is In, NotIn, Exists, DoesNotExist, Gt or Lt."""

    key: str
    operator: str
    values: tuple[str, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key, "")
        if self.operator == "In":
            return present and value in self.values
        if self.operator == "NotIn":
            return not present or value not in self.values
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        try:
            number, bound = int(value), int(self.values[0])
        except (ValueError, IndexError):
            return False
        return present and (number > bound if self.operator == "Gt" else number < bound)


def _check_label_key(key: str) -> str | None:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return f"prefix part of {key!r} must be a DNS-1123 subdomain"
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        return (
            f"name part of {key!r} must consist of alphanumeric characters, '-', '_' or '.', and must start and "
            "end with an alphanumeric character (at most 63 characters)"
        )
    return None


def _check_label_value(value: str) -> str | None:
    if value and (len(value) > 63 or not _LABEL_NAME.match(value)):
        return (
            f"{value!r}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' "
            "or '.', and must start and end with an alphanumeric character (at most 63 characters)"
        )
    return None


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


_SET_REQ = re.compile(r"^(\S+?)\s+(in|notin)\s*\((.*)\)$")
_CMP_REQ = re.compile(r"^([^=!<>\s]+)\s*(==|=|!=|<|>)\s*(\S*)$")


def parse_label_selector(text: str) -> list[LabelRequirement]:
    """Parse a label selector as the API server does; :class:`ApiError` 400 when it is malformed."""
    requirements: list[LabelRequirement] = []
    if not text.strip():
        return requirements
    for raw in _split_top_level(text):
        part = raw.strip()
        why: str | None = None
        if not part:
            raise bad_request(f"unable to parse requirement: empty requirement in selector {text!r}")
        if part.startswith("!"):
            key = part[1:].strip()
            why = _check_label_key(key)
            requirement = LabelRequirement(key, "DoesNotExist", ())
        elif match := _SET_REQ.match(part):
            key, op, inner = match.groups()
            values = tuple(v.strip() for v in inner.split(",")) if inner.strip() else ()
            why = _check_label_key(key) or next((w for v in values if (w := _check_label_value(v))), None)
            if not values:
                why = f"for 'in', 'notin' operators, values set can't be empty ({part!r})"
            requirement = LabelRequirement(key, "In" if op == "in" else "NotIn", values)
        elif match := _CMP_REQ.match(part):
            key, op, value = match.groups()
            why = _check_label_key(key)
            if op in ("<", ">"):
                if not re.fullmatch(r"-?[0-9]+", value):
                    why = why or f"for 'Gt', 'Lt' operators, the value must be an integer ({part!r})"
                requirement = LabelRequirement(key, "Gt" if op == ">" else "Lt", (value,))
            else:
                why = why or _check_label_value(value)
                requirement = LabelRequirement(key, "NotIn" if op == "!=" else "In", (value,))
        elif re.fullmatch(r"\S+", part):
            why = _check_label_key(part)
            requirement = LabelRequirement(part, "Exists", ())
        else:
            why = "expected a key, '!key', 'key=value', 'key!=value', 'key in (...)' or 'key notin (...)'"
        if why is not None:
            raise bad_request(f"unable to parse requirement: {part!r}: {why}")
        requirements.append(requirement)
    return requirements


def labels_match(requirements: Iterable[LabelRequirement], labels: Mapping[str, str] | None) -> bool:
    return all(r.matches(labels or {}) for r in requirements)


def _parse_field_selector(text: str, res: Resource) -> list[tuple[Callable[[JsonObject], str], bool, str]]:
    """``field=value`` / ``field==value`` / ``field!=value``, comma is AND; (getter, equal?, value) each."""
    terms: list[tuple[Callable[[JsonObject], str], bool, str]] = []
    if not text.strip():
        return terms
    for raw in re.split(r"(?<!\\),", text):
        part = raw.strip()
        match = re.match(r"^([^=!]+?)\s*(==|=|!=)\s*(.*)$", part)
        if match is None:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        name, op, value = match.groups()
        terms.append((res.field_getter(name.strip()), op != "!=", value.replace("\\,", ",").replace("\\=", "=")))
    return terms


# --------------------------------------------------------------------------- validation helpers


class _Checker:
    """Collects :class:`Cause` entries while validating one object."""

    def __init__(self) -> None:
        self.causes: list[Cause] = []

    def required(self, path: str, detail: str = "") -> None:
        self.causes.append(Cause(path, "FieldValueRequired", "Required value" + (f": {detail}" if detail else "")))

    def bad(self, path: str, value: Any, detail: str) -> None:
        shown = json.dumps(value) if isinstance(value, str | int | float | bool) else repr(value)
        self.causes.append(Cause(path, "FieldValueInvalid", f"Invalid value: {shown}: {detail}"))

    def unsupported(self, path: str, value: Any, allowed: Iterable[str]) -> None:
        choices = ", ".join(f'"{a}"' for a in allowed)
        self.causes.append(
            Cause(path, "FieldValueNotSupported", f'Unsupported value: "{value}": supported values: {choices}')
        )

    def dns_label(self, path: str, value: Any) -> None:
        if not isinstance(value, str) or len(value) > 63 or not _DNS_LABEL.match(value):
            self.bad(
                path,
                value,
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (at most 63 characters)",
            )

    def dns_subdomain(self, path: str, value: Any) -> None:
        if not isinstance(value, str) or len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
            self.bad(
                path,
                value,
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
            )

    def labels(self, path: str, labels: Any) -> None:
        if labels is None:
            return
        if not isinstance(labels, dict):
            self.bad(path, labels, "must be a map of strings")
            return
        for key, value in labels.items():
            if (why := _check_label_key(str(key))) is not None:
                self.bad(path, key, why)
            if not isinstance(value, str) or (why := _check_label_value(value)) is not None:
                self.bad(f"{path}", value, why or "label values must be strings")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --------------------------------------------------------------------------- the API


class Call(NamedTuple):
    """One request as the fake saw it: method, path (no query) and the status it answered."""

    method: str
    path: str
    status: int


@dataclass
class Fault:
    method: str
    path: re.Pattern[str]
    status: int
    reason: str
    message: str
    times: int | None


@dataclass
class _Route:
    res: Resource | None
    namespace: str | None
    name: str | None
    subresource: str | None


class KubeApi:
    """The fake API server's state and request handling; see the module docstring."""

    def __init__(self, *, tokens: Iterable[str], user: str, server_address: Callable[[], str]) -> None:
        self.lock = threading.RLock()
        self.tokens = set(tokens)
        self.user = user
        self._server_address = server_address
        self._objects: dict[tuple[str, str, str], JsonObject] = {}  # (plural, namespace or "", name) -> object
        self._resource_version = 0
        self._denied: set[tuple[str, str, str | None, str | None]] = set()
        self._faults: list[Fault] = []
        self.calls: list[Call] = []
        #: the body of every create that reached the store, per resource plural, in order (for tests to inspect)
        self.created: dict[str, list[JsonObject]] = {}
        #: pod logs kept after the pod's process ended: pod uid -> text
        self.logs: dict[str, str] = {}
        #: live pod logs: pod uid -> a callable returning the text so far (set by the kubelet)
        self.live_logs: dict[str, Callable[[], str]] = {}
        #: job uid -> uids of its pods already counted as succeeded / failed (the job-tracking finalizer's job)
        self.counted: dict[str, dict[str, str]] = {}
        #: tracebacks of requests that raised something other than an API error (answered 500; a bug of the fake)
        self.errors: list[str] = []

    # ------------------------------------------------------------------ configuration (tests)

    def deny(self, verb: str, resource_name: str, namespace: str | None = None, group: str | None = None) -> None:
        with self.lock:
            self._denied.add((verb, resource_name, namespace, group))

    def allow(self, verb: str, resource_name: str, namespace: str | None = None, group: str | None = None) -> None:
        with self.lock:
            self._denied.discard((verb, resource_name, namespace, group))

    def fail(self, method: str, path_regex: str, status: int, reason: str, message: str, times: int | None = 1) -> None:
        with self.lock:
            self._faults.append(Fault(method.upper(), re.compile(path_regex), status, reason, message, times))

    def clear_faults(self) -> None:
        with self.lock:
            self._faults.clear()

    def is_denied(self, verb: str, resource_name: str, namespace: str | None, group: str) -> bool:
        for d_verb, d_resource, d_namespace, d_group in self._denied:
            if d_verb not in (verb, "*") or d_resource not in (resource_name, "*"):
                continue
            if d_namespace is not None and d_namespace != namespace:
                continue
            if d_group is not None and d_group != group:
                continue
            return True
        return False

    # ------------------------------------------------------------------ the store (lock held)

    def bump(self, obj: JsonObject) -> None:
        """Give ``obj`` the next resourceVersion (after any write to it)."""
        self._resource_version += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._resource_version)

    def get(self, plural: str, namespace: str | None, name: str) -> JsonObject | None:
        return self._objects.get((plural, namespace or "", name))

    def items(self, plural: str, namespace: str | None = None) -> list[JsonObject]:
        found = [o for (p, ns, _), o in self._objects.items() if p == plural and (namespace is None or ns == namespace)]
        return sorted(found, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))

    def uids(self) -> set[str]:
        return {o["metadata"]["uid"] for o in self._objects.values()}

    def remove(self, plural: str, namespace: str | None, name: str) -> JsonObject | None:
        """Take an object out of the store for good (the end of a graceful or foreground deletion)."""
        gone = self._objects.pop((plural, namespace or "", name), None)
        if gone is not None:
            self._resource_version += 1
            if plural == "pods":
                self.live_logs.pop(gone["metadata"]["uid"], None)
                self.logs.pop(gone["metadata"]["uid"], None)
            if plural == "jobs":
                self.counted.pop(gone["metadata"]["uid"], None)
        return gone

    def store(self, res: Resource, obj: JsonObject) -> JsonObject:
        """Put a new object in the store: uid, resourceVersion, creationTimestamp, a generated name if asked."""
        meta = obj.setdefault("metadata", {})
        namespace = meta.get("namespace") if res.namespaced else None
        if not meta.get("name") and meta.get("generateName"):
            for _ in range(20):
                candidate = f"{meta['generateName']}{random_suffix()}"
                if self.get(res.plural, namespace, candidate) is None:
                    meta["name"] = candidate
                    break
        if self.get(res.plural, namespace, meta["name"]) is not None:
            raise already_exists(res, meta["name"])
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_text()
        meta.pop("resourceVersion", None)
        self.bump(obj)
        self._objects[(res.plural, namespace or "", meta["name"])] = obj
        return obj

    # ------------------------------------------------------------------ namespaces, nodes, events (lock held)

    def ensure_namespace(self, name: str) -> None:
        if self.get("namespaces", None, name) is None:
            self.store(resource("namespaces"), self._namespace_object(name))
            self._default_service_account(name)

    def _namespace_object(self, name: str) -> JsonObject:
        return {
            "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        }

    def _default_service_account(self, namespace: str) -> None:
        if self.get("serviceaccounts", namespace, "default") is None:
            self.store(resource("serviceaccounts"), {"metadata": {"name": "default", "namespace": namespace}})

    def record_event(
        self,
        involved: JsonObject,
        kind: str,
        event_type: str,
        reason: str,
        message: str,
        component: str,
        host: str | None = None,
        repeat_after_s: float = 0.0,
    ) -> JsonObject:
        """Write an event about ``involved``; the same (object, reason, message) again bumps ``count`` instead.

        A repeat sooner than ``repeat_after_s`` after the last one leaves the event as it is (no flood).
        """
        meta = involved["metadata"]
        namespace = meta.get("namespace") or "default"
        for event in self.items("events", namespace):
            if (
                event["involvedObject"].get("uid") == meta["uid"]
                and event.get("reason") == reason
                and event.get("message") == message
            ):
                last = datetime.strptime(event["lastTimestamp"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
                if time.time() - last >= repeat_after_s:
                    event["count"] = int(event.get("count") or 1) + 1
                    event["lastTimestamp"] = now_text()
                    self.bump(event)
                return event
        res = resource("jobs", "batch") if kind == "Job" else resource("pods")
        stamp = now_text()
        source: JsonObject = {"component": component}
        if host:
            source["host"] = host
        stamp_ns = time.time_ns()
        while self.get("events", namespace, f"{meta['name']}.{stamp_ns:x}") is not None:
            stamp_ns += 1
        event = {
            "metadata": {"name": f"{meta['name']}.{stamp_ns:x}", "namespace": namespace},
            "involvedObject": {
                "kind": kind,
                "namespace": namespace,
                "name": meta["name"],
                "uid": meta["uid"],
                "apiVersion": res.api_version,
                "resourceVersion": meta.get("resourceVersion", ""),
            },
            "reason": reason,
            "message": message,
            "source": source,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "type": event_type,
            "eventTime": None,
            "reportingComponent": component,
            "reportingInstance": host or "",
        }
        return self.store(resource("events"), event)

    # ------------------------------------------------------------------ quota (lock held)

    def _quota_usage(self, namespace: str) -> dict[str, Fraction]:
        """What the namespace holds, under every key a quota may name."""
        usage: dict[str, Fraction] = {
            "count/jobs.batch": Fraction(len(self.items("jobs", namespace))),
            "count/secrets": Fraction(len(self.items("secrets", namespace))),
            "secrets": Fraction(len(self.items("secrets", namespace))),
            "count/serviceaccounts": Fraction(len(self.items("serviceaccounts", namespace))),
            "count/resourcequotas": Fraction(len(self.items("resourcequotas", namespace))),
            "resourcequotas": Fraction(len(self.items("resourcequotas", namespace))),
        }
        for pod in self.items("pods", namespace):
            if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
                continue
            for key, amount in _pod_usage(pod).items():
                usage[key] = usage.get(key, Fraction(0)) + amount
        return usage

    def refresh_quotas(self, namespace: str | None = None) -> None:
        """Bring every quota's ``status.hard`` and ``status.used`` up to date (the quota controller's job)."""
        for quota in self.items("resourcequotas", namespace):
            hard = dict((quota.get("spec") or {}).get("hard") or {})
            usage = self._quota_usage(quota["metadata"]["namespace"])
            used = {key: format_quantity(usage.get(key, Fraction(0)), key) for key in hard}
            status = {"hard": hard, "used": used}
            if quota.get("status") != status:
                quota["status"] = status
                self.bump(quota)

    def admit_quota(
        self,
        res: Resource,
        namespace: str,
        name: str,
        requested: Mapping[str, Fraction],
        requested_pod: JsonObject | None = None,
    ) -> None:
        """Refuse (403) what would take any quota of the namespace past its ``hard`` limits."""
        usage = self._quota_usage(namespace)
        for quota in self.items("resourcequotas", namespace):
            hard = {k: parse_quantity(v) for k, v in ((quota.get("spec") or {}).get("hard") or {}).items()}
            if res.plural == "pods":
                missing = _missing_compute(requested_pod, hard) if requested_pod is not None else ""
                if missing:
                    raise forbidden(res, name, f"failed quota: {quota['metadata']['name']}: must specify {missing}")
            exceeded = sorted(k for k, amount in requested.items() if k in hard and usage.get(k, 0) + amount > hard[k])
            if exceeded:

                def show(values: Mapping[str, Fraction], keys: list[str] = exceeded) -> str:
                    return ",".join(f"{k}={format_quantity(values.get(k, Fraction(0)), k)}" for k in keys)

                raise forbidden(
                    res,
                    name,
                    f"exceeded quota: {quota['metadata']['name']}, requested: {show(requested)}, "
                    f"used: {show(usage)}, limited: {show(hard)}",
                )

    # ------------------------------------------------------------------ create (lock held)

    def create(self, res: Resource, namespace: str | None, body: Any) -> JsonObject:
        """Validate, default, admit and store a new object; the stored object (not a copy)."""
        if not isinstance(body, dict):
            raise bad_request(f"the body of a {res.kind} create must be a JSON object")
        obj = copy.deepcopy(body)
        if obj.get("kind") not in (None, res.kind):
            raise bad_request(
                f"the body's kind {obj['kind']!r} does not match the resource {res.qualified} ({res.kind})"
            )
        if obj.get("apiVersion") not in (None, res.api_version):
            raise bad_request(f"the body's apiVersion {obj['apiVersion']!r} does not match {res.api_version}")
        obj.pop("kind", None)
        obj.pop("apiVersion", None)
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            meta = obj["metadata"] = {}
        name = meta.get("name") or ""
        if res.namespaced:
            if meta.get("namespace") not in (None, "", namespace):
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
            if namespace is None or self.get("namespaces", None, namespace) is None:
                raise not_found(resource("namespaces"), namespace or "")
        else:
            meta.pop("namespace", None)
        check = _Checker()
        if not name and not meta.get("generateName"):
            check.required("metadata.name", "name or generateName is required")
        elif name:
            (check.dns_label if res.plural in ("namespaces", "jobs") else check.dns_subdomain)("metadata.name", name)
        check.labels("metadata.labels", meta.get("labels"))
        for key in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(key, None)
        validate = getattr(self, f"_validate_{res.plural}", None)
        if validate is not None:
            validate(obj, check)
        if check.causes:
            raise invalid(res, name or str(meta.get("generateName") or ""), check.causes)
        if name and self.get(res.plural, namespace if res.namespaced else None, name) is not None:
            raise already_exists(res, name)
        if res.plural == "jobs":
            self.admit_quota(res, namespace or "", name, {"count/jobs.batch": Fraction(1)})
        elif res.plural == "secrets":
            self.admit_quota(res, namespace or "", name, {"count/secrets": Fraction(1), "secrets": Fraction(1)})
        stored = self.store(res, obj)
        if res.plural == "jobs":
            _default_job_after_uid(stored)
        elif res.plural == "namespaces":
            self._default_service_account(stored["metadata"]["name"])
        if res.plural in ("jobs", "secrets", "pods", "resourcequotas"):
            self.refresh_quotas(stored["metadata"]["namespace"])
        self.created.setdefault(res.plural, []).append(copy.deepcopy(body))
        return stored

    def create_pod(self, pod: JsonObject) -> JsonObject:
        """A pod from a controller: validated, defaulted, admitted (Pod Security, ServiceAccount, quota), stored."""
        res = resource("pods")
        meta = pod["metadata"]
        check = _Checker()
        _validate_pod_spec(pod.get("spec"), "spec", check)
        if check.causes:
            raise invalid(res, meta["name"], check.causes)
        _default_pod(pod)
        namespace = meta["namespace"]
        labels = ((self.get("namespaces", None, namespace) or {}).get("metadata") or {}).get("labels") or {}
        level = labels.get(POD_SECURITY_ENFORCE)
        if level in ("baseline", "restricted"):
            violations = pod_security_violations(pod, level)
            if violations:
                raise forbidden(res, meta["name"], f'violates PodSecurity "{level}:latest": ' + ", ".join(violations))
        account = pod["spec"]["serviceAccountName"]
        if self.get("serviceaccounts", namespace, account) is None:
            raise forbidden(
                res,
                meta["name"],
                f'error looking up service account {namespace}/{account}: serviceaccount "{account}" not found',
            )
        self.admit_quota(res, namespace, meta["name"], _pod_usage(pod), pod)
        stored = self.store(res, pod)
        self.refresh_quotas(namespace)
        return stored

    def _validate_namespaces(self, obj: JsonObject, check: _Checker) -> None:
        obj.setdefault("metadata", {}).setdefault("labels", {})["kubernetes.io/metadata.name"] = obj["metadata"].get(
            "name", ""
        )
        obj["spec"] = {"finalizers": ["kubernetes"]}
        obj["status"] = {"phase": "Active"}

    def _validate_secrets(self, obj: JsonObject, check: _Checker) -> None:
        data = obj.get("data") or {}
        if not isinstance(data, dict):
            check.bad("data", data, "must be a map of keys to base64 strings")
            return
        for key, value in data.items():
            if not _SECRET_KEY.match(key):
                check.bad(
                    f"data[{key}]", key, "a valid config key must consist of alphanumeric characters, '-', '_' or '.'"
                )
            try:
                base64.b64decode(str(value), validate=True)
            except (binascii.Error, ValueError):
                check.bad(f"data[{key}]", "<secret contents redacted>", "must be base64-encoded")
        string_data = obj.pop("stringData", None) or {}
        for key, value in string_data.items():
            if not _SECRET_KEY.match(key):
                check.bad(
                    f"stringData[{key}]",
                    key,
                    "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
                )
            data[key] = base64.b64encode(str(value).encode()).decode()
        obj["data"] = data
        obj.setdefault("type", "Opaque")

    def _validate_resourcequotas(self, obj: JsonObject, check: _Checker) -> None:
        hard = (obj.get("spec") or {}).get("hard") or {}
        if not isinstance(hard, dict):
            check.bad("spec.hard", hard, "must be a map of resource names to quantities")
            return
        for key, value in hard.items():
            path = f"spec.hard[{key}]"
            standard = key in _QUOTA_STANDARD or key.startswith("count/")
            extended = (
                key.startswith("requests.") and "/" in key and key.removeprefix("requests.") not in _NATIVE_RESOURCES
            )
            if not (standard or extended):
                check.bad(path, key, "must be a standard resource for quota")
            try:
                if parse_quantity(value) < 0:
                    check.bad(path, value, "must be greater than or equal to 0")
            except ValueError as exc:
                check.bad(path, value, str(exc))
        obj.pop("status", None)

    def _validate_events(self, obj: JsonObject, check: _Checker) -> None:
        involved = obj.get("involvedObject")
        if not isinstance(involved, dict):
            check.required("involvedObject")
        elif involved.get("namespace") not in (None, "", obj["metadata"].get("namespace")):
            check.bad("involvedObject.namespace", involved.get("namespace"), "does not match event.namespace")
        if obj.get("type") not in (None, "Normal", "Warning"):
            check.unsupported("type", obj.get("type"), ("Normal", "Warning"))
        stamp = now_text()
        obj.setdefault("firstTimestamp", stamp)
        obj.setdefault("lastTimestamp", stamp)
        obj.setdefault("count", 1)

    def _validate_serviceaccounts(self, obj: JsonObject, check: _Checker) -> None:
        return None

    def _validate_jobs(self, obj: JsonObject, check: _Checker) -> None:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            check.required("spec")
            return
        for key in ("completions", "parallelism"):
            value = spec.setdefault(key, 1)
            if value != 1:
                check.bad(f"spec.{key}", value, "the fake cluster runs Jobs of exactly one pod (1)")
        backoff = spec.setdefault("backoffLimit", 6)
        if not _is_int(backoff) or backoff < 0:
            check.bad("spec.backoffLimit", backoff, "must be greater than or equal to 0")
        for key in ("activeDeadlineSeconds", "ttlSecondsAfterFinished"):
            value = spec.get(key)
            if value is not None and (not _is_int(value) or value < (1 if key == "activeDeadlineSeconds" else 0)):
                check.bad(
                    f"spec.{key}",
                    value,
                    "must be a non-negative integer" if key.startswith("ttl") else "must be greater than 0",
                )
        if spec.get("manualSelector"):
            check.bad("spec.manualSelector", True, "the fake cluster only generates selectors")
        spec.setdefault("completionMode", "NonIndexed")
        spec.setdefault("suspend", False)
        spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
        spec.setdefault("manualSelector", None)
        if spec.get("manualSelector") is None:
            spec.pop("manualSelector")
        template = spec.get("template")
        if not isinstance(template, dict):
            check.required("spec.template")
            return
        _validate_pod_spec(template.get("spec"), "spec.template.spec", check)
        restart = (template.get("spec") or {}).get("restartPolicy")
        if restart is None:
            check.required("spec.template.spec.restartPolicy", 'valid values: "OnFailure", "Never"')
        elif restart == "OnFailure":
            check.bad(
                "spec.template.spec.restartPolicy",
                restart,
                "the fake kubelet runs Jobs' pods with restartPolicy Never only",
            )
        elif restart != "Never":
            check.unsupported("spec.template.spec.restartPolicy", restart, ("OnFailure", "Never"))
        obj["status"] = {}

    # ------------------------------------------------------------------ delete (lock held)

    def delete(self, res: Resource, namespace: str | None, name: str, options: Mapping[str, Any]) -> JsonObject:
        """Delete as the real server would (see the module docstring); the object as it was last stored."""
        obj = self.get(res.plural, namespace, name)
        if obj is None:
            raise not_found(res, name)
        policy = options.get("propagationPolicy")
        if policy is None and options.get("orphanDependents") is not None:
            policy = "Orphan" if options["orphanDependents"] else "Background"
        if policy is None:
            policy = "Orphan" if res.plural == "jobs" else "Background"
        if policy not in ("Orphan", "Background", "Foreground"):
            raise bad_request(f'propagationPolicy "{policy}" is not one of Orphan, Background, Foreground')
        meta = obj["metadata"]
        uid = meta["uid"]
        if policy == "Orphan":
            for other in self._objects.values():
                refs = other["metadata"].get("ownerReferences") or []
                kept = [r for r in refs if r.get("uid") != uid]
                if len(kept) != len(refs):
                    if kept:
                        other["metadata"]["ownerReferences"] = kept
                    else:
                        other["metadata"].pop("ownerReferences")
                    self.bump(other)
        if res.plural == "pods":
            return self._delete_pod(obj, options)
        if policy == "Foreground" and self._dependents(uid):
            if not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = now_text()
                meta["deletionGracePeriodSeconds"] = 0
                meta["finalizers"] = [*meta.get("finalizers", []), "foregroundDeletion"]
                self.bump(obj)
            return copy.deepcopy(obj)
        self.remove(res.plural, namespace, name)
        if res.plural in ("jobs", "secrets", "resourcequotas"):
            self.refresh_quotas(namespace)
        return copy.deepcopy(obj)

    def _delete_pod(self, pod: JsonObject, options: Mapping[str, Any]) -> JsonObject:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        grace = options.get("gracePeriodSeconds")
        if grace is None:
            grace = spec.get("terminationGracePeriodSeconds", 30)
        running = spec.get("nodeName") and (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES
        if not running or int(grace) <= 0:
            self.remove("pods", meta["namespace"], meta["name"])
            self.refresh_quotas(meta["namespace"])
            return copy.deepcopy(pod)
        if not meta.get("deletionTimestamp"):
            meta["deletionTimestamp"] = now_text()
            meta["deletionGracePeriodSeconds"] = int(grace)
            self.bump(pod)
        return copy.deepcopy(pod)

    def _dependents(self, uid: str) -> list[tuple[str, JsonObject]]:
        return [
            (plural, o)
            for (plural, _, _), o in self._objects.items()
            if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])
        ]

    def collect_garbage(self) -> None:
        """The garbage collector's pass: delete every object whose owners are all gone; finish foreground deletions."""
        uids = self.uids()
        for (plural, namespace, name), obj in list(self._objects.items()):
            refs = obj["metadata"].get("ownerReferences") or []
            orphaned = refs and not any(r.get("uid") in uids for r in refs)
            if orphaned and self.get(plural, namespace, name) is obj and not obj["metadata"].get("deletionTimestamp"):
                self.delete(
                    RESOURCES[(_group_of(plural), plural)], namespace or None, name, {"propagationPolicy": "Background"}
                )
        for (plural, namespace, name), obj in list(self._objects.items()):
            meta = obj["metadata"]
            if "foregroundDeletion" in (meta.get("finalizers") or []):
                dependents = self._dependents(meta["uid"])
                for dep_plural, dependent in dependents:
                    dep_meta = dependent["metadata"]
                    if not dep_meta.get("deletionTimestamp"):
                        self.delete(
                            RESOURCES[(_group_of(dep_plural), dep_plural)],
                            dep_meta.get("namespace"),
                            dep_meta["name"],
                            {"propagationPolicy": "Background"},
                        )
                if not self._dependents(meta["uid"]):
                    self.remove(plural, namespace or None, name)
                    self.refresh_quotas(namespace or None)

    # ------------------------------------------------------------------ HTTP

    def handle(self, method: str, target: str, authorization: str | None, raw_body: bytes) -> tuple[int, str, bytes]:
        """One request: (status, content type, body)."""
        split = urlsplit(target)
        path = split.path.rstrip("/") or "/"
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        with self.lock:
            try:
                status, content_type, answer = self._answer(method, path, query, authorization, raw_body)
            except ApiError as error:
                status, content_type, answer = error.code, "application/json", error.status()
            except Exception as exc:
                self.errors.append(traceback.format_exc())
                failure = ApiError(500, "InternalError", f"the fake API server failed: {exc!r}", {})
                status, content_type, answer = 500, "application/json", failure.status()
            self.calls.append(Call(method, path, status))
        payload = answer.encode() if isinstance(answer, str) else json.dumps(answer).encode()
        return status, content_type, payload

    def _answer(
        self, method: str, path: str, query: dict[str, str], authorization: str | None, raw_body: bytes
    ) -> tuple[int, str, Any]:
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or token.strip() not in self.tokens:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        for fault in self._faults:
            if fault.method in (method, "*") and fault.path.search(path):
                if fault.times is not None:
                    fault.times -= 1
                    if fault.times <= 0:
                        self._faults.remove(fault)
                raise ApiError(fault.status, fault.reason, fault.message, {})
        discovery = self._discovery(method, path)
        if discovery is not None:
            return 200, "application/json", discovery
        route = self._route(path)
        if "watch" in query and query["watch"] not in ("", "false", "0"):
            raise ApiError(
                405, "MethodNotAllowed", "the fake API server does not serve watch; poll with list instead", {}
            )
        if "dryRun" in query:
            raise bad_request("the fake API server does not emulate dryRun")
        res = route.res
        assert res is not None
        if route.subresource is not None:
            if res.plural == "pods" and route.subresource == "log" and method == "GET":
                self._authorize("get", res, route.namespace, route.name, "log")
                return 200, "text/plain", self._pod_log(route.namespace or "", route.name or "", query)
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        verb = {
            ("GET", False): "list",
            ("GET", True): "get",
            ("POST", False): "create",
            ("DELETE", True): "delete",
            ("DELETE", False): "deletecollection",
            ("PUT", True): "update",
            ("PATCH", True): "patch",
        }.get((method, route.name is not None))
        if verb is None or verb not in res.verbs:
            raise ApiError(
                405, "MethodNotAllowed", "the server does not allow this method on the requested resource", {}
            )
        body = self._json_body(raw_body) if raw_body.strip() else None
        self._authorize(verb, res, route.namespace, route.name or _body_name(body))
        if res.plural == "selfsubjectaccessreviews":
            return 201, "application/json", self._access_review(body)
        if verb == "list":
            return 200, "application/json", self._list(res, route.namespace, query)
        if verb == "get":
            obj = self.get(res.plural, route.namespace, route.name or "")
            if obj is None:
                raise not_found(res, route.name or "")
            return 200, "application/json", self._view(res, obj)
        if verb == "create":
            return 201, "application/json", self._view(res, self.create(res, route.namespace, body))
        options: dict[str, Any] = {}
        for key in ("propagationPolicy", "gracePeriodSeconds", "orphanDependents"):
            if key in query:
                value = query[key]
                options[key] = (
                    int(value)
                    if key == "gracePeriodSeconds"
                    else value == "true"
                    if key == "orphanDependents"
                    else value
                )
        if isinstance(body, dict):
            options.update(
                {
                    k: v
                    for k, v in body.items()
                    if k in ("propagationPolicy", "gracePeriodSeconds", "orphanDependents") and v is not None
                }
            )
        return 200, "application/json", self._view(res, self.delete(res, route.namespace, route.name or "", options))

    def _json_body(self, raw: bytes) -> Any:
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise bad_request(f"the body is not JSON: {exc}") from None

    def _authorize(self, verb: str, res: Resource, namespace: str | None, name: str | None, sub: str = "") -> None:
        target = f"{res.plural}/{sub}" if sub else res.plural
        if not self.is_denied(verb, target, namespace, res.group):
            return
        where = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
        message = f'User "{self.user}" cannot {verb} resource "{target}" in API group "{res.group}" {where}'
        subject = f'{res.qualified} "{name}"' if name else res.qualified
        details: JsonObject = {"kind": res.plural}
        if name:
            details["name"] = name
        if res.group:
            details["group"] = res.group
        raise ApiError(403, "Forbidden", f"{subject} is forbidden: {message}", details)

    def _view(self, res: Resource, obj: JsonObject) -> JsonObject:
        return {"kind": res.kind, "apiVersion": res.api_version, **copy.deepcopy(obj)}

    def _list(self, res: Resource, namespace: str | None, query: Mapping[str, str]) -> JsonObject:
        if res.namespaced and namespace is not None and self.get("namespaces", None, namespace) is None:
            found: list[JsonObject] = []
        else:
            found = self.items(res.plural, namespace if res.namespaced else None)
        labels = parse_label_selector(query.get("labelSelector", ""))
        fields = _parse_field_selector(query.get("fieldSelector", ""), res)
        found = [
            o
            for o in found
            if labels_match(labels, o["metadata"].get("labels"))
            and all((get(o) == value) == equal for get, equal, value in fields)
        ]
        meta: JsonObject = {"resourceVersion": str(self._resource_version)}
        after = query.get("continue")
        if after:
            try:
                position = json.loads(base64.urlsafe_b64decode(after.encode()))
                key = (position["namespace"], position["name"])
            except (ValueError, KeyError, TypeError, binascii.Error):
                raise ApiError(410, "Expired", "the provided continue parameter is not valid", {}) from None
            found = [o for o in found if (o["metadata"].get("namespace", ""), o["metadata"]["name"]) > key]
        limit = int(query.get("limit") or 0)
        if limit > 0 and len(found) > limit:
            last = found[limit - 1]["metadata"]
            token = {"namespace": last.get("namespace", ""), "name": last["name"]}
            meta["continue"] = base64.urlsafe_b64encode(json.dumps(token).encode()).decode()
            meta["remainingItemCount"] = len(found) - limit
            found = found[:limit]
        return {
            "kind": f"{res.kind}List",
            "apiVersion": res.api_version,
            "metadata": meta,
            "items": copy.deepcopy(found),
        }

    def _pod_log(self, namespace: str, name: str, query: Mapping[str, str]) -> str:
        pod = self.get("pods", namespace, name)
        if pod is None:
            raise not_found(resource("pods"), name)
        uid = pod["metadata"]["uid"]
        if uid in self.live_logs:
            text = self.live_logs[uid]()
        elif uid in self.logs:
            text = self.logs[uid]
        else:
            container = (pod["spec"]["containers"] or [{}])[0].get("name", "")
            statuses = (pod.get("status") or {}).get("containerStatuses") or []
            waiting = ((statuses[0].get("state") or {}).get("waiting") or {}) if statuses else {}
            reason = waiting.get("reason") or "ContainerCreating"
            raise bad_request(f'container "{container}" in pod "{name}" is waiting to start: {reason}')
        tail = query.get("tailLines")
        if tail:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-int(tail) :]) if int(tail) > 0 else ""
        return text

    def _access_review(self, body: Any) -> JsonObject:
        spec = body.get("spec") if isinstance(body, dict) else None
        if not isinstance(spec, dict) or not (spec.get("resourceAttributes") or spec.get("nonResourceAttributes")):
            res = resource("selfsubjectaccessreviews", "authorization.k8s.io")
            raise invalid(
                res,
                "",
                [
                    Cause(
                        "spec.resourceAttributes",
                        "FieldValueRequired",
                        "Required value: exactly one of nonResourceAttributes or resourceAttributes must be specified",
                    )
                ],
            )
        attrs = spec.get("resourceAttributes") or {}
        verb, target = attrs.get("verb", ""), attrs.get("resource", "")
        if attrs.get("subresource"):
            target = f"{target}/{attrs['subresource']}"
        denied = bool(attrs) and self.is_denied(verb, target, attrs.get("namespace") or None, attrs.get("group", ""))
        status: JsonObject = {"allowed": not denied}
        if denied:
            status["reason"] = f'the fake cluster denies {verb} on "{target}" to User "{self.user}"'
        else:
            status["reason"] = f'the fake cluster allows User "{self.user}" everything not denied'
        return {
            "kind": "SelfSubjectAccessReview",
            "apiVersion": "authorization.k8s.io/v1",
            "metadata": {"creationTimestamp": None},
            "spec": copy.deepcopy(spec),
            "status": status,
        }

    def _discovery(self, method: str, path: str) -> JsonObject | None:
        if method != "GET":
            return None
        if path == "/version":
            return dict(SERVER_VERSION)
        if path in ("/healthz", "/livez", "/readyz"):
            return {"status": "ok"}
        if path == "/api":
            return {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": self._server_address()}],
            }
        if path == "/apis":
            return {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [
                    {
                        "name": group,
                        "versions": [{"groupVersion": f"{group}/{version}", "version": version}],
                        "preferredVersion": {"groupVersion": f"{group}/{version}", "version": version},
                    }
                    for group, version in GROUP_VERSIONS.items()
                ],
            }
        for group, version in (("", "v1"), *GROUP_VERSIONS.items()):
            prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
            if path == prefix:
                return {
                    "kind": "APIResourceList",
                    "apiVersion": "v1",
                    "groupVersion": f"{group}/{version}" if group else version,
                    "resources": [
                        {
                            "name": r.plural,
                            "singularName": r.kind.lower(),
                            "namespaced": r.namespaced,
                            "kind": r.kind,
                            "verbs": sorted(r.verbs),
                        }
                        for (g, _), r in RESOURCES.items()
                        if g == group
                    ],
                }
        return None

    def _route(self, path: str) -> _Route:
        parts = path.strip("/").split("/")
        unknown = ApiError(404, "NotFound", "the server could not find the requested resource", {})
        if parts[:2] == ["api", "v1"]:
            group, rest = "", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis" and GROUP_VERSIONS.get(parts[1]) == parts[2]:
            group, rest = parts[1], parts[3:]
        else:
            raise unknown
        if not rest:
            raise unknown
        if rest[0] == "namespaces" and len(rest) >= 3:
            res = RESOURCES.get((group, rest[2]))
            if res is None or not res.namespaced or len(rest) > 5:
                raise unknown
            return _Route(res, rest[1], rest[3] if len(rest) > 3 else None, rest[4] if len(rest) > 4 else None)
        res = RESOURCES.get((group, rest[0]))
        if res is None or len(rest) > 3:
            raise unknown
        if res.namespaced:
            if len(rest) > 1:
                raise unknown
            return _Route(res, None, None, None)
        return _Route(res, None, rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None)


def _group_of(plural: str) -> str:
    return next(g for (g, p) in RESOURCES if p == plural)


def _body_name(body: Any) -> str | None:
    if isinstance(body, dict) and isinstance(body.get("metadata"), dict):
        name = body["metadata"].get("name")
        return name if isinstance(name, str) and name else None
    return None


# --------------------------------------------------------------------------- pods: validation, defaulting, usage


def _validate_pod_spec(spec: Any, at: str, check: _Checker) -> None:
    if not isinstance(spec, dict):
        check.required(at)
        return
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        check.required(f"{at}.containers")
        containers = []
    names: set[str] = set()
    volumes = {v.get("name") for v in spec.get("volumes") or [] if isinstance(v, dict)}
    for i, container in enumerate(containers):
        path = f"{at}.containers[{i}]"
        if not isinstance(container, dict):
            check.bad(path, container, "must be a container object")
            continue
        if not container.get("name"):
            check.required(f"{path}.name")
        else:
            check.dns_label(f"{path}.name", container["name"])
            if container["name"] in names:
                check.causes.append(
                    Cause(f"{path}.name", "FieldValueDuplicate", f'Duplicate value: "{container["name"]}"')
                )
            names.add(container["name"])
        if not container.get("image"):
            check.required(f"{path}.image")
        for key in ("command", "args"):
            value = container.get(key)
            if value is not None and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
                check.bad(f"{path}.{key}", value, "must be a list of strings")
        for j, env in enumerate(container.get("env") or []):
            _validate_env(env, f"{path}.env[{j}]", check)
        for j, mount in enumerate(container.get("volumeMounts") or []):
            if not isinstance(mount, dict) or mount.get("name") not in volumes:
                check.causes.append(
                    Cause(
                        f"{path}.volumeMounts[{j}].name",
                        "FieldValueNotFound",
                        f'Not found: "{(mount or {}).get("name")}"',
                    )
                )
            elif not str(mount.get("mountPath") or "").startswith("/"):
                check.required(f"{path}.volumeMounts[{j}].mountPath", "an absolute path")
        _validate_resources(container.get("resources") or {}, f"{path}.resources", check)
    for i, toleration in enumerate(spec.get("tolerations") or []):
        _validate_toleration(toleration, f"{at}.tolerations[{i}]", check)
    selector = spec.get("nodeSelector")
    if selector is not None:
        check.labels(f"{at}.nodeSelector", selector)
    grace = spec.get("terminationGracePeriodSeconds")
    if grace is not None and (not _is_int(grace) or grace < 0):
        check.bad(f"{at}.terminationGracePeriodSeconds", grace, "must be a non-negative integer")
    account = spec.get("serviceAccountName")
    if account is not None:
        check.dns_subdomain(f"{at}.serviceAccountName", account)


def _validate_env(env: Any, path: str, check: _Checker) -> None:
    if not isinstance(env, dict) or not env.get("name"):
        check.required(f"{path}.name")
        return
    if "=" in env["name"]:
        check.bad(f"{path}.name", env["name"], "a valid environment variable name must not contain '='")
    source = env.get("valueFrom")
    if source is None:
        return
    if env.get("value"):
        check.bad(f"{path}.valueFrom", "", "may not be specified when `value` is not empty")
    kinds = [k for k in ("fieldRef", "secretKeyRef", "configMapKeyRef", "resourceFieldRef") if source.get(k)]
    if len(kinds) != 1:
        check.bad(
            f"{path}.valueFrom",
            "",
            "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`",
        )
        return
    if kinds[0] == "secretKeyRef":
        ref = source["secretKeyRef"]
        if not ref.get("name"):
            check.required(f"{path}.valueFrom.secretKeyRef.name")
        if not ref.get("key"):
            check.required(f"{path}.valueFrom.secretKeyRef.key")
    elif kinds[0] == "fieldRef":
        field_path = source["fieldRef"].get("fieldPath", "")
        if field_path not in _FIELD_PATHS and not re.fullmatch(
            r"metadata\.(labels|annotations)\['[^']+'\]", field_path
        ):
            check.unsupported(f"{path}.valueFrom.fieldRef.fieldPath", field_path, _FIELD_PATHS)


def _validate_resources(resources: Any, path: str, check: _Checker) -> None:
    if not isinstance(resources, dict):
        check.bad(path, resources, "must be an object with requests and limits")
        return
    parsed: dict[str, dict[str, Fraction]] = {"requests": {}, "limits": {}}
    for which in ("requests", "limits"):
        for name, value in (resources.get(which) or {}).items():
            try:
                amount = parse_quantity(value)
            except ValueError as exc:
                check.bad(f"{path}.{which}[{name}]", value, str(exc))
                continue
            if amount < 0:
                check.bad(f"{path}.{which}[{name}]", value, "must be greater than or equal to 0")
            if name not in _NATIVE_RESOURCES and "/" in name and amount.denominator != 1:
                check.bad(f"{path}.{which}[{name}]", value, "must be an integer")
            parsed[which][name] = amount
    for name, request in parsed["requests"].items():
        limit = parsed["limits"].get(name)
        extended = name not in _NATIVE_RESOURCES and "/" in name
        if extended and limit is None:
            check.required(f"{path}.limits", f"Limit must be set for non overcommitable resources ({name})")
        elif extended and limit is not None and limit != request:
            check.bad(
                f"{path}.requests",
                resources["requests"][name],
                f"must be equal to {name} limit of {resources['limits'][name]}",
            )
        elif limit is not None and request > limit:
            check.bad(
                f"{path}.requests",
                resources["requests"][name],
                f"must be less than or equal to {name} limit of {resources['limits'][name]}",
            )


def _validate_toleration(toleration: Any, path: str, check: _Checker) -> None:
    if not isinstance(toleration, dict):
        check.bad(path, toleration, "must be a toleration object")
        return
    operator = toleration.get("operator") or "Equal"
    if operator not in ("Equal", "Exists"):
        check.unsupported(f"{path}.operator", operator, ("Equal", "Exists"))
    if not toleration.get("key") and operator != "Exists":
        check.bad(
            f"{path}.operator",
            operator,
            'operator must be Exists when `key` is empty, which means "match all values and all keys"',
        )
    if operator == "Exists" and toleration.get("value"):
        check.bad(f"{path}.operator", toleration.get("value"), "value must be empty when `operator` is 'Exists'")
    effect = toleration.get("effect") or ""
    if effect not in ("", "NoSchedule", "PreferNoSchedule", "NoExecute"):
        check.unsupported(f"{path}.effect", effect, ("NoSchedule", "PreferNoSchedule", "NoExecute"))
    if toleration.get("tolerationSeconds") is not None and effect != "NoExecute":
        check.bad(f"{path}.effect", effect, "effect must be 'NoExecute' when `tolerationSeconds` is set")


#: the namespace label Pod Security admission enforces a level by
POD_SECURITY_ENFORCE = "pod-security.kubernetes.io/enforce"
#: capabilities the baseline level lets a container add (the container runtime's default set)
_BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
_RESTRICTED_VOLUMES = frozenset(
    {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
)


def pod_security_violations(pod: JsonObject, level: str) -> list[str]:
    """What Pod Security admission at ``level`` (``baseline`` or ``restricted``) says a pod breaks, in its words."""
    spec = pod.get("spec") or {}
    pod_context = spec.get("securityContext") or {}
    containers = [c for key in ("initContainers", "containers") for c in spec.get(key) or []]
    found: list[str] = []
    shared = [f"{f}=true" for f in ("hostNetwork", "hostPID", "hostIPC") if spec.get(f)]
    if shared:
        found.append(f"host namespaces ({', '.join(shared)})")
    privileged = [c["name"] for c in containers if (c.get("securityContext") or {}).get("privileged")]
    if privileged:
        found.append(f"privileged ({_containers(privileged)} must not set securityContext.privileged=true)")
    added = sorted(
        {
            cap
            for c in containers
            for cap in ((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or []
            if cap not in _BASELINE_CAPABILITIES
        }
    )
    if added:
        found.append(f"non-default capabilities (containers must not include {', '.join(added)} in add)")
    host_paths = [v["name"] for v in spec.get("volumes") or [] if "hostPath" in v]
    if host_paths:
        found.append(f"hostPath volumes ({', '.join(host_paths)})")
    ports = [str(p["hostPort"]) for c in containers for p in c.get("ports") or [] if p.get("hostPort")]
    if ports:
        found.append(f"hostPort (hostPorts {', '.join(ports)})")
    if level != "restricted":
        return found
    kinds = sorted({k for v in spec.get("volumes") or [] for k in v if k != "name" and k not in _RESTRICTED_VOLUMES})
    if kinds:
        found.append(f"restricted volume types (volumes use {', '.join(kinds)})")

    def unset(check: Callable[[JsonObject], bool]) -> list[str]:
        return [c["name"] for c in containers if not check(c.get("securityContext") or {})]

    escalating = unset(lambda ctx: ctx.get("allowPrivilegeEscalation") is False)
    if escalating:
        found.append(
            f"allowPrivilegeEscalation != false ({_containers(escalating)} must set "
            "securityContext.allowPrivilegeEscalation=false)"
        )
    undropped = unset(lambda ctx: "ALL" in ((ctx.get("capabilities") or {}).get("drop") or []))
    if undropped:
        found.append(
            f'unrestricted capabilities ({_containers(undropped)} must set securityContext.capabilities.drop=["ALL"])'
        )
    pod_non_root = pod_context.get("runAsNonRoot") is True
    rooted = unset(lambda ctx: ctx.get("runAsNonRoot", pod_non_root) is True)
    if rooted:
        found.append(f"runAsNonRoot != true (pod or {_containers(rooted)} must set securityContext.runAsNonRoot=true)")
    pod_profile = (pod_context.get("seccompProfile") or {}).get("type")
    unconfined = unset(
        lambda ctx: ((ctx.get("seccompProfile") or {}).get("type") or pod_profile) in ("RuntimeDefault", "Localhost")
    )
    if unconfined:
        found.append(
            f"seccompProfile (pod or {_containers(unconfined)} must set securityContext.seccompProfile.type to "
            '"RuntimeDefault" or "Localhost")'
        )
    return found


def _containers(names: list[str]) -> str:
    quoted = ", ".join(f'"{n}"' for n in names)
    return f"container {quoted}" if len(names) == 1 else f"containers {quoted}"


def _default_pod(pod: JsonObject) -> None:
    """What the API server's defaulting and admission add to a pod it accepts."""
    spec = pod["spec"]
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("serviceAccountName", spec.get("serviceAccount") or "default")
    spec["serviceAccount"] = spec["serviceAccountName"]
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("priority", 0)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    tolerations = spec.setdefault("tolerations", [])
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if not any(t.get("key") == key and t.get("effect") in (None, "", "NoExecute") for t in tolerations):
            tolerations.append({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300})
    for container in spec["containers"]:
        resources = container.setdefault("resources", {})
        limits = resources.get("limits") or {}
        requests = resources.setdefault("requests", {})
        for name, value in limits.items():
            requests.setdefault(name, value)
        if not requests:
            resources.pop("requests")
        image = str(container.get("image", ""))
        tagless = ":" not in image.rsplit("/", 1)[-1]
        container.setdefault(
            "imagePullPolicy",
            "Always" if image.endswith(":latest") or (tagless and "@" not in image) else "IfNotPresent",
        )
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
    qos = "Burstable"
    if not any((c.get("resources") or {}).get(k) for c in spec["containers"] for k in ("requests", "limits")):
        qos = "BestEffort"
    elif all(
        all(
            r in ((c["resources"].get("limits")) or {})
            and c["resources"]["limits"][r] == (c["resources"].get("requests") or {}).get(r)
            for r in ("cpu", "memory")
        )
        for c in spec["containers"]
    ):
        qos = "Guaranteed"
    pod["status"] = {"phase": "Pending", "qosClass": qos}


def _pod_usage(pod: JsonObject) -> dict[str, Fraction]:
    """What a pod counts against quota: one pod, and its requests and limits under the quota's key names."""
    usage: dict[str, Fraction] = {"pods": Fraction(1), "count/pods": Fraction(1)}
    for name, amount in pod_requests(pod).items():
        usage[f"requests.{name}"] = amount
        if name in _NATIVE_RESOURCES:
            usage[name] = amount
    for name, amount in _pod_limits(pod).items():
        if name in _NATIVE_RESOURCES:
            usage[f"limits.{name}"] = amount
    return usage


def _missing_compute(pod: JsonObject, hard: Mapping[str, Fraction]) -> str:
    """``limits.cpu for: main; requests.cpu for: main`` for what a quota tracks and the pod's containers omit.

    Empty when nothing is missing. Only cpu and memory are required this way (the real quota keeps this rule for
    them alone, for compatibility); extended resources are not.
    """
    missing: list[str] = []
    for key in sorted(
        k for k in hard if k in ("cpu", "memory", "requests.cpu", "requests.memory", "limits.cpu", "limits.memory")
    ):
        which, _, name = key.rpartition(".")
        names = sorted(
            c.get("name", "")
            for c in pod["spec"]["containers"]
            if name not in ((c.get("resources") or {}).get("limits" if which == "limits" else "requests") or {})
        )
        if names:
            missing.append(f"{key} for: {','.join(names)}")
    return "; ".join(missing)


def _default_job_after_uid(job: JsonObject) -> None:
    """The selector and template labels a Job gets once it has a uid (the real server does this on create)."""
    meta, spec = job["metadata"], job["spec"]
    uid = meta["uid"]
    spec["selector"] = {"matchLabels": {JOB_UID_LABELS[0]: uid}}
    template = spec["template"]
    labels = template.setdefault("metadata", {}).setdefault("labels", {})
    for key in JOB_UID_LABELS:
        labels[key] = uid
    for key in JOB_NAME_LABELS:
        labels[key] = meta["name"]
    if not meta.get("labels"):  # a Job without labels takes its template's, as the API server defaults it
        meta["labels"] = dict(labels)
    meta["generation"] = 1
