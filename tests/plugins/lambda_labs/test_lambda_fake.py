"""The fake Lambda Cloud API itself answers as the API reference says (what the plugin's tests rely on).

Plain httpx requests, as any client of the API would make them.
"""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest

from tests.fakes.lambda_cloud import DEFAULT_API_KEY, DEFAULT_SSH_KEY, LambdaCloud

LAUNCH = {"region_name": "us-east-1", "instance_type_name": "gpu_1x_a10", "ssh_key_names": [DEFAULT_SSH_KEY]}


def call(cloud: LambdaCloud, method: str, path: str, body: Any = None, **headers: str) -> httpx.Response:
    headers = headers or {"Authorization": f"Bearer {DEFAULT_API_KEY}"}
    return httpx.request(method, f"{cloud.url}{path}", json=body, headers=headers, timeout=10)


def test_requests_without_a_valid_key_are_401_with_the_error_body(lambda_cloud: LambdaCloud) -> None:
    for headers in ({}, {"Authorization": "Bearer secret_wrong"}):
        answer = httpx.get(f"{lambda_cloud.url}/instances", headers=headers)
        assert answer.status_code == 401
        assert answer.json()["error"]["code"] == "global/invalid-api-key"
    basic = base64.b64encode(f"{DEFAULT_API_KEY}:".encode()).decode()
    assert call(lambda_cloud, "GET", "/instances", Authorization=f"Basic {basic}").json() == {"data": []}


@pytest.mark.parametrize(
    ("change", "status", "code"),
    [
        ({"colour": "blue"}, 400, "global/invalid-parameters"),
        ({"region_name": "mars-1"}, 400, "global/invalid-parameters"),
        ({"ssh_key_names": [DEFAULT_SSH_KEY, "second"]}, 400, "global/invalid-parameters"),
        ({"tags": [{"key": "Levers9_Pool", "value": "x"}]}, 400, "global/invalid-parameters"),
        ({"tags": [{"key": "levers9:pool", "value": "x" * 129}]}, 400, "global/invalid-parameters"),
        ({"name": "n" * 65}, 400, "global/invalid-parameters"),
        ({"user_data": "x" * (1024 * 1024 + 1)}, 400, "global/invalid-parameters"),
        ({"image": {"family": "a", "id": "b"}}, 400, "global/invalid-parameters"),
        ({"ssh_key_names": ["nobody"]}, 404, "global/object-does-not-exist"),
        ({"file_system_names": ["nothing"]}, 404, "global/object-does-not-exist"),
        ({"region_name": "us-west-1"}, 400, "instance-operations/launch/insufficient-capacity"),
    ],
)
def test_launch_validates_its_body_like_the_api(
    lambda_cloud: LambdaCloud, change: dict[str, Any], status: int, code: str
) -> None:
    answer = call(lambda_cloud, "POST", "/instance-operations/launch", {**LAUNCH, **change})
    assert answer.status_code == status
    assert answer.json()["error"]["code"] == code
    assert lambda_cloud.instances() == []


def test_an_instance_boots_terminates_and_keeps_its_user_data_to_itself(lambda_cloud: LambdaCloud) -> None:
    tags = [{"key": "levers9:pool", "value": "p"}]
    answer = call(lambda_cloud, "POST", "/instance-operations/launch", {**LAUNCH, "tags": tags, "user_data": "#!x"})
    (instance_id,) = answer.json()["data"]["instance_ids"]
    listed = call(lambda_cloud, "GET", f"/instances/{instance_id}").json()["data"]
    assert listed["status"] == "active"
    assert listed["tags"] == tags
    assert "user_data" not in listed
    assert lambda_cloud.instance(instance_id).user_data == "#!x"

    ended = call(lambda_cloud, "POST", "/instance-operations/terminate", {"instance_ids": [instance_id]})
    assert ended.json()["data"]["terminated_instances"][0]["id"] == instance_id
    assert lambda_cloud.instance(instance_id).gone
    unknown = call(lambda_cloud, "POST", "/instance-operations/terminate", {"instance_ids": ["nope"]})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "global/object-does-not-exist"


def test_rate_limits_answer_429_with_retry_after(lambda_cloud: LambdaCloud) -> None:
    lambda_cloud.set_rate_limits(launch_interval_s=12.0)
    assert call(lambda_cloud, "POST", "/instance-operations/launch", LAUNCH).status_code == 200
    too_soon = call(lambda_cloud, "POST", "/instance-operations/launch", LAUNCH)
    assert too_soon.status_code == 429
    assert 1 <= int(too_soon.headers["Retry-After"]) <= 12

    lambda_cloud.set_rate_limits(requests_per_s=0.01, request_burst=2, launch_interval_s=None)
    assert [call(lambda_cloud, "GET", "/ssh-keys").status_code for _ in range(3)] == [200, 200, 429]
    assert lambda_cloud.calls("/ssh-keys") == 3
