"""The test tiers' list (tests/slow_tests.txt) names only tests that exist, so no entry silently stops marking.

A file that was renamed or a test that was removed leaves an entry that marks
nothing: its test (under the new name) then runs in the fast tier again. The
list's format is in its header; tests/conftest.py applies it.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.fixtures.tiers import slow_entries

ROOT = Path(__file__).parent.parent


def test_every_entry_of_the_slow_list_names_an_existing_test() -> None:
    missing = []
    for entry in slow_entries():
        path, _, name = entry.partition("::")
        if not (ROOT / path).is_file():
            missing.append(f"{entry}: no file {path}")
        elif name and not re.search(
            rf"^\s*(async\s+)?def {re.escape(name.split('::')[-1])}\(", (ROOT / path).read_text(), re.M
        ):
            missing.append(f"{entry}: {path} defines no test {name.split('::')[-1]}")
    assert not missing, "tests/slow_tests.txt:\n" + "\n".join(missing)


def test_the_slow_list_names_no_end_to_end_test() -> None:
    """Those are marked ``e2e`` by their path already; a second entry would only go stale."""
    assert [entry for entry in slow_entries() if entry.startswith("tests/e2e/")] == []
