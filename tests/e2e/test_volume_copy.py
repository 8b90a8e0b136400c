"""`levers9 cp` on a real `levers9 up`: a 200 MiB file round-trips by hash, directories copy both ways with -r.

What travels: the SDK's Volumes gRPC stream (1 MiB pieces) to the controlplane, which writes a hidden
temporary beside the target on its JuiceFS mount and renames it into place once complete; back the same
way into a temporary beside the local target. A big file shows a progress bar on stderr.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from levers9.volumes.juicefs import fuse_mounts_below
from tests.fixtures.levers9_up import Up


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while piece := f.read(1 << 20):
            digest.update(piece)
    return digest.hexdigest()


def test_cp_round_trips_a_200_mib_file_and_directories(levers9_up: Up, tmp_path: Path) -> None:
    levers9_up.use_runtime("runc")
    levers9_up.min_workers = 0
    levers9_up.start()
    assert levers9_up.levers9("volume", "create", "data").returncode == 0
    big = tmp_path / "big.bin"
    with big.open("wb") as f:
        for _ in range(200):
            f.write(os.urandom(1 << 20))
    up = levers9_up.levers9("cp", str(big), "data:models/", timeout=600)
    assert up.returncode == 0, up.stderr
    assert "big.bin" in up.stderr  # the progress bar names the file
    back = tmp_path / "back"
    back.mkdir()
    down = levers9_up.levers9("cp", "data:models/big.bin", str(back), timeout=600)
    assert down.returncode == 0, down.stderr
    assert _sha256(back / "big.bin") == _sha256(big)
    assert not [p for p in back.iterdir() if p.name != "big.bin"]  # no temporary left beside it

    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "top.txt").write_text("top\n")
    (tree / "a" / "b" / "deep.txt").write_text("deep\n")
    done = levers9_up.levers9("cp", "-r", str(tree), "data:/")
    assert done.returncode == 0, done.stderr
    listed = json.loads(levers9_up.levers9("ls", "-r", "--json", "data:tree").stdout)
    assert sorted(e["path"] for e in listed) == ["tree/a/b/deep.txt", "tree/top.txt"]
    refused = levers9_up.levers9("cp", str(tree), "data:/")
    assert refused.returncode == 2
    assert "copy it with -r" in refused.stderr
    out = tmp_path / "out"
    out.mkdir()
    done = levers9_up.levers9("cp", "-r", "data:tree", str(out))
    assert done.returncode == 0, done.stderr
    assert (out / "tree" / "a" / "b" / "deep.txt").read_text() == "deep\n"
    assert (out / "tree" / "top.txt").read_text() == "top\n"
    # the volume's listing shows no upload temporaries either
    everything = json.loads(levers9_up.levers9("ls", "-r", "--json", "data:").stdout)
    assert not [e for e in everything if ".l9-upload-" in e["path"]]
    levers9_up.stop()
    assert fuse_mounts_below(levers9_up.root) == []
