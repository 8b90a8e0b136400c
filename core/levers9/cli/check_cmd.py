"""``levers9 check``: can each configured pool work, and if not, why, in the plugins' own words.

For every pool of the config file, three questions, each asked of the plugin
that knows the answer:

* **provider**: is the plugin loaded, do the pool's settings validate, did it
  start (``levers9_startup``; one that failed is unhealthy, with the reason),
  and do its credentials work? The last is the provider's optional
  ``levers9_check`` hook (one cheap read-only call); a provider without it is
  reported as "no check hook; settings validated", which is all levers9 can say.
* **runtime**: is the pool's runtime available on *this* host
  (``levers9_runtime_capabilities``), and why not; with what isolation and
  version, and any notes the runtime reports about how it will run containers.
  An ``agent_machine`` pool's workers run on the boxes joined to it, not here:
  for such a pool this question is asked of its joined machines instead,
  through the controlplane of the CLI's context (``--context``), as ``levers9
  machines`` lists them: is each connected, is its agent this levers9 version,
  did it report Docker (with the ``nvidia`` runtime and the pool's GPU type for
  a GPU pool)? It is usable when one of them is ready. A shared pool's
  machines are listed only with an operator's token.
* **checkpointing**: can containers of that runtime be checkpointed here
  (``levers9_checkpoint_support``), with the reason in the tool's words (CRIU's
  or runsc's own message). Informative only: a pool runs without it.
* **scheduler**: what the controlplane of the context (when one is set) says
  of the pool now, as ``levers9 pools`` does: ``ok``, or why it starts
  nothing (a quota the provider reported, every offer out of capacity, the
  provider's refusal). Informative only: such a mark lapses on its own, and
  a controlplane that cannot be asked fails no pool.

It runs where the operator types it, from the config file, the way
``levers9 config check`` does, not through a controlplane (but for the joined
machines of ``agent_machine`` pools, which only a controlplane knows): the questions are
about credentials and about a host (the one where the pool's workers run, for
a ``local`` pool this one), so the useful place to ask them is the machine in
front of the operator, and a check must work before any server is up. The
answers are the same as a controlplane on this host with this config would get.

Invariants, and what each failure means:

* One pool's failure never hides another's: a plugin that failed to load, a
  pool whose settings do not validate, a hook that raises, returns the wrong
  type or hangs past ``plugins.hook_timeout_s`` is that pool's failed row.
  Only a config file that does not parse at all (or strict plugin mode with a
  broken plugin) stops the command, with exit status 1.
* A pool is **usable** when its provider passed (it implements
  ``levers9_provision``, and its own check, where it has one, said ok) and its
  runtime is available here. Exit status 0 when every pool checked is usable, 1 otherwise, 2 for a
  ``--pool`` naming no configured pool.
* Output is a table (:mod:`levers9.cli.output`), or with ``--json`` one object
  per pool; the summary and plugin warnings go to standard error.

:func:`load_pool_set` (also used by ``levers9 offers``) resolves each pool on
its own, with the same validation as config loading, so that one broken pool
leaves the others checkable.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from levers9.cli.output import Cell, Col, err, out, print_json, print_table
from levers9.hooks.agent_providers import AGENT_MACHINE

if TYPE_CHECKING:
    from pydantic import BaseModel

    from levers9.hooks.facade import Hooks
    from levers9.hooks.manager import PluginSet
    from levers9.hooks.types import Pool

T = TypeVar("T")

#: what a provider without ``levers9_check`` is reported as
NO_CHECK_HOOK = "no check hook; settings validated"
NOT_CHECKED = "not checked: the pool's config does not load"
#: the provider whose workers run on joined machines, which are checked instead of this host
AGENT_PROVIDER = AGENT_MACHINE


# --------------------------------------------------------------------------- loading, one pool at a time


@dataclass
class PoolSet:
    """The config's pools, each resolved on its own: the good ones in ``pools``, the others in ``problems``."""

    file: str
    plugins: PluginSet
    hooks: Hooks
    #: every configured pool's name, in config order
    names: list[str]
    #: name -> provider and runtime as written (also for pools that did not resolve)
    written: dict[str, tuple[str, str]]
    pools: dict[str, Pool] = field(default_factory=dict)
    runtime_settings: dict[str, BaseModel | None] = field(default_factory=dict)
    #: pool -> why it did not resolve (config issues with their lines, or the plugin that failed to load)
    problems: dict[str, str] = field(default_factory=dict)
    #: the pools whose config names the one workspace they serve
    bound: set[str] = field(default_factory=set)

    def close(self) -> None:
        self.hooks.close()


def load_pool_set(config_file: Path | None) -> PoolSet:
    """Read the config file and resolve each pool separately; exits 1 when the file itself does not load."""
    from levers9.config.load import ConfigError, default_config_path, read_config, resolve
    from levers9.config.model import PluginsConfig
    from levers9.hooks.errors import PluginLoadError
    from levers9.hooks.facade import Hooks
    from levers9.hooks.manager import PluginPolicy, PluginSet

    path = config_file or default_config_path()
    try:
        config, source = read_config(path)
    except ConfigError as exc:
        err.print(str(exc), markup=False)
        raise typer.Exit(1) from None
    plugins = PluginSet(
        PluginPolicy.from_env(allow=config.plugins.allow, block=config.plugins.block, strict=config.plugins.strict)
    )
    try:
        plugins.load_entry_points()
    except PluginLoadError as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(1) from None
    for record in plugins.failures():
        err.print(f"warning: plugin {record.name!r} failed to load: {record.error}", markup=False)
    hooks = Hooks(plugins, timeout=config.plugins.hook_timeout_s)
    written = {name: (spec.provider, spec.runtime) for name, spec in config.pools.items()}
    result = PoolSet(str(path), plugins, hooks, list(config.pools), written)
    result.bound = {name for name, spec in config.pools.items() if spec.workspace}
    for name, spec in config.pools.items():
        # resolve() is config loading's own second pass; given one pool at a time (and no plugin
        # allow/block lists, which `levers9 config check` reports), its problems are that pool's alone
        alone = config.model_copy(update={"pools": {name: spec}, "plugins": PluginsConfig()})
        try:
            pools, runtime_settings = resolve(alone, source, hooks)
        except ConfigError as exc:
            result.problems[name] = "; ".join(str(issue) for issue in exc.issues)
            continue
        result.pools[name] = pools[name]
        result.runtime_settings[name] = runtime_settings[name]
    return result


async def with_plugins_started(pool_set: PoolSet, work: Callable[[], Awaitable[T]]) -> T:
    """Run ``work`` between the plugins' ``levers9_startup`` and ``levers9_shutdown``, as a controlplane would.

    There is no agent hub here (``ctx.agents`` is None): an agent-backed provider says so in its answers.
    A plugin whose start fails is unhealthy, and its pools' provider checks say why.
    """
    await pool_set.hooks.startup()
    try:
        return await work()
    finally:
        await pool_set.hooks.shutdown()


def select_pools(pool_set: PoolSet, wanted: list[str]) -> list[str]:
    """The pools named by ``--pool`` (all when none), in config order; exits 2 naming the configured ones."""
    if not wanted:
        return list(pool_set.names)
    unknown = [name for name in wanted if name not in pool_set.names]
    if unknown:
        listing = ", ".join(pool_set.names) or "none"
        err.print(f"error: no pool named {', '.join(map(repr, unknown))} in {pool_set.file}; pools: {listing}")
        pool_set.close()
        raise typer.Exit(2)
    return [name for name in pool_set.names if name in wanted]


# --------------------------------------------------------------------------- the checks


@dataclass
class Verdict:
    """One question's answer: ``ok`` None when it could not be asked."""

    ok: bool | None
    message: str
    hint: str | None = None
    #: usable, but with a risk the operator chose: shown in red all the same
    warning: bool = False


@dataclass
class PoolCheck:
    pool: str
    provider: str
    runtime: str
    provider_check: Verdict
    runtime_check: Verdict
    checkpoint: Verdict
    #: what the runtime reported beside availability (isolation, version, notes)
    runtime_details: dict[str, Any] = field(default_factory=dict)
    checkpoint_mechanism: str | None = None
    #: what the controlplane of the context says of the pool now (informative: see the module docstring)
    scheduler: Verdict = field(default_factory=lambda: Verdict(None, "not asked"))

    @property
    def usable(self) -> bool:
        return bool(self.provider_check.ok) and bool(self.runtime_check.ok)

    def as_dict(self) -> dict[str, Any]:
        return {
            "pool": self.pool,
            "provider": self.provider,
            "runtime": self.runtime,
            "usable": self.usable,
            "provider_check": asdict(self.provider_check),
            "runtime_check": {**asdict(self.runtime_check), **self.runtime_details},
            "checkpoint": {**asdict(self.checkpoint), "mechanism": self.checkpoint_mechanism},
            "scheduler": asdict(self.scheduler),
        }


@dataclass(frozen=True)
class Joined:
    """The joined machines the controlplane of the context listed, or why they could not be listed."""

    machines: list[Any] | None
    problem: str = ""
    context: str = ""


def list_joined(context: str | None) -> Joined:
    """The caller's joined machines through the context's controlplane (``ListJoinedMachines``)."""
    from levers9.cli.machine_cmd import list_joined as listed
    from levers9.sdk.context import ContextError, current_context

    try:
        name = current_context(context).name
    except ContextError as exc:
        return Joined(None, f"no controlplane to ask for the joined machines: {exc}")
    try:
        return Joined(listed(context), context=name)
    except typer.Exit:  # the call printed why (unreachable, token refused)
        return Joined(
            None, f"the controlplane of context {name!r} did not list the joined machines (see above)", context=name
        )


@dataclass(frozen=True)
class Statuses:
    """What the controlplane of the context says of each of its pools (``ListPools``), or why it was not asked."""

    #: pool name -> why it starts nothing ("" when ok); None when the controlplane was not asked
    unavailable: dict[str, str] | None
    problem: str = ""
    context: str = ""

    def verdict(self, pool: str) -> Verdict:
        if self.unavailable is None:
            return Verdict(None, self.problem)
        if pool not in self.unavailable:
            return Verdict(None, f"not a pool of the controlplane of context {self.context!r}")
        why = self.unavailable[pool]
        if why:
            return Verdict(False, f"unavailable: {why} (context {self.context!r})")
        return Verdict(True, f"context {self.context!r}")


def pool_statuses(context: str | None) -> Statuses:
    """Each pool's status through the context's controlplane, as ``levers9 pools`` shows it."""
    from levers9.cli.client_cmds import UNARY_TIMEOUT_S, call
    from levers9.proto.v1 import controlplane_pb2 as pb
    from levers9.sdk.context import ContextError, current_context

    try:
        name = current_context(context).name
    except ContextError as exc:
        return Statuses(None, f"no controlplane asked: {exc}")

    async def action(stub: Any, metadata: Any) -> list[pb.PoolInfo]:
        response: pb.ListPoolsResponse = await stub.ListPools(
            pb.ListPoolsRequest(), metadata=metadata, timeout=UNARY_TIMEOUT_S
        )
        return list(response.pools)

    try:
        found = call(context, action)
    except typer.Exit:  # the call printed why (unreachable, token refused)
        return Statuses(None, f"the controlplane of context {name!r} did not answer (see above)", name)
    return Statuses({p.name: p.unavailable for p in found}, context=name)


def _machine_problems(pool: Pool, machine: Any) -> list[str]:
    """Why a joined machine cannot serve ``pool`` now; empty when it can."""
    from levers9.__about__ import __version__

    if machine.state != "joined":
        return [f"{machine.state}: its agent never joined (run the join command, or machine create --ssh, again)"]
    problems = []
    if not machine.connected:
        problems.append("not connected (its agent is down or cannot reach the controlplane)")
    if machine.version and machine.version != __version__:
        problems.append(f"its agent is levers9 {machine.version}, not {__version__}")
    if not machine.docker_version:
        problems.append("no Docker reported")
    gpu_runtime = getattr(pool.settings, "gpu_runtime", None)
    if pool.gpu is not None:
        if gpu_runtime == "nvidia" and "nvidia" not in machine.docker_runtimes:
            problems.append("its Docker has no nvidia runtime (the NVIDIA Container Toolkit)")
        if not any(g.gpu == pool.gpu and g.count >= pool.gpu_count for g in machine.gpus):
            problems.append(f"no {pool.gpu_count} {pool.gpu} GPU(s) reported")
    return problems


def _joined_check(pool: Pool, joined: Joined, result: PoolCheck) -> None:
    """The runtime question of an ``agent_machine`` pool, asked of its joined machines (see the module docstring)."""
    who = "an operator's token (levers9 token create --operator) for a shared pool, the workspace's for its own"
    result.checkpoint = Verdict(None, "asked of no host: the workers run on the joined machines")
    if joined.machines is None:
        result.runtime_check = Verdict(
            False,
            f"joined machines: {joined.problem}",
            f"a context that reaches the controlplane (levers9 context), with {who}",
        )
        return
    mine = [m for m in joined.machines if m.pool == pool.name]
    machines = []
    ready = []
    for m in mine:
        problems = _machine_problems(pool, m)
        machines.append(
            {
                "name": m.name,
                "id": m.id,
                "state": m.state,
                "connected": m.connected,
                "version": m.version or None,
                "docker_version": m.docker_version or None,
                "docker_runtimes": list(m.docker_runtimes),
                "ready": not problems,
                "problems": problems,
            }
        )
        if problems:
            continue
        ready.append(m)
    result.runtime_details = {"machines": machines}
    if not mine:
        result.runtime_check = Verdict(
            False,
            f"joined machines: none has joined pool {pool.name} (context {joined.context!r})",
            f"levers9 machine create --pool {pool.name} --ssh USER@HOST, with {who}",
        )
        return
    said = [
        f"{m['name']}: levers9 {m['version']}, Docker {m['docker_version']}"
        if m["ready"]
        else f"{m['name']}: {'; '.join(m['problems'])}"
        for m in machines
    ]
    message = f"joined machines: {len(ready)} of {len(mine)} ready; " + "; ".join(said)
    if ready:
        result.runtime_check = Verdict(True, message)
    else:
        result.runtime_check = Verdict(False, message, "levers9 machines shows them; docs/agents.md says how to mend")


async def check_pool(pool_set: PoolSet, name: str, joined: Joined | None = None) -> PoolCheck:
    provider, runtime = pool_set.written[name]
    pool = pool_set.pools.get(name)
    if pool is None:
        problem = pool_set.problems.get(name, "the pool did not resolve")
        skipped = Verdict(None, NOT_CHECKED)
        return PoolCheck(name, provider, runtime, Verdict(False, problem), skipped, Verdict(None, NOT_CHECKED))
    result = PoolCheck(
        name, provider, runtime, await _provider(pool_set.hooks, pool), Verdict(None, ""), Verdict(None, "")
    )
    if pool.provider == AGENT_PROVIDER:  # its workers run on the boxes joined to it, not on this host
        _joined_check(pool, joined or Joined(None, "not asked"), result)
        return result
    await _runtime(pool_set.hooks, pool, pool_set.runtime_settings.get(name), result)
    if result.runtime_details.get("isolation") == "none" and name not in pool_set.bound:
        # the controlplane refuses to start with such a pool (services.isolation.shared_without_isolation)
        result.runtime_check = Verdict(
            False,
            f"pools.{name}.workspace: runtime {pool.runtime!r} isolates nothing, so the pool serves one workspace",
            "name it (workspace: NAME), or use runtime runc or gvisor to share the pool",
        )
    return result


async def _provider(hooks: Hooks, pool: Pool) -> Verdict:
    health = hooks.health().get(pool.provider)
    if health is not None and not health.healthy:
        return Verdict(False, f"provider {pool.provider!r} is unhealthy: {health.reason}")
    if hooks.plugins.impl(pool.provider, "levers9_provision") is None:
        # a provider that only declares its settings (ec2, oci... before their issues land) starts nothing
        return Verdict(
            False,
            f"provider {pool.provider!r} implements no levers9_provision: it validates settings but cannot start "
            "machines for this pool in this version",
        )
    try:
        answer = await hooks.check(pool)
    except Exception as exc:  # a typed error is shown as it is; anything else still makes one failed row
        return Verdict(False, _error_text(exc))
    if answer is None:
        return Verdict(True, NO_CHECK_HOOK)
    return Verdict(answer.ok, answer.message, answer.hint)


async def _runtime(hooks: Hooks, pool: Pool, settings: BaseModel | None, result: PoolCheck) -> None:
    from levers9.hooks.types import RuntimeContext

    with tempfile.TemporaryDirectory(prefix="levers9-check-") as scratch:
        context = RuntimeContext(name=pool.runtime, settings=settings, state_dir=scratch)
        try:
            caps = await hooks.runtime_capabilities(context)
        except Exception as exc:
            result.runtime_check = Verdict(False, _error_text(exc))
        else:
            # notes: what a runtime says about how it will run containers here (which network mode `auto` chose)
            notes = list(caps.notes)
            result.runtime_details = {
                "isolation": str(caps.isolation.value),
                "version": caps.version,
                "gpu": caps.gpu,
                "notes": notes,
            }
            described = f"{pool.runtime} {caps.version or ''}".strip() + f", isolation {caps.isolation.value}"
            if caps.available and caps.calls_as_worker_user:
                # usable, but not safe to share: shown in red, so that it is read
                result.runtime_check = Verdict(
                    True,
                    "; ".join([f"available, calls run as the worker's own user: {described}", *notes]),
                    "only for a single-user machine: remove allow_calls_as_worker_user to refuse such calls",
                    warning=True,
                )
            elif caps.available:
                result.runtime_check = Verdict(True, "; ".join([f"available: {described}", *notes]))
            else:
                reason = caps.unavailable_reason or "the runtime gave no reason"
                result.runtime_check = Verdict(False, "; ".join([f"unavailable: {reason}", *notes]))
        try:
            support = await hooks.checkpoint_support(context)
        except Exception as exc:
            result.checkpoint = Verdict(False, _error_text(exc))
        else:
            result.checkpoint_mechanism = support.mechanism
            text = support.reason or ("available" if support.available else "unavailable")
            result.checkpoint = Verdict(support.available, text)


def _error_text(exc: BaseException) -> str:
    from levers9.hooks.errors import Levers9Error

    return str(exc) if isinstance(exc, Levers9Error) else f"{type(exc).__name__}: {exc}"


async def check_all(
    pool_set: PoolSet, names: list[str], joined: Joined | None = None, statuses: Statuses | None = None
) -> list[PoolCheck]:
    async def work() -> list[PoolCheck]:
        return list(await asyncio.gather(*(check_pool(pool_set, name, joined) for name in names)))

    results = await with_plugins_started(pool_set, work)
    if statuses is not None:
        for result in results:
            result.scheduler = statuses.verdict(result.pool)
    return results


# --------------------------------------------------------------------------- the command


def check(
    config: Path | None = typer.Option(
        None,
        "--config",
        help="The config file (default: $LEVERS9_CONFIG, else ~/.levers9/levers9.yaml).",
        dir_okay=False,
    ),
    pool: list[str] = typer.Option([], "--pool", help="Check only this pool (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: one object per pool."),
    context: str | None = typer.Option(
        None,
        "-c",
        "--context",
        help="The context whose controlplane says why a pool starts nothing now, and lists agent_machine pools' "
        "machines (default: the current context, when there is one).",
    ),
) -> None:
    """Check each pool: provider credentials and settings, its runtime on this host, and checkpointing.

    An agent_machine pool's runtime is checked on its joined machines instead, through the context's controlplane.
    Exit 0 when every pool checked is usable (provider ok and runtime available here), 1 otherwise.
    """
    pool_set = load_pool_set(config)
    try:
        names = select_pools(pool_set, pool)
        agent_pools = [name for name in names if pool_set.written[name][0] == AGENT_PROVIDER]
        joined = list_joined(context) if agent_pools else None
        statuses = pool_statuses(context) if names else None
        results = asyncio.run(check_all(pool_set, names, joined, statuses))
    finally:
        pool_set.close()
    if as_json:
        print_json([r.as_dict() for r in results])
    else:
        _print(results)
    usable = sum(1 for r in results if r.usable)
    if not names:
        err.print(f"{pool_set.file}: no pools configured", markup=False)
    else:
        err.print(f"{pool_set.file}: {usable} of {len(results)} pool(s) usable", markup=False)
    if usable < len(results):
        raise typer.Exit(1)


def _print(results: list[PoolCheck]) -> None:
    from rich.text import Text

    def cell(verdict: Verdict, no: str = "FAIL") -> Cell:
        mark = "WARNING" if verdict.warning else {True: "ok", False: no, None: "-"}[verdict.ok]
        text = f"{mark}: {verdict.message}" if verdict.message else mark
        if verdict.hint:
            text += f" (hint: {verdict.hint})"
        return Text(text, style="red" if verdict.warning else {True: "green", False: "red", None: "dim"}[verdict.ok])

    rows: list[list[Cell]] = []
    for r in results:
        mechanism = f"{r.checkpoint_mechanism}: " if r.checkpoint_mechanism and r.checkpoint_mechanism != "none" else ""
        checkpoint = Verdict(r.checkpoint.ok, mechanism + r.checkpoint.message, r.checkpoint.hint)
        verdict = Text("yes", style="green") if r.usable else Text("no", style="red")
        rows.append(
            [
                r.pool,
                r.provider,
                cell(r.provider_check),
                r.runtime,
                cell(r.runtime_check),
                cell(checkpoint, "no"),
                cell(r.scheduler, "no"),
                verdict,
            ]
        )
    columns = [
        Col("pool"),
        Col("provider"),
        Col("credentials and settings", wrap=True),
        Col("runtime"),
        Col("runtime on this host", wrap=True),
        Col("checkpointing", wrap=True),
        Col("scheduler now", wrap=True),
        Col("usable"),
    ]
    if out.is_terminal:
        _report(columns, rows)
    else:
        print_table(columns, rows)  # piped: one tab-separated line per pool, values whole


def _report(columns: list[Col], rows: list[list[Cell]]) -> None:
    """On a terminal: a block per pool, each check on its own line wrapped to the terminal's width. The verdicts
    are sentences, often long: as table cells a few characters wide they became cells of 30 lines."""
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    labels = [c.header for c in columns]
    width = max(len(label) for label in labels[2:]) + 1
    for row in rows:
        pool, provider, runtime, usable = (row[i] for i in (0, 1, 3, 7))
        head = Text.assemble(
            (str(pool), "bold"),
            f"  {provider} · runtime {runtime} · usable: ",
            usable if isinstance(usable, Text) else str(usable),
        )
        out.print(head)
        grid = Table.grid(padding=(0, 1))
        grid.add_column(width=width, no_wrap=True, style="dim")
        grid.add_column(overflow="fold")
        for i in (2, 4, 5, 6):
            cell = row[i]
            grid.add_row(labels[i] + ":", cell if isinstance(cell, Text) else Text(str(cell)))
        out.print(Padding(grid, (0, 0, 0, 2)), width=max(out.width, 40))
