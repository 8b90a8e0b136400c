"""The config `levers9 up` writes when there is none: one local pool on this machine, as isolated as it can run.

``levers9 up --runtime auto`` (the default) takes the first of runc and gVisor
that can run here (root, the binary, its own checks: each runtime plugin says),
else the process runtime. A process pool serves only the workspace `up` gives
its context's token (a pool that isolates nothing serves one workspace), and
where its calls cannot run as ``nobody`` (a user who is not root, a Python
``nobody`` cannot execute), the starter config allows them to run as that user
(``allow_calls_as_worker_user``): a machine running `levers9 up` for one person
is the single-user machine that setting is for. `up` says so in red each time
it starts with such a pool.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from levers9.hooks.errors import Levers9Error

if TYPE_CHECKING:
    from levers9.config.load import LoadedConfig

__all__ = ["STARTER_CONFIG", "UP_WORKSPACE", "starter_config", "warn_unisolated"]

#: the config `levers9 up` writes when there is none: one local pool on this machine
STARTER_CONFIG = """\
# levers9 configuration, written by `levers9 up` (edit freely; `levers9 config check` validates it).
# State: SQLite and an embedded Redis in data_dir. See docs/config.md for every key.
version: 1
pools:
  local:
    provider: local          # workers are processes on this machine
    runtime: {runtime}{why}
    cpu: {cpu}
    memory: {memory}
    min_workers: 1
    max_workers: 1
{extra}"""
#: the workspace `up` gives its context's token, and the one a starter `process` pool serves
UP_WORKSPACE = "default"
#: the runtimes `up --runtime auto` tries for its starter pool: runc first (containers start and build faster;
#: with its user namespace, seccomp profile and dropped capabilities), then gVisor
_AUTO = ("runc", "gvisor")


def starter_config(choice: str) -> tuple[str, str]:
    """The starter config for ``--runtime choice`` (``{cpu}`` and ``{memory}`` still to fill), and why that runtime.

    ``auto`` takes the first of runc and gVisor that runs here (root, its binary, its checks), else the
    process runtime; a runc or gVisor pool also builds blueprint images (``builds: true``). A process pool serves only the workspace `up` gives its token; where its calls cannot run
    as nobody (a user who is not root, a Python nobody cannot execute), the pool allows them to run as this
    user, which is what a single-user machine is.
    """
    from levers9.hooks.facade import Hooks
    from levers9.hooks.manager import PluginPolicy, PluginSet

    plugins = PluginSet(PluginPolicy.from_env())
    plugins.load_entry_points()
    hooks = Hooks(plugins)
    try:
        runtime, why = choice, "chosen with --runtime"
        if choice == "auto":
            runtime, passed = "process", []
            for candidate in _AUTO:
                unavailable = _unavailable(hooks, candidate)
                if unavailable is None:
                    runtime = candidate
                    break
                passed.append(f"{candidate} cannot run here: {unavailable}")
            why = "; ".join(passed) or "it runs here"
        extra, comment = "", "  # calls run in containers: each its own filesystem, network and processes"
        if runtime in ("runc", "gvisor"):
            extra = "    builds: true             # its workers build blueprint images, in containers of that runtime\n"
        if runtime == "process":
            comment = "  # no isolation: calls run as host processes (as nobody when levers9 runs as root)"
            extra = (
                f"    workspace: {UP_WORKSPACE}       # a pool that isolates nothing serves one workspace: "
                "the one `levers9 up` gives your token\n"
            )
            if _unavailable(hooks, "process") is not None:
                extra += (
                    "    runtime_settings:\n"
                    "      # calls cannot run as nobody here, so they run as you: fine on a single-user machine,\n"
                    "      # never on a shared one (they can read levers9's database and keys)\n"
                    "      allow_calls_as_worker_user: true\n"
                )
    finally:
        hooks.close()
    return STARTER_CONFIG.replace("{runtime}", runtime).replace("{why}", comment).replace("{extra}", extra), (
        f"runtime {runtime}: {why}"
    )


def _unavailable(hooks: object, runtime: str) -> str | None:
    """Why ``runtime`` cannot run calls on this host (None when it can), as its plugin says."""
    import tempfile

    from levers9.hooks.facade import Hooks
    from levers9.hooks.types import RuntimeContext

    assert isinstance(hooks, Hooks)
    if runtime not in hooks.runtimes():
        return "not installed"
    with tempfile.TemporaryDirectory(prefix="levers9-up-") as scratch:
        try:
            capabilities = asyncio.run(hooks.runtime_capabilities(RuntimeContext(name=runtime, state_dir=scratch)))
        except Levers9Error as exc:
            return str(exc)
    return None if capabilities.available else capabilities.unavailable_reason or "unavailable"


def warn_unisolated(loaded: LoadedConfig) -> None:
    """Say, in red, which pools run calls as the worker's own user (the process runtime's opt-in)."""
    from levers9.cli.output import err

    for name, settings in loaded.runtime_settings.items():
        if getattr(settings, "allow_calls_as_worker_user", False):
            err.print(
                f"[red]pool {name}: calls run as the worker's own user (allow_calls_as_worker_user): they can read "
                "levers9's database and keys; keep this to a single-user machine[/red]"
            )
