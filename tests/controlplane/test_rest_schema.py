"""The REST API's OpenAPI document lists every status each route answers, and a 405 names every method of its path.

Each operation of the document is probed over real Services with the requests a client gets wrong most often
(no token, a worker's token, a body that is not UTF-8, one that is not JSON, no body, ids that name nothing, a
version out of range) and with a method its path does not take: every status answered must be one the operation
lists, every error must have the error body's shape, and a 405's ``Allow`` must name exactly the methods the
document gives that path (Starlette's own 405 named only the first route's, so ``PUT /workspaces`` said
``Allow: GET`` though the path takes POST too).
"""

from __future__ import annotations

from typing import Any

import httpx

from tests.controlplane.conftest import Api, bearer

#: what each path parameter is filled with: a value of the right form naming nothing
FILL = {
    "task_id": "task_nope",
    "token_id": "tok_nope",
    "name": "nope",
    "version": "7",
    "sandbox_id": "sb-nope",
    "process": "1",
    "port": "8000",
    "snapshot_id": "sbs_nope",
    "email": "nobody@example.com",
}
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def _errors_have_their_shape(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    body = response.json()
    assert set(body) == {"error"}, body
    assert isinstance(body["error"]["type"], str), body
    assert isinstance(body["error"]["message"], str), body


async def _probes(api: Api, method: str, path: str) -> list[tuple[str, httpx.Response]]:
    url = path.format(**FILL)
    _, user = await api.user("probes")
    _, worker = await api.services.tokens.issue("worker", subject="probe-worker")
    json_type = {"content-type": "application/json"}
    requests: list[tuple[str, dict[str, str], bytes | None, str]] = [
        ("no token", {}, None, url),
        ("a worker's token", bearer(worker), None, url),
        ("a workspace user's token", bearer(user), None, url),
        ("no body", bearer(api.operator), None, url),
        ("a body that is not UTF-8", {**bearer(api.operator), **json_type}, b"\xff\xfe{", url),
        ("a body that is not JSON", {**bearer(api.operator), **json_type}, b'{"name": ', url),
        ("an empty object", {**bearer(api.operator), **json_type}, b"{}", url),
    ]
    if "{version}" in path:
        requests.append(("version 0", bearer(api.operator), None, path.format(**{**FILL, "version": "0"})))
    answers = []
    for what, headers, body, target in requests:
        answers.append((what, await api.client.request(method, target, headers=headers, content=body)))
    return answers


async def test_every_status_a_route_answers_is_listed_with_the_error_body(api: Api) -> None:
    schema = (await api.client.get("/api/v1/openapi.json")).json()
    error_body = schema["components"]["schemas"]["ErrorBody"]
    assert error_body["required"] == ["error"]
    assert set(schema["components"]["schemas"]["ErrorDetail"]["required"]) == {"type", "message"}
    answered: set[int] = set()
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            listed = operation["responses"]
            for status, response in listed.items():
                if int(status) >= 400 and status != "503":  # health's 503 is its own report
                    ref = response["content"]["application/json"]["schema"]["$ref"]
                    assert ref == "#/components/schemas/ErrorBody", (method, path, status)
            for what, response in await _probes(api, method.upper(), path):
                answered.add(response.status_code)
                assert str(response.status_code) in listed, (
                    f"{method.upper()} {path} with {what} answered {response.status_code}, which its schema "
                    f"does not list ({', '.join(listed)}): {response.text}"
                )
                assert response.status_code < 500, (method, path, what, response.text)
                _errors_have_their_shape(response)
    # the probes reached each kind of answer, so the loop above checked them all
    assert {200, 201, 400, 401, 403, 404, 422} <= answered, answered


async def test_a_body_that_is_not_utf8_is_answered_400_naming_the_body(api: Api) -> None:
    headers = {**bearer(api.operator), "content-type": "application/json"}
    response = await api.client.post("/api/v1/workspaces", content=b"\xff\xfe{", headers=headers)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request"
    assert error["message"].startswith("body: not valid JSON: not UTF-8 text ("), error


async def test_a_405_names_every_method_its_path_takes(api: Api) -> None:
    schema = (await api.client.get("/api/v1/openapi.json")).json()
    shared = 0
    for path, operations in schema["paths"].items():
        taken = {method.upper() for method in operations}
        shared += len(taken) > 1
        for operation in operations.values():
            assert "Allow" in operation["responses"]["405"]["headers"], path
        for method in sorted(set(METHODS) - taken):
            response = await api.client.request(method, path.format(**FILL), headers=bearer(api.operator))
            assert response.status_code == 405, (method, path, response.text)
            assert response.headers["allow"] == ", ".join(sorted(taken)), (method, path)
            error: dict[str, Any] = response.json()["error"]
            assert error["type"] == "method_not_allowed"
            assert error["message"] == f"{method} is not allowed on {path.format(**FILL)}; it takes " + ", ".join(
                sorted(taken)
            )
    # paths with two routes (GET and POST /workspaces, GET and POST /tokens...) are where Starlette fell short
    assert shared >= 3, shared
    # and outside the document: the document itself takes GET and HEAD (a Starlette route)
    response = await api.client.post("/api/v1/openapi.json")
    assert (response.status_code, response.headers["allow"]) == (405, "GET, HEAD")
