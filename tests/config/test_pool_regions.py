"""A pool's regions and offer strategy, and the scheduler's offer settings: read from the file, handed to providers."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from levers9.config.load import ConfigError, load_config, parse_config
from levers9.config.model import SchedulerConfig
from levers9.hooks.manager import load_plugins

if TYPE_CHECKING:
    from tests.conftest import Installed

#: a provider with settings and nothing else: enough for the config to resolve a pool against it
PLAIN = """
from pydantic import BaseModel, ConfigDict

from levers9 import hookimpl


class PlainSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")


@hookimpl
def levers9_provider_settings():
    return PlainSettings
"""


def _pools(body: str) -> str:
    return "pools:\n" + textwrap.indent(textwrap.dedent(body).strip("\n"), "  ") + "\n"


def _issues(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "inline.yaml")
    return [str(issue) for issue in info.value.issues]


def test_region_means_a_list_of_one_and_regions_keep_their_order(installed: Installed, tmp_path: Path) -> None:
    installed.add("levers9-plain", {"plain": "l9_plain"}, {"l9_plain": PLAIN})
    path = tmp_path / "levers9.yaml"
    path.write_text(
        _pools(
            """
            one:
              provider: plain
              region: eu-west-1
            many:
              provider: plain
              regions: [us-east-1, us-west-2]
              strategy: cheapest
            none:
              provider: plain
            """
        )
    )
    loaded = load_config(path, plugins=load_plugins())
    try:
        one, many, none = loaded.pools["one"], loaded.pools["many"], loaded.pools["none"]
    finally:
        loaded.hooks.close()
    assert (one.region, one.regions, one.strategy) == ("eu-west-1", ["eu-west-1"], "preference")
    assert (many.region, many.regions, many.strategy) == ("us-east-1", ["us-east-1", "us-west-2"], "cheapest")
    assert (none.region, none.regions) == (None, [])


def test_region_and_regions_together_is_an_error_naming_both() -> None:
    [issue] = _issues(_pools("a:\n  provider: x\n  region: eu-west-1\n  regions: [us-east-1]\n"))
    assert issue.startswith("inline.yaml:2: pools.a:")
    assert "region ('eu-west-1') and regions (['us-east-1']) are both set" in issue
    assert "region: X is the same as regions: [X]" in issue


def test_a_region_listed_twice_or_empty_is_refused() -> None:
    [twice] = _issues(_pools("a:\n  provider: x\n  regions: [us-east-1, us-west-2, us-east-1]\n"))
    assert "regions lists us-east-1 more than once" in twice
    [empty] = _issues(_pools("a:\n  provider: x\n  regions: ['']\n"))
    assert "pools.a.regions[0]: String should have at least 1 character" in empty


def test_an_unknown_strategy_lists_the_accepted_ones() -> None:
    [issue] = _issues(_pools("a:\n  provider: x\n  strategy: fastest\n"))
    assert "pools.a.strategy" in issue
    assert "'preference' or 'cheapest'" in issue
    assert "(got 'fastest')" in issue


def test_scheduler_offer_settings_have_defaults_and_bounds() -> None:
    settings = SchedulerConfig()
    assert (settings.offers_ttl_s, settings.worker_image) == (60.0, None)
    config, _ = parse_config(
        "scheduler:\n  offers_ttl_s: 5\n  worker_image: ghcr.io/levers9/worker:0.1.0\n", "inline.yaml"
    )
    assert (config.scheduler.offers_ttl_s, config.scheduler.worker_image) == (5.0, "ghcr.io/levers9/worker:0.1.0")
    [issue] = _issues("scheduler:\n  offers_ttl_s: 0\n")
    assert "scheduler.offers_ttl_s" in issue
    assert "greater than 0" in issue
