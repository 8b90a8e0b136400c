"""A sandbox snapshot's description (levers9.worker.sandbox_snapshots.SnapshotInfo) and the spec's snapshot checks.

No container: what the controlplane sends back in a create's ``snapshot`` is read field by field, a key that is
not the snapshot's own (another workspace's, or outside the snapshots' prefix) is refused, and a sandbox spec that
asks for snapshots together with a network is refused naming the field.
"""

from __future__ import annotations

import pytest

from levers9.worker.sandbox_snapshots import SnapshotInfo, snapshot_key
from levers9.worker.sandboxes import SandboxRefused, SandboxSpec

SNAP = SnapshotInfo(
    id="sbs_0123456789abcdef",
    sandbox_id="sb-1",
    workspace_id="ws1",
    runtime="gvisor",
    image="host",
    python_version="3.11",
    cpu_millicores=1000,
    memory_mib=512,
    env_names=("A", "TOKEN"),
    size_bytes=1234,
    created_at=1.5,
    key=snapshot_key("ws1", "sbs_0123456789abcdef"),
)


def test_a_snapshot_goes_to_json_and_back() -> None:
    fields = SNAP.fields()
    assert fields["key"] == "sandbox-snapshots/ws1/sbs_0123456789abcdef"
    assert fields["env_names"] == ["A", "TOKEN"]
    assert SnapshotInfo.of(fields) == SNAP


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"memory_mib": "512"}, r"snapshot\.memory_mib is '512'"),
        ({"cpu_millicores": True}, r"snapshot\.cpu_millicores is True"),
        ({"id": "sbs_../x"}, r"snapshot\.id is 'sbs_\.\./x'; a snapshot id is sbs_ and hex digits"),
        (
            {"key": "sandbox-snapshots/ws2/sbs_0123456789abcdef"},
            r"snapshot\.key is .* stored at 'sandbox-snapshots/ws1/",
        ),
        ({"key": "ws1/_/sbs_0123456789abcdef"}, r"snapshot\.key is 'ws1/_/"),
        ({"env_names": "A"}, r"snapshot\.env_names must be a list of names"),
    ],
)
def test_a_snapshot_object_with_a_wrong_field_is_refused_naming_it(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SnapshotInfo.of({**SNAP.fields(), **change})
    with pytest.raises(ValueError, match="snapshot is str"):
        SnapshotInfo.of("sbs_0123456789abcdef")


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"snapshots": True, "ports": (8000,)}, "ports"),
        ({"snapshots": True, "block_network": True}, "block_network"),
        ({"snapshots": True, "allow_list": ("10.0.0.0/8",)}, "allow_list"),
        ({"snapshot": SNAP, "ports": (8000,)}, "ports"),
    ],
)
def test_snapshots_and_a_network_are_refused_together_naming_the_field(fields: dict[str, object], name: str) -> None:
    with pytest.raises(SandboxRefused, match=f"^{name} cannot be given with snapshots"):
        SandboxSpec(workspace_id="ws1", **fields).check()  # type: ignore[arg-type]


def test_a_snapshot_of_another_workspace_is_refused() -> None:
    with pytest.raises(SandboxRefused, match="snapshot sbs_0123456789abcdef belongs to another workspace"):
        SandboxSpec(workspace_id="ws2", snapshot=SNAP).check()
    SandboxSpec(workspace_id="ws1", snapshot=SNAP).check()
    SandboxSpec(workspace_id="ws1", snapshots=True).check()
