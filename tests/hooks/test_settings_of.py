"""``settings_of``: a pool's provider settings as the provider's own model, or an error naming pool and model."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict

from levers9.hooks.errors import InvalidRequest
from levers9.hooks.types import Pool, settings_of


class CloudSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    image: str = "base"
    disk_gib: int = 20


class OtherSettings(BaseModel):
    size: str = "m"


def _pool(settings: object) -> Pool:
    return Pool(name="gpus", provider="cloud", runtime="runc", settings=settings)


def test_the_model_instance_is_returned_as_it_is() -> None:
    settings = CloudSettings(image="cuda")
    assert settings_of(_pool(settings), CloudSettings) is settings


@pytest.mark.parametrize(("raw", "image"), [(None, "base"), ({}, "base"), ({"image": "cuda"}, "cuda")])
def test_a_hand_built_pools_mapping_is_validated(raw: object, image: str) -> None:
    settings = settings_of(_pool(raw), CloudSettings)
    assert isinstance(settings, CloudSettings)
    assert settings.image == image


def test_invalid_mapping_names_pool_model_and_field() -> None:
    with pytest.raises(InvalidRequest) as caught:
        settings_of(_pool({"disk_gib": "lots"}), CloudSettings)
    message = str(caught.value)
    assert message.startswith("[cloud] pool 'gpus': its settings are not valid CloudSettings")
    assert "disk_gib" in message


def test_another_model_names_pool_provider_and_wanted_model() -> None:
    with pytest.raises(InvalidRequest) as caught:
        settings_of(_pool(OtherSettings()), CloudSettings)
    assert str(caught.value) == (
        "[cloud] pool 'gpus': its settings are a OtherSettings, "
        "but provider 'cloud' takes CloudSettings (or a mapping of its fields)"
    )
