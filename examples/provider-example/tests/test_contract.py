"""The levers9 provider contract, run against this plugin as installed."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest

from levers9.testing import ProviderContract


class TestToyCloudContract(ProviderContract):
    provider = "toycloud"
    pool_fields: ClassVar[dict[str, Any]] = {"gpu": "T4"}

    @pytest.fixture
    def pool_settings(self, tmp_path: Path) -> dict[str, Any]:
        return {"state_dir": str(tmp_path), "capacity": {"T4": 3}}

    @pytest.fixture
    def failing_pool_settings(self, tmp_path: Path) -> dict[str, Any]:
        return {"state_dir": str(tmp_path), "capacity": {"T4": 0}}
