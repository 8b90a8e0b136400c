"""Content keys: a step's key names everything below it, the same in every process, and nothing else."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from levers9.blueprints.context import LocalCopy, LocalFiles
from levers9.blueprints.spec import KEY_VERSION, Base, BlueprintError, BuildSpec, Step, base_key, keys, step_key

DIGEST = "sha256:" + "0" * 64
STEPS = (
    Step("apt", ("jq",)),
    Step("pip", ("six",)),
    Step("env", env=(("A", "1"),)),
    Step("run", ("echo hi > /built",)),
    Step("workdir", ("/app",)),
    Step("copy", ("/app",), content=DIGEST),
)
SPEC = BuildSpec(Base("debian", "3.11"), STEPS)


def test_keys_are_the_base_then_one_per_step_each_on_its_parent() -> None:
    all_keys = keys(SPEC)
    assert len(all_keys) == 1 + len(STEPS)
    assert all_keys[0] == base_key(SPEC.base)
    for i, step in enumerate(STEPS):
        assert all_keys[i + 1] == step_key(all_keys[i], step)
    assert len(set(all_keys)) == len(all_keys)


def test_the_key_is_the_documented_sha256() -> None:
    # written out here so a change to the definition (docs/blueprints.md, "The key") fails this test
    base_text = KEY_VERSION + "\n" + '{"kind":"debian","python_version":"3.11"}'
    expected_base = "sha256:" + hashlib.sha256(base_text.encode()).hexdigest()
    assert base_key(SPEC.base) == expected_base
    step_text = expected_base + "\n" + '{"args":["jq"],"op":"apt"}'
    assert step_key(expected_base, STEPS[0]) == "sha256:" + hashlib.sha256(step_text.encode()).hexdigest()
    assert KEY_VERSION == "levers9-blueprint-v1"


CHANGED = [
    Step("apt", ("jq", "curl")),
    Step("pip", ("six==1.16.0",)),
    Step("pip", ("six",), index_url="https://pypi.example/simple"),
    Step("pip", ("six",), secrets=("TOKEN",)),
    Step("env", env=(("A", "2"),)),
    Step("run", ("echo hi >  /built",)),
    Step("workdir", ("/srv",)),
    Step("copy", ("/app",), content="sha256:" + "1" * 64),
]


@pytest.mark.parametrize("index", range(len(STEPS)))
def test_changing_one_step_changes_its_key_and_every_later_one_only(index: int) -> None:
    changed = next(s for s in CHANGED if s.op == STEPS[index].op and s != STEPS[index])
    steps = list(STEPS)
    steps[index] = changed
    before, after = keys(SPEC), keys(replace(SPEC, steps=tuple(steps)))
    assert after[: index + 1] == before[: index + 1]
    for i in range(index + 1, len(before)):
        assert after[i] != before[i], f"key {i} did not change when step {index} did"


def test_every_variant_of_a_step_has_its_own_key() -> None:
    parent = base_key(SPEC.base)
    variants = [*STEPS, *CHANGED]
    assert len({step_key(parent, s) for s in variants}) == len(variants)


def test_order_of_steps_is_part_of_the_key() -> None:
    swapped = (STEPS[1], STEPS[0], *STEPS[2:])
    assert keys(replace(SPEC, steps=swapped))[-1] != keys(SPEC)[-1]


def test_the_base_key_changes_with_the_base_but_not_with_its_credentials() -> None:
    ref = "registry.example/team/py:3.11"
    plain = Base("registry", ref=ref)
    assert base_key(plain) == base_key(Base("registry", ref=ref, credentials=("REG_USER", "REG_PASS")))
    others = [
        Base("debian", "3.11"),
        Base("debian", "3.13"),
        Base("registry", python_version="3.11", ref=ref),
        Base("registry", ref="registry.example/team/py:3.12"),
    ]
    assert len({base_key(b) for b in [plain, *others]}) == 1 + len(others)


def test_step_key_refuses_a_parent_that_is_not_a_key() -> None:
    with pytest.raises(BlueprintError, match="parent_key: 'abc' is not a key"):
        step_key("abc", STEPS[0])


def test_keys_are_the_same_in_another_process_with_another_hash_seed(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("content\n")
    copy = LocalCopy("/app", LocalFiles("test", (("f.txt", tmp_path / "f.txt"),))).step()
    secrets = Step("run", ("true",), secrets=tuple(f"SECRET_{i}" for i in range(8)))
    spec = replace(SPEC, steps=(*STEPS, secrets, copy))
    script = (
        "import json, sys\n"
        "from levers9.blueprints.context import LocalCopy, LocalFiles\n"
        "from levers9.blueprints.spec import BuildSpec, keys\n"
        "from pathlib import Path\n"
        "spec = BuildSpec.from_json(sys.argv[1])\n"
        "copy = LocalCopy('/app', LocalFiles('test', (('f.txt', Path(sys.argv[2])),))).step()\n"
        "print(json.dumps([list(keys(spec)), copy.content, spec.to_json()]))\n"
    )
    seen = []
    for seed in ("1", "2", "12345"):
        out = subprocess.run(
            [sys.executable, "-c", script, spec.to_json(), str(tmp_path / "f.txt")],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        seen.append(json.loads(out.stdout))
    assert all(s == [list(keys(spec)), copy.content, spec.to_json()] for s in seen)


def _copy_key(files: LocalFiles) -> str:
    return keys(BuildSpec(Base("debian", "3.11"), (LocalCopy("/app", files).step(),)))[-1]


def test_a_local_file_s_content_changes_the_copy_step_s_key_and_its_mtime_does_not(tmp_path: Path) -> None:
    path = tmp_path / "app.py"
    path.write_text("print(1)\n")
    files = LocalFiles("test", (("app.py", path),))
    first = _copy_key(files)
    os.utime(path, (1_000_000, 1_000_000))
    assert _copy_key(files) == first
    os.utime(path, (2_000_000_000, 2_000_000_000))
    assert _copy_key(files) == first
    path.write_text("print(2)\n")
    assert _copy_key(files) != first
    path.write_text("print(1)\n")
    assert _copy_key(files) == first
    path.chmod(0o755)
    assert _copy_key(files) != first, "the rwx bits are part of the content"
