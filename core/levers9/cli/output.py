"""How every command prints: one table form for people, one for pipes, and JSON for scripts.

Listing commands describe their columns with :class:`Col` and hand rows to
:func:`print_table`, which picks the form from where standard output goes:

* a terminal: a rich table without borders. A column that holds ids, names or
  statuses is never cut: it is exactly as wide as its widest value (header
  included), and when those columns alone are wider than the terminal the table
  is printed wider than the terminal, which wraps the lines, rather than lose a
  character. Only columns marked ``wrap`` (free text: errors, hook lists) give up
  width, and they wrap between words, never inside one, and never narrower than
  their longest word.
* anything else (a pipe, a file): tab-separated values, a header line first, one
  row per line, every value whole, no colour and no box characters, so
  ``levers9 tasks | cut -f1`` gives the task ids. Tabs and line breaks inside a
  value become spaces so that a row stays one line.

``--json`` output goes through :func:`print_json`: a list of objects printed with
``json.dumps(..., indent=2)``, times as ISO 8601 strings in UTC (see :func:`iso`),
and nothing else on standard output; messages go to :data:`err` (stderr).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any, Literal

import typer
from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

#: a cell: plain text, or rich Text to give it a style on a terminal
Cell = str | Text

#: a wrapping column is never made narrower than this (or its widest value, when that is less)
WRAP_FLOOR = 20
#: what separates two columns on a terminal (rich's default padding, one space either side)
GAP = 2


@dataclass(frozen=True)
class Col:
    """One column of a listing.

    ``wrap=False`` (ids, names, statuses, numbers, times): kept whole on one line.
    ``wrap=True`` (free text): may wrap between words on a terminal.
    """

    header: str
    justify: Literal["left", "right"] = "left"
    wrap: bool = False


def failed(message: str, code: int = 1) -> typer.Exit:
    """``error: message`` on stderr, and the exit to raise (``raise failed(...)``) with ``code``."""
    err.print(f"error: {message}", markup=False, highlight=False)
    return typer.Exit(code)


def plain(cell: Cell) -> str:
    """A cell's text, on one line with no tabs: what the tab-separated form prints."""
    text = cell.plain if isinstance(cell, Text) else cell
    for mark in ("\r\n", "\n", "\r", "\t"):
        text = text.replace(mark, " ")
    return text


def print_table(columns: Sequence[Col], rows: Iterable[Sequence[Cell]], *, console: Console | None = None) -> None:
    """Print ``rows`` under ``columns``: a table on a terminal, tab-separated values elsewhere."""
    console = console or out
    table_rows = [list(row) for row in rows]
    for row in table_rows:
        if len(row) != len(columns):
            raise ValueError(f"a row has {len(row)} cells for {len(columns)} columns ({[c.header for c in columns]})")
    if not console.is_terminal:
        lines = ["\t".join(c.header for c in columns)]
        lines += ["\t".join(plain(cell) for cell in row) for row in table_rows]
        try:
            console.file.write("\n".join(lines) + "\n")
            console.file.flush()
        except BrokenPipeError:
            # `levers9 tasks | head`: the reader has what it wanted; point stdout at /dev/null so
            # the interpreter's final flush does not fail again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return
    console.print(_table(columns, table_rows, console.width))


def _table(columns: Sequence[Col], rows: list[list[Cell]], width: int) -> Any:
    from rich.table import Table

    widths = column_widths(columns, [[plain(cell) for cell in row] for row in rows], width)
    table = Table(box=None, pad_edge=False, width=sum(widths) + GAP * (len(columns) - 1))
    for col, col_width in zip(columns, widths, strict=True):
        table.add_column(
            col.header,
            justify=col.justify,
            width=col_width,
            no_wrap=not col.wrap,
            # never reached for a whole column (it is as wide as its widest value) nor for a word of a
            # wrapping one (never narrower than its longest word); a last guard against "…"
            overflow="fold",
        )
    for row in rows:
        table.add_row(*(cell if isinstance(cell, Text) else Text(cell) for cell in row))
    return table


def column_widths(columns: Sequence[Col], rows: Sequence[Sequence[str]], width: int) -> list[int]:
    """Each column's width on a terminal ``width`` cells wide (see the module docstring for the rules)."""
    natural = [
        max([cell_len(c.header)] + [max((cell_len(line) for line in row[i].splitlines()), default=0) for row in rows])
        for i, c in enumerate(columns)
    ]
    widths = list(natural)
    wrapping = [i for i, c in enumerate(columns) if c.wrap]
    if not wrapping:
        return widths
    floors = {}
    for i in wrapping:
        longest_word = max([cell_len(w) for row in rows for w in row[i].split()] + [cell_len(columns[i].header)])
        floors[i] = max(longest_word, min(natural[i], WRAP_FLOOR))
    fixed = sum(natural[i] for i in range(len(columns)) if i not in floors)
    room = width - fixed - GAP * (len(columns) - 1) - sum(floors.values())
    for i in wrapping:
        widths[i] = floors[i]
    # share what is left, the columns that need least first, so none gets more than its widest value
    pending = sorted(wrapping, key=lambda i: natural[i] - floors[i])
    while pending and room > 0:
        i = pending.pop(0)
        give = min(natural[i] - widths[i], room // (len(pending) + 1))
        widths[i] += give
        room -= give
    return widths


def iso(epoch: float) -> str | None:
    """Seconds since the epoch as ISO 8601 in UTC, ``None`` for 0 (not yet / never)."""
    if not epoch:
        return None
    return datetime.fromtimestamp(epoch, UTC).isoformat()


def _json_default(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def print_json(data: Any) -> None:
    """``data`` as indented JSON on stdout, alone: datetimes as ISO 8601."""
    sys.stdout.write(json.dumps(data, indent=2, default=_json_default) + "\n")
    sys.stdout.flush()
