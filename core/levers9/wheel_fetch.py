"""The program a machine fetches levers9's wheel from the controlplane with: ``python3 -c FETCH_PROGRAM URL SHA256
PATH CA_FILE`` (or on standard input, ``python3 - URL ...``).

A booted cloud machine's script (:mod:`levers9.bootstrap`) and ``machine create
--ssh`` (:mod:`levers9.cli.machine_install.checks`) run it where levers9 is not installed
yet, so it is standard library only and works on any Python 3. It downloads
``URL`` (``https://`` verified against ``CA_FILE``, or the system's store when
that is empty), computes the sha256 of what came and writes it to ``PATH`` only
when it is ``SHA256``; a file already at ``PATH`` is removed first, so a wrong
or failed download leaves nothing there to install. It exits non-zero saying
why (the hash that came, or the download's error). Never ``levers9`` by name
from a package index: that name is another project's there.
"""

from __future__ import annotations

__all__ = ["FETCH_PROGRAM"]

FETCH_PROGRAM = """import hashlib, os, ssl, sys, urllib.request
url, want, path, ca = sys.argv[1:5]
if os.path.exists(path):
    os.remove(path)
context = ssl.create_default_context(cafile=ca or None)
with urllib.request.urlopen(url, context=context, timeout=300) as answer:
    data = answer.read()
got = hashlib.sha256(data).hexdigest()
if got != want:
    sys.exit(f"the wheel from {url} has sha256 {got}, not {want}: not installed")
with open(path, "wb") as out:
    out.write(data)
"""
