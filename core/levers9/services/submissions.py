"""A client's submission ids and the task ids derived from them (exactly-once submits, see DataPlane.submit_once).

A submission id is the client's, made once per batch and sent with every copy of it; the task ids are
derived from it, so a batch sent again to another replica finds the tasks the first one stored.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["SUBMISSION_ID", "submission_task_id"]

#: a client's submission id: long enough to be unique, short and plain enough to log
SUBMISSION_ID = re.compile(r"[A-Za-z0-9_-]{8,64}")


def submission_task_id(workspace: str, stub_id: str, submission: str, index: int) -> str:
    """The id of call ``index`` of a submission: the same every time the client sends it, unique otherwise.

    The workspace is part of it, so one workspace can neither guess nor collide with another's tasks.
    """
    digest = hashlib.sha256(f"{workspace}\0{stub_id}\0{submission}\0{index}".encode()).hexdigest()
    return f"task_{digest[:32]}"
