"""No bootstrap installs levers9 from a package index by name: on the public index that name is another project's.

Every text a provider passes to a machine (``cloud_init``, ``shell_script``, the container spec's command and
environment), for every runtime, with and without a worker image and a wheel URL, is scanned for a pip install
whose requirement is ``levers9`` by name (``levers9``, ``levers9==X``, ``levers9[extra]``...); a requirement
with a direct reference (``levers9 @ file://...``, levers9's own wheel) is what the boot script installs instead.
"""

from __future__ import annotations

import itertools
import re
import shlex

import pytest

from levers9.bootstrap import cloud_init, container_spec, shell_script
from levers9.hooks.types import WorkerBootstrap

#: a requirement naming levers9 with no direct reference: the bare name, extras, a version specifier
_BY_NAME = re.compile(r"levers9(\[[^\]]*\])?\s*([=<>~!]=?.*)?", re.IGNORECASE)


def pip_installs_of_levers9_by_name(text: str) -> list[str]:
    """The lines of ``text`` that pip-install levers9 by its name (from whatever index pip is given)."""
    found = []
    for line in text.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            words = line.split()
        for at, word in enumerate(words[:-1]):
            if not (word.rsplit("/", 1)[-1].startswith("pip") and words[at + 1] == "install"):
                continue
            requirements = [w for w in words[at + 2 :] if not w.startswith("-")]
            if any(_BY_NAME.fullmatch(r.strip()) for r in requirements):
                found.append(line.strip())
    return found


@pytest.mark.parametrize(
    "text",
    [
        "pip install levers9==0.1.0",
        "python3 -m pip install --quiet 'levers9[agent]'",
        '"$PY" -m pip install levers9 >>"$LOG" 2>&1',
        "  pip3 install -U levers9>=0.1",
    ],
)
def test_the_scan_finds_an_install_by_name(text: str) -> None:
    assert pip_installs_of_levers9_by_name(text) == [text.strip()]


def test_the_scan_passes_levers9s_own_wheel_and_other_packages() -> None:
    text = '"$PY" -m pip install --quiet "levers9 @ file://$WHEEL_FILE"\npip install levers9-toycloud httpx\n'
    assert pip_installs_of_levers9_by_name(text) == []


WHEEL = "https://cp.example:8443/wheels/levers9-0.1.0-py3-none-any.whl"


@pytest.mark.parametrize(
    ("runtime", "image", "wheel_url"),
    list(
        itertools.product(["process", "runc", "gvisor"], [None, "registry.example/levers9/worker:0.1.0"], [None, WHEEL])
    ),
)
def test_no_bootstrap_text_installs_levers9_by_name(runtime: str, image: str | None, wheel_url: str | None) -> None:
    bootstrap = WorkerBootstrap(
        controlplane_url="grpcs://cp.example:1993",
        token="l9_machine_" + "S" * 43,
        machine_id="mach_0123",
        pool="gpu",
        levers9_version="0.1.0",
        runtime=runtime,
        worker_image=image,
        wheel_url=wheel_url or "",
        wheel_sha256="a" * 64 if wheel_url else "",
    )
    texts = {"shell_script": shell_script(bootstrap), "cloud_init": cloud_init(bootstrap)}
    if image is not None:
        spec = container_spec(bootstrap)
        texts["container_spec"] = "\n".join([shlex.join(spec.command), *spec.env.values()])
    for renderer, text in texts.items():
        assert pip_installs_of_levers9_by_name(text) == [], f"{renderer} installs levers9 by name from an index"
    if wheel_url:
        assert '"levers9 @ file://$WHEEL_FILE"' in texts["shell_script"]
