"""``levers9 offers``, run as an operator runs it: a subprocess of the installed command against a config file.

Offers come from the ``toycloud`` example provider (its offers follow its
``capacity`` and ``price_per_hour`` settings) and from a provider installed for
the test whose offers follow its pool's regions (``fakecloud``, shared with
the ``levers9 check`` tests). Standard output is a pipe, so the table comes as
tab-separated values with a header line.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.cli.test_check_cmd import install_fakes, write_config
from tests.conftest import Installed

COLUMNS = [
    "pool",
    "provider",
    "gpu",
    "count",
    "instance type",
    "region",
    "zone",
    "spot",
    "price/h",
    "availability",
    "details",
]


def rows_of(stdout: str) -> list[dict[str, str]]:
    header, *lines = stdout.splitlines()
    assert header.split("\t") == COLUMNS
    return [dict(zip(COLUMNS, line.split("\t"), strict=True)) for line in lines]


def toy_pools(tmp_path: Path) -> str:
    state = tmp_path / "toy"
    return (
        f"  toy-h100:\n    provider: toycloud\n    runtime: process\n    gpu: H100\n"
        f"    settings: {{state_dir: {state}, capacity: {{H100: 2}}, price_per_hour: {{H100: 3.5}}}}\n"
        f"  toy-any:\n    provider: toycloud\n    runtime: process\n"
        f"    settings: {{state_dir: {state}, capacity: {{T4: 1, H100: 0}}, price_per_hour: {{T4: 0.4, H100: 2.0}}}}\n"
    )


def test_offers_sorted_by_gpu_then_price(cli: Callable[..., Any], tmp_path: Path, installed: Installed) -> None:
    install_fakes(installed)
    config = write_config(
        tmp_path,
        toy_pools(tmp_path) + "  fake:\n    provider: fakecloud\n    runtime: process\n    gpu: H100\n"
        "    regions: [eu-2, eu-1]\n    settings: {price: 2.5}\n"
        "  fake-unpriced:\n    provider: fakecloud\n    runtime: process\n    gpu: H100\n    region: eu-9\n",
    )
    result = cli("offers", "--config", str(config))
    assert result.returncode == 0, result.stderr
    rows = rows_of(result.stdout)
    picked = [(r["gpu"], r["price/h"], r["pool"]) for r in rows]
    assert picked == [
        ("H100", "2.00", "toy-any"),
        ("H100", "2.50", "fake"),  # same price: by pool, then instance type, then zone
        ("H100", "2.50", "fake"),
        ("H100", "3.50", "toy-h100"),
        ("H100", "-", "fake-unpriced"),  # no price: last among its GPU
        ("T4", "0.40", "toy-any"),
    ]
    assert [rows[i]["zone"] for i in (1, 2, 4)] == ["eu-1a", "eu-2a", "eu-9a"]
    fake = rows[1]
    assert fake == {
        "pool": "fake",
        "provider": "fakecloud",
        "gpu": "H100",
        "count": "1",
        "instance type": "fake.h100",
        "region": "eu-1",
        "zone": "eu-1a",
        "spot": "yes",
        "price/h": "2.50",
        "availability": "limited",
        "details": "cloud=secure, form_factor=sxm",
    }
    toy_sold_out = rows[0]
    assert (toy_sold_out["provider"], toy_sold_out["availability"], toy_sold_out["spot"], toy_sold_out["details"]) == (
        "toycloud",
        "unavailable",
        "no",
        "-",
    )
    as_json = json.loads(cli("offers", "--config", str(config), "--pool", "fake", "--json").stdout)
    assert [o["details"] for o in as_json] == [{"cloud": "secure", "form_factor": "sxm"}] * 2


def test_gpu_filter_takes_any_spelling(cli: Callable[..., Any], tmp_path: Path) -> None:
    config = write_config(tmp_path, toy_pools(tmp_path))
    result = cli("offers", "--config", str(config), "--gpu", "h100-80gb", "--json")
    assert result.returncode == 0, result.stderr
    offers = json.loads(result.stdout)
    assert [(o["pool"], o["gpu"], o["price_per_hour"]) for o in offers] == [
        ("toy-any", "H100", 2.0),
        ("toy-h100", "H100", 3.5),
    ]
    assert set(offers[0]) == {
        "pool",
        "provider",
        "gpu",
        "gpu_count",
        "gpu_memory_mib",
        "instance_type",
        "region",
        "zone",
        "spot",
        "price_per_hour",
        "availability",
        "cpu_millicores",
        "memory_mib",
        "details",
        "key",
        "error",
        "note",
    }
    assert offers[0]["details"] == {}
    assert offers[0]["error"] is None
    assert offers[0]["key"].startswith(offers[0]["instance_type"] + "/")

    result = cli("offers", "--config", str(config), "--gpu", "NVIDIA Tesla T4")
    assert result.returncode == 0, result.stderr
    assert [(r["pool"], r["gpu"]) for r in rows_of(result.stdout)] == [("toy-any", "T4")]


def test_unknown_gpu_exits_2_with_the_closest_names(cli: Callable[..., Any], tmp_path: Path) -> None:
    config = write_config(tmp_path, toy_pools(tmp_path))
    result = cli("offers", "--config", str(config), "--gpu", "H1OO")
    assert result.returncode == 2
    assert result.stdout == ""
    assert "--gpu 'H1OO' is not a GPU type levers9 knows" in result.stderr
    assert "H100" in result.stderr


def test_failing_pools_come_last_with_their_error(
    cli: Callable[..., Any], tmp_path: Path, installed: Installed
) -> None:
    install_fakes(installed)
    config = write_config(
        tmp_path,
        toy_pools(tmp_path) + "  down:\n    provider: fakecloud\n    runtime: process\n    gpu: H100\n"
        "    settings: {mode: raise}\n"
        "  gone:\n    provider: broken\n    runtime: process\n"
        "  aws:\n    provider: ec2\n    runtime: process\n    gpu: H100\n    region: us-east-1\n"
        "    settings: {ami: ami-0123456789abcdef0, access_key_id_env: L9_NO_SUCH_KEY, "
        "secret_access_key_env: L9_NO_SUCH_SECRET}\n"
        "  k8s:\n    provider: local_k8s\n    runtime: process\n    gpu: H100\n"
        f"    settings: {{worker_image: ghcr.io/levers9/worker:0.1.0, kubeconfig: {tmp_path / 'no-kubeconfig'}}}\n"
        "  lab:\n    provider: attached_cluster\n    runtime: process\n    gpu: H100\n"
        "    settings: {cluster: lab, worker_image: ghcr.io/levers9/worker:0.1.0}\n",
    )
    result = cli("offers", "--config", str(config))
    assert result.returncode == 1
    assert {r["pool"] for r in rows_of(result.stdout)} == {"toy-h100", "toy-any"}  # the others' offers still listed
    assert "pool down (fakecloud) failed: " in result.stderr
    assert "RuntimeError: the offers API answered 503" in result.stderr
    assert "pool gone (broken) failed: " in result.stderr
    assert "ImportError: needs libfoo" in result.stderr
    assert "pool aws (ec2) failed: " in result.stderr
    assert "L9_NO_SUCH_KEY" in result.stderr  # the credential variable that is not set, by name
    assert "pool k8s (local_k8s) failed: " in result.stderr
    assert "no-kubeconfig" in result.stderr  # the kubeconfig it could not read, by path
    # an attached cluster's offers come from its agent, which no config file reaches: none, and no failure
    assert "pool lab (attached_cluster)" not in result.stderr
    # each failure is said once: by the command, not also by the hook facade's log
    assert result.stderr.count("L9_NO_SUCH_KEY") == 1, result.stderr
    assert result.stderr.count("the offers API answered 503") == 1, result.stderr

    result = cli("offers", "--config", str(config), "--json")
    assert result.returncode == 1
    entries = json.loads(result.stdout)
    tail = [(e["pool"], e["error"] is not None, e["note"] is not None, e["gpu"]) for e in entries[-4:]]
    assert sorted(tail) == [
        ("aws", True, False, None),
        ("down", True, False, None),
        ("gone", True, False, None),
        ("k8s", True, False, None),
    ]
    assert all(e["error"] is None and e["gpu"] is not None for e in entries[:-4])
    assert "lab" not in {e["pool"] for e in entries}


def test_pool_option(cli: Callable[..., Any], tmp_path: Path) -> None:
    config = write_config(tmp_path, toy_pools(tmp_path))
    result = cli("offers", "--config", str(config), "--pool", "toy-h100", "--json")
    assert result.returncode == 0, result.stderr
    assert {o["pool"] for o in json.loads(result.stdout)} == {"toy-h100"}
    result = cli("offers", "--config", str(config), "--pool", "nope")
    assert result.returncode == 2
    assert "no pool named 'nope'" in result.stderr


def test_example_config(cli: Callable[..., Any]) -> None:
    """The annotated example: none of its pools fails to load; the clouds fail only for want of credentials here."""
    example = Path(__file__).resolve().parents[2] / "examples" / "levers9.yaml"
    result = cli("offers", "--config", str(example), "--json")
    entries = json.loads(result.stdout)
    failed = {e["pool"]: e["error"] for e in entries if e["error"] is not None}
    assert set(failed) == {"h100-aws", "a100-oci", "h100-lambda"}, failed
    assert "ProfileNotFound" in failed["h100-aws"]
    assert "OCI config file" in failed["a100-oci"]
    assert "LAMBDA_API_KEY" in failed["h100-lambda"]
    assert result.returncode == 1, result.stderr
