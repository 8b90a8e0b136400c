"""What a replica's name (``listen.replica_name``, ``levers9 server --replica-name``) may be.

It becomes the ``replica`` label value of every per-replica metric and the
replica's name in the logs, so it is a host name or a label of one: letters,
digits, ``.``, ``-`` and ``_``, at most 63, starting and ending with a letter or
digit. A name that is not is refused where it is given, naming the setting.
How the name is claimed among the live replicas: levers9.services.replica_name.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

__all__ = ["ReplicaName", "replica_name_problem"]

_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")


def replica_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a replica name, or None."""
    if _NAME.match(name):
        return None
    return (
        f"{name!r} is not a replica name; use letters, digits, '.', '-' and '_' (at most 63, starting and "
        "ending with a letter or digit), e.g. the host name"
    )


def _checked(name: str) -> str:
    problem = replica_name_problem(name)
    if problem is not None:
        raise ValueError(problem)
    return name


#: a config field holding a replica name
ReplicaName = Annotated[str, AfterValidator(_checked)]
