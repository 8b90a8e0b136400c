"""Where a build's packages come from: the build machine's own pip and apt configuration.

A pip step installs from the index the build machine's pip is configured with, so an operator who
runs a private mirror (or, as on a machine without the internet, a caching proxy) configures it once
for the machine and every build uses it. :func:`pip_settings` reads that configuration the way pip
does: the files ``$XDG_CONFIG_DIRS/pip/pip.conf`` (default ``/etc/xdg``), ``/etc/pip.conf``,
``~/.pip/pip.conf``, ``~/.config/pip/pip.conf`` and ``$PIP_CONFIG_FILE``, each later one overriding
the earlier ones and ``[install]`` overriding ``[global]`` within a file, then the ``PIP_*``
environment variables over all of them. It takes:

* ``index-url`` and ``extra-index-url``: ``http(s)://`` ones only. A ``file://`` URL or a local path
  names a directory of the build machine a container cannot see; it is left out and said so in
  :attr:`PipSettings.skipped` (mounting it would hand the machine's directory to every build);
* ``find-links``: ``http(s)://`` ones, the same way;
* ``trusted-host``;
* ``cert``: the CA bundle file, which the builder mounts read-only into the step's container
  (:data:`CA_TARGET`) so a mirror behind a private CA verifies as it does on the machine.

Anything else (``constraint``, ``no-binary``...) is the machine's own business, not a build's, and
is not passed on; ``constraint`` files are named in :attr:`PipSettings.skipped`.

:func:`egress_hosts` is the set of ``(host, port)`` the build's egress proxy lets through even when
they resolve to private addresses: the hosts of those URLs (``pypi.org`` and
``files.pythonhosted.org`` when no index is configured, pip's own default), the trusted hosts, the
hosts of the machine's apt sources, and those a blueprint's own ``index_url`` or its base's apt
sources name.

Invariants: nothing here writes anything or asks the network; a file that cannot be read or parsed
is skipped and named in ``skipped``, never fatal (pip itself would refuse to start on it, but a
build should then fail on the index, saying which).
"""

from __future__ import annotations

import configparser
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

__all__ = [
    "CA_TARGET",
    "DEFAULT_INDEX_HOSTS",
    "PipSettings",
    "apt_source_urls",
    "deb_line_urls",
    "egress_hosts",
    "pip_settings",
]

#: where a step's container sees the build machine's pip CA bundle (a read-only bind of that one file)
CA_TARGET = "/run/levers9-pip-ca.pem"
#: pip's own index and file hosts, used when the build machine names no index
DEFAULT_INDEX_HOSTS: tuple[tuple[str, int], ...] = (("pypi.org", 443), ("files.pythonhosted.org", 443))
_HTTP = re.compile(r"https?://", re.I)


@dataclass(frozen=True)
class PipSettings:
    """What a pip step passes on of the build machine's pip configuration (see the module docstring)."""

    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    trusted_hosts: tuple[str, ...] = ()
    #: the CA bundle on the build machine, mounted read-only at :data:`CA_TARGET`
    cert: Path | None = None
    #: what was left out, and why, one sentence each
    skipped: tuple[str, ...] = field(default=(), compare=False)

    def environment(self, index_url: str | None = None) -> dict[str, str]:
        """The ``PIP_*`` variables of a pip step's container; ``index_url`` (the step's own) replaces the index."""
        env = {
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_NO_CACHE_DIR": "1",
            "PIP_NO_INPUT": "1",
            "PIP_ROOT_USER_ACTION": "ignore",
            "PIP_PROGRESS_BAR": "off",
            # a base from a registry may keep Debian's EXTERNALLY-MANAGED marker; levers9's own bases drop it
            "PIP_BREAK_SYSTEM_PACKAGES": "1",
        }
        index = index_url or self.index_url
        if index:
            env["PIP_INDEX_URL"] = index
        if self.extra_index_urls:
            env["PIP_EXTRA_INDEX_URL"] = " ".join(self.extra_index_urls)
        if self.find_links:
            env["PIP_FIND_LINKS"] = " ".join(self.find_links)
        if self.trusted_hosts:
            env["PIP_TRUSTED_HOST"] = " ".join(self.trusted_hosts)
        if self.cert is not None:
            env["PIP_CERT"] = CA_TARGET
        return env


def _config_files(env: Mapping[str, str], home: Path, etc: Path) -> list[Path]:
    """pip's configuration files, lowest precedence first (pip's own order; a virtualenv's is not a build's)."""
    if env.get("PIP_CONFIG_FILE") == os.devnull:
        return []
    dirs = [d for d in env.get("XDG_CONFIG_DIRS", str(etc / "xdg")).split(":") if d]
    files = [Path(d) / "pip" / "pip.conf" for d in reversed(dirs)]
    files += [etc / "pip.conf", home / ".pip" / "pip.conf", home / ".config" / "pip" / "pip.conf"]
    if env.get("PIP_CONFIG_FILE"):
        files.append(Path(env["PIP_CONFIG_FILE"]))
    return files


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def pip_settings(
    env: Mapping[str, str] | None = None, home: Path | None = None, etc: Path = Path("/etc")
) -> PipSettings:
    """The build machine's pip configuration as a build passes it on (see the module docstring).

    ``env``, ``home`` and ``etc``: the environment, home directory and ``/etc`` to read (tests give their own).
    """
    env = os.environ if env is None else env
    home = Path(env.get("HOME") or Path.home()) if home is None else home
    values: dict[str, str] = {}
    skipped: list[str] = []
    for path in _config_files(env, home, etc):
        if not path.is_file():
            continue
        parser = configparser.RawConfigParser()
        try:
            parser.read(path, encoding="utf-8")
        except (OSError, UnicodeDecodeError, configparser.Error) as exc:
            skipped.append(f"{path}: unreadable ({exc}), left out")
            continue
        for section in ("global", "install"):
            if parser.has_section(section):
                values.update({_key(k): v for k, v in parser.items(section)})
    for name, value in env.items():
        if name.startswith("PIP_") and name != "PIP_CONFIG_FILE":
            values[_key(name[4:])] = value
    index = values.get("index-url", "").strip() or None
    if index is not None and not _HTTP.match(index):
        skipped.append(f"index-url {index} is not an http(s) URL a container can reach; pip's default index is used")
        index = None
    extra = _urls("extra-index-url", values.get("extra-index-url", ""), skipped)
    links = _urls("find-links", values.get("find-links", ""), skipped)
    trusted = tuple(values.get("trusted-host", "").split())
    cert: Path | None = None
    if values.get("cert", "").strip():
        cert = Path(values["cert"].strip()).expanduser()
        if not cert.is_file():
            skipped.append(f"cert {cert} is not a file here; containers keep their own CA bundle")
            cert = None
    if values.get("constraint", "").strip():
        skipped.append(f"constraint {values['constraint'].strip()} is the build machine's own; builds do not use it")
    return PipSettings(
        index_url=index,
        extra_index_urls=extra,
        find_links=links,
        trusted_hosts=trusted,
        cert=cert,
        skipped=tuple(skipped),
    )


def _urls(name: str, text: str, skipped: list[str]) -> tuple[str, ...]:
    kept = []
    for url in text.split():
        if _HTTP.match(url):
            kept.append(url)
        else:
            skipped.append(f"{name} {url} is a location on the build machine a container cannot see; left out")
    return tuple(kept)


def apt_source_urls(apt_dir: Path = Path("/etc/apt")) -> list[str]:
    """The archive URLs of every enabled ``deb`` source of the machine's apt (one-line and deb822 files)."""
    urls: list[str] = []
    for path in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        urls += _deb822_urls(_read(path))
    for path in [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*.list"))]:
        urls += deb_line_urls(_read(path).splitlines())
    return urls


def deb_line_urls(lines: Iterable[str]) -> list[str]:
    """The archive URL of each ``deb [options] URL suite ...`` line (comments and ``deb-src`` left out)."""
    urls = []
    for raw in lines:
        words = re.sub(r"\[[^\]]*\]", " ", raw.split("#", 1)[0]).split()
        if len(words) >= 3 and words[0] == "deb":
            urls.append(words[1])
    return urls


def _deb822_urls(text: str) -> list[str]:
    urls = []
    for stanza in re.split(r"\n[ \t]*\n", text):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or not line.strip() or line[0] in " \t":
                continue
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip().lower()] = value.strip()
        if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes").lower() != "no":
            urls += fields.get("uris", "").split()
    return urls


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _host_port(url: str) -> tuple[str, int] | None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return None
    return parts.hostname.lower(), port or (443 if parts.scheme.lower() == "https" else 80)


def egress_hosts(
    pip: PipSettings,
    *,
    index_urls: Sequence[str] = (),
    apt_urls: Sequence[str] = (),
    apt_dir: Path = Path("/etc/apt"),
) -> set[tuple[str, int]]:
    """The ``(host, port)`` the build's proxy lets through whatever they resolve to (see the module docstring).

    ``index_urls``: the blueprint's own pip indexes; ``apt_urls``: archives its base's apt sources name,
    on top of the build machine's own (:func:`apt_source_urls`).
    """
    hosts: set[tuple[str, int]] = set()
    urls = [*(u for u in (pip.index_url,) if u), *pip.extra_index_urls, *pip.find_links, *index_urls]
    urls += [*apt_source_urls(apt_dir), *apt_urls]
    for url in urls:
        found = _host_port(url)
        if found is not None:
            hosts.add(found)
    if pip.index_url is None:
        hosts.update(DEFAULT_INDEX_HOSTS)
    for trusted in pip.trusted_hosts:
        host, _, port = trusted.partition(":")
        if port.isdigit():
            hosts.add((host.lower(), int(port)))
        else:
            hosts.update({(host.lower(), 80), (host.lower(), 443)})
    return hosts
