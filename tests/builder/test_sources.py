"""What a build passes on of the build machine's pip and apt configuration, read as pip and apt read it."""

from __future__ import annotations

import os
from pathlib import Path

from levers9.builder.sources import (
    CA_TARGET,
    DEFAULT_INDEX_HOSTS,
    PipSettings,
    apt_source_urls,
    egress_hosts,
    pip_settings,
)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_pip_files_and_variables_override_in_pips_order(tmp_path: Path) -> None:
    etc, home = tmp_path / "etc", tmp_path / "home"
    write(
        etc / "xdg" / "pip" / "pip.conf", "[global]\nindex-url = https://xdg.example/simple\ntrusted-host = a.example\n"
    )
    write(etc / "pip.conf", "[global]\nindex-url = https://etc.example/simple\n")
    write(
        home / ".config" / "pip" / "pip.conf",
        "[global]\nextra-index-url = https://user.example/simple\n  file:///srv/wheels\n"
        "[install]\ntrusted_host = b.example:8443 c.example\n",
    )
    ca = write(tmp_path / "ca.pem", "-----BEGIN CERTIFICATE-----\n")
    settings = pip_settings({}, home, etc)
    assert settings.index_url == "https://etc.example/simple"  # /etc/pip.conf over the XDG directory's
    assert settings.extra_index_urls == ("https://user.example/simple",)
    assert settings.trusted_hosts == ("b.example:8443", "c.example")  # [install] over [global], _ as -
    assert any("file:///srv/wheels" in note for note in settings.skipped)
    conf = write(tmp_path / "more.conf", "[global]\nfind-links = https://links.example/ /opt/wheels\n")
    env = {
        "PIP_CONFIG_FILE": str(conf),
        "PIP_INDEX_URL": "https://env.example/simple",
        "PIP_CERT": str(ca),
        "PIP_CONSTRAINT": "/etc/constraints.txt",
    }
    settings = pip_settings(env, home, etc)
    assert settings.index_url == "https://env.example/simple"  # variables over every file
    assert settings.find_links == ("https://links.example/",)
    assert settings.cert == ca
    notes = " ".join(settings.skipped)
    assert "/opt/wheels" in notes
    assert "constraint /etc/constraints.txt" in notes
    assert pip_settings({"PIP_CONFIG_FILE": os.devnull}, home, etc) == PipSettings()


def test_what_a_pip_step_gets(tmp_path: Path) -> None:
    ca = write(tmp_path / "ca.pem", "x")
    settings = PipSettings(
        index_url="https://mirror.example/simple",
        extra_index_urls=("https://x.example/s",),
        trusted_hosts=("mirror.example",),
        cert=ca,
    )
    env = settings.environment()
    assert env["PIP_INDEX_URL"] == "https://mirror.example/simple"
    assert env["PIP_EXTRA_INDEX_URL"] == "https://x.example/s"
    assert env["PIP_TRUSTED_HOST"] == "mirror.example"
    assert env["PIP_CERT"] == CA_TARGET
    assert env["PIP_BREAK_SYSTEM_PACKAGES"] == "1"
    assert settings.environment("https://own.example/simple")["PIP_INDEX_URL"] == "https://own.example/simple"
    assert "PIP_INDEX_URL" not in PipSettings().environment()
    missing = pip_settings({"PIP_CERT": str(tmp_path / "nope.pem")}, tmp_path, tmp_path)
    assert missing.cert is None
    assert "nope.pem" in missing.skipped[0]


def test_the_hosts_a_build_may_reach_whatever_they_resolve_to(tmp_path: Path) -> None:
    apt = tmp_path / "apt"
    write(apt / "sources.list", "deb [arch=amd64] http://mirror.internal/debian bookworm main\n# deb http://no/ x\n")
    write(
        apt / "sources.list.d" / "debian.sources",
        "Types: deb\nURIs: https://deb.example:8443/debian\nSuites: bookworm\n\n"
        "Types: deb-src\nURIs: http://src.example/debian\n\nTypes: deb\nEnabled: no\nURIs: http://off.example/\n",
    )
    assert apt_source_urls(apt) == ["https://deb.example:8443/debian", "http://mirror.internal/debian"]
    default = egress_hosts(PipSettings(), apt_dir=apt)
    assert default == {*DEFAULT_INDEX_HOSTS, ("mirror.internal", 80), ("deb.example", 8443)}
    configured = egress_hosts(
        PipSettings(index_url="http://pypi.internal:3141/simple", trusted_hosts=("t.example:81", "u.example")),
        index_urls=["https://own.example/simple"],
        apt_urls=["http://base-mirror.example/debian"],
        apt_dir=apt,
    )
    assert configured == {
        ("pypi.internal", 3141),
        ("own.example", 443),
        ("base-mirror.example", 80),
        ("t.example", 81),
        ("u.example", 80),
        ("u.example", 443),
        ("mirror.internal", 80),
        ("deb.example", 8443),
    }
