"""Console helpers shared by the commands: rich on a terminal, plain text in pipes."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
