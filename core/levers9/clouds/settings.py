"""The base of a cloud pool's settings model: the region is the pool's own, and must look like this cloud's.

A pool names its region(s) once, as the pool's ``region``/``regions``, for
every provider; a cloud plugin's settings never hold one. Every cloud
settings model derives from :class:`CloudSettings` and says in
:attr:`CloudSettings.region_form` what a region of its cloud looks like.

What each failure means: ``region``/``regions`` written under ``settings:`` is
refused, pointing at the pool's field (the setting moved); a pool region that
does not look like one of this cloud's is refused naming it, what a region
is here and an example. Without the validation context config loading passes
(a model built in code), the pool's regions are unknown and not checked.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ValidationInfo, model_validator

from levers9.config.fields import check_pool_regions, refuse_region_settings

__all__ = ["CloudSettings", "RegionForm"]

#: what a region looks like: its pattern, what it is called in a message, and an example
RegionForm = tuple[re.Pattern[str], str, str]


class CloudSettings(BaseModel):
    """Settings of a pool on a cloud whose regions look like :attr:`region_form`."""

    region_form: ClassVar[RegionForm]

    @model_validator(mode="before")
    @classmethod
    def _region_moved(cls, data: Any, info: ValidationInfo) -> Any:
        return refuse_region_settings(data, info)

    @model_validator(mode="after")
    def _pool_regions(self, info: ValidationInfo) -> Self:
        check_pool_regions(info, *self.region_form)
        return self
