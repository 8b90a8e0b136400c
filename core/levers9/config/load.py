"""Reading the config file and validating it, structure first and then against the plugins.

Validation runs in two passes because the second needs the first: the
``plugins:`` section decides which plugins load, and only loaded plugins can
validate the ``settings:`` of the pools that name them. Both passes collect
every problem rather than stopping at the first, and every problem names the
file, the line, the field, the value and what would be accepted. A pool's
``settings.region`` (or ``regions``) is refused for every provider, built-in or
not, before the provider's model sees it, with a message pointing at the pool's
own ``region``/``regions``: a third party's model would say only that the key is
unknown.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError

from levers9.config.external import Resolved, resolve_external
from levers9.config.fields import REGION_KEYS, region_moved
from levers9.config.model import Config, PoolConfig, default_home
from levers9.config.yaml_source import Path as LocPath
from levers9.config.yaml_source import SourceMap, YamlSyntaxError, as_mapping, load_yaml
from levers9.hooks.errors import Levers9Error, PluginError, UnknownPlugin
from levers9.hooks.facade import Hooks
from levers9.hooks.manager import PluginPolicy, PluginSet
from levers9.hooks.types import Pool

ENV_CONFIG = "LEVERS9_CONFIG"


@dataclass(frozen=True)
class ConfigIssue:
    file: str
    line: int | None
    path: str
    message: str
    value: str | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        field = f" {self.path}:" if self.path else ""
        got = f" (got {self.value})" if self.value is not None else ""
        return f"{where}:{field} {self.message}{got}"


class ConfigError(Levers9Error):
    def __init__(self, issues: Sequence[ConfigIssue]) -> None:
        self.issues = list(issues)
        file = self.issues[0].file if self.issues else "config"
        body = "\n".join(f"  {issue}" for issue in self.issues)
        super().__init__(f"{len(self.issues)} problem(s) in {file}:\n{body}")


@dataclass
class LoadedConfig:
    """A config that passed both passes, with each pool resolved into what plugins receive."""

    config: Config
    file: str | None
    plugins: PluginSet
    hooks: Hooks
    pools: dict[str, Pool]
    runtime_settings: dict[str, BaseModel | None]


def default_config_path(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get(ENV_CONFIG) or default_home() / "levers9.yaml").expanduser()


# --------------------------------------------------------------------------- pass one: structure


def parse_config(text: str, file: str, *, environ: Mapping[str, str] | None = None) -> tuple[Config, SourceMap]:
    """Parse and validate the file's text; ``${NAME}`` and ``_file`` twins are resolved first
    (:mod:`levers9.config.external`), from ``environ`` (default: this process's environment)."""
    try:
        data, source = load_yaml(text, file)
        mapping = as_mapping(data, file)
    except YamlSyntaxError as exc:
        raise ConfigError([ConfigIssue(file, exc.line, "", exc.message)]) from None
    resolved = resolve_external(mapping, os.environ if environ is None else environ)
    if resolved.problems:
        raise ConfigError(
            [ConfigIssue(file, source.line_of(loc), _dotted(loc), message) for loc, message in resolved.problems]
        )
    try:
        return Config.model_validate(resolved.mapping), source
    except ValidationError as exc:
        raise ConfigError(_from_outside(_issues_from(exc, (), source, Config), resolved, source)) from None


def _from_outside(issues: list[ConfigIssue], resolved: Resolved, source: SourceMap) -> list[ConfigIssue]:
    """Issues about a value taken from the environment or a file: at the line written in the file, saying where
    the value came from, and never showing it (it is a secret)."""
    out = []
    for issue in issues:
        for loc, (written, origin, value) in resolved.origins.items():
            dotted = _dotted(loc)
            if issue.path == dotted or issue.path.startswith(dotted + "."):
                message = issue.message
                for quoted in (_redacted(repr(value)), repr(value), _redacted(value), value):
                    message = message.replace(quoted, "the value") if quoted else message
                issue = ConfigIssue(issue.file, source.line_of(written), _dotted(written), f"{message} ({origin})")
                break
        out.append(issue)
    return out


def read_config(path: str | Path, *, environ: Mapping[str, str] | None = None) -> tuple[Config, SourceMap]:
    file = str(path)
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([ConfigIssue(file, None, "", "no such file")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([ConfigIssue(file, None, "", f"cannot read: {exc}")]) from None
    return parse_config(text, file, environ=environ)


# --------------------------------------------------------------------------- pass two: against the plugins


def load_config(
    path: str | Path | None = None,
    *,
    plugins: PluginSet | None = None,
    environ: Mapping[str, str] | None = None,
) -> LoadedConfig:
    """Read, validate and resolve a config file; the one entry point the server and CLI use.

    With no ``path``, ``$LEVERS9_CONFIG`` or the default file is used; a default
    file that does not exist means the built-in defaults (no pools).
    """
    explicit = path is not None or ENV_CONFIG in (os.environ if environ is None else environ)
    file = Path(path) if path is not None else default_config_path(environ)
    if explicit or file.exists():
        config, source = read_config(file, environ=environ)
        file_name: str | None = str(file)
    else:
        config, source = Config(), SourceMap("<defaults>")
        file_name = None
    if plugins is None:
        policy = PluginPolicy.from_env(
            allow=config.plugins.allow, block=config.plugins.block, strict=config.plugins.strict, environ=environ
        )
        plugins = PluginSet(policy)
        plugins.load_entry_points()
    hooks = Hooks(
        plugins,
        timeout=config.plugins.hook_timeout_s,
        provider_threads=config.plugins.provider_threads,
        plugin_threads=config.plugins.threads,
        unhealthy_after=config.plugins.unhealthy_after,
        probe_every_s=config.plugins.probe_every_s,
    )
    try:
        pools, runtime_settings = resolve(config, source, hooks)
    except BaseException:
        hooks.close()
        raise
    return LoadedConfig(config, file_name, plugins, hooks, pools, runtime_settings)


class _Issues:
    """Collects problems with their lines, so one run reports all of them."""

    def __init__(self, source: SourceMap) -> None:
        self.source = source
        self.items: list[ConfigIssue] = []

    def add(self, path: LocPath, message: str, value: Any = None) -> None:
        shown = None if value is None else repr(value)
        self.items.append(ConfigIssue(self.source.file, self.source.line_of(path), _dotted(path), message, shown))

    def extend(self, issues: Sequence[ConfigIssue]) -> None:
        self.items.extend(issues)


def resolve(config: Config, source: SourceMap, hooks: Hooks) -> tuple[dict[str, Pool], dict[str, BaseModel | None]]:
    """Validate what only plugins can validate, and build the hook-facing pools."""
    issues = _Issues(source)
    installed = [r.name for r in hooks.plugins.records.values()]
    for key in ("allow", "block"):
        for i, name in enumerate(getattr(config.plugins, key) or []):
            if name not in installed:
                issues.add(
                    ("plugins", key, i),
                    f"no installed plugin is named {name!r}.{_suggest(name, installed)} "
                    f"Installed: {', '.join(sorted(installed))}",
                )

    pools: dict[str, Pool] = {}
    runtime_settings: dict[str, BaseModel | None] = {}
    for name, pool in config.pools.items():
        base: LocPath = ("pools", name)
        # providers read the pool's regions from the validation context (a pool's regions are the single source)
        context = {"pool": name, "regions": pool.region_list}
        ok, settings = _validate_settings(hooks, "provider", pool.provider, pool.settings, base, issues, context)
        rt_ok, rt_settings = _validate_settings(
            hooks, "runtime", pool.runtime, pool.runtime_settings, base, issues, context
        )
        if ok and rt_ok:
            pools[name] = hook_pool(name, pool, settings)
            runtime_settings[name] = rt_settings
    if issues.items:
        raise ConfigError(issues.items)
    return pools, runtime_settings


def _validate_settings(
    hooks: Hooks,
    kind: str,
    plugin: str,
    values: dict[str, Any],
    base: LocPath,
    issues: _Issues,
    context: dict[str, Any],
) -> tuple[bool, BaseModel | None]:
    key = "settings" if kind == "provider" else "runtime_settings"
    try:
        model = hooks.provider_settings_model(plugin) if kind == "provider" else hooks.runtime_settings_model(plugin)
    except (UnknownPlugin, PluginError) as exc:
        issues.add((*base, kind), str(exc), plugin)
        return False, None
    if model is None:
        if values:
            issues.add((*base, key), f"runtime {plugin!r} takes no settings; remove {key}")
            return False, None
        return True, None
    moved = [k for k in REGION_KEYS if kind == "provider" and isinstance(values, dict) and k in values]
    if moved:  # every provider's, not only the built-ins' whose models say it themselves
        issues.add((*base, key), region_moved(moved[0], context.get("pool")))
        return False, None
    try:
        return True, model.model_validate(values, context=context)
    except ValidationError as exc:
        issues.extend(_issues_from(exc, (*base, key), issues.source, model))
        return False, None


def hook_pool(name: str, pool: PoolConfig, settings: BaseModel | None) -> Pool:
    """The pool a provider sees, from its validated config and provider settings."""
    return Pool(
        name=name,
        provider=pool.provider,
        runtime=pool.runtime,
        gpu=pool.gpu,
        gpu_count=pool.gpu_count or 0,
        region=next(iter(pool.region_list), None),
        regions=pool.region_list,
        labels=pool.labels,
        preemptible=pool.preemptible,
        strategy=pool.strategy,
        settings=settings,
    )


# --------------------------------------------------------------------------- error formatting


def _issues_from(exc: ValidationError, prefix: LocPath, source: SourceMap, model: type[BaseModel]) -> list[ConfigIssue]:
    issues = []
    for err in exc.errors():
        loc: LocPath = tuple(p for p in err["loc"] if isinstance(p, str | int))
        path = (*prefix, *_strip_validator_locs(loc))
        message = str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
        value: str | None = None
        kind = err["type"]
        if kind == "extra_forbidden":
            accepted = _fields_at(model, loc[:-1])
            message = f"unknown field {loc[-1]!r}." + _suggest(str(loc[-1]), accepted)
            if accepted:
                message += f" Accepted: {', '.join(accepted)}"
        elif kind == "missing":
            message = "required field is missing"
        elif not isinstance(err.get("input"), dict | list):
            value = _redacted(repr(err.get("input")))
        issues.append(ConfigIssue(source.file, source.line_of(path), _dotted(path), _redacted(message), value))
    return issues


#: the password of a URL's user part (``scheme://user:password@host``)
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^/@\s:'\"]*:)[^/@\s'\"]+(?=@)", re.IGNORECASE)


def _redacted(text: str) -> str:
    """``text`` with every URL's password replaced by ``***``: a refused value is echoed, its secret never."""
    return _URL_PASSWORD.sub(lambda m: m.group("head") + "***", text)


def _strip_validator_locs(loc: LocPath) -> LocPath:
    """pydantic puts validator names (``function-before[...]``) in locs; they mean nothing to an operator."""
    return tuple(p for p in loc if not (isinstance(p, str) and ("[" in p and p.endswith("]"))))


def _fields_at(model: type[BaseModel], loc: LocPath) -> list[str]:
    """The field names of the model found by walking ``loc`` from ``model``; [] when the walk gets lost.

    Used to list what would be accepted in place of an unknown key, however deep it sits
    (``pools.NAME.settings.ssh.jump.hots``).
    """
    current: type[BaseModel] | None = model
    skip_key = False
    for part in _strip_validator_locs(loc):
        if skip_key:  # the key of a dict of models, or the index of a list of models
            skip_key = False
            continue
        if current is None:
            return []
        field = current.model_fields.get(str(part))
        if field is None:
            return []
        current, skip_key = _model_in(field.annotation)
    return list(current.model_fields) if current is not None and not skip_key else []


def _model_in(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The model inside ``X | None``, ``Annotated[X, ...]``, ``dict[str, X]`` or ``list[X]``.

    The flag says whether a key or index comes between the field and the model.
    """
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin = get_origin(annotation)
    for arg in reversed(get_args(annotation)):
        found, nested = _model_in(arg)
        if found is not None:
            return found, nested or origin in (dict, list)
    return None, False


def _suggest(name: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=3, cutoff=0.5)
    return f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""


def _dotted(path: LocPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
