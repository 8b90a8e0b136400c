"""levers9.volumes.webdav: every method served, through a real uvicorn, with httpx and raw sockets.

The app is mounted in FastAPI under /api/v1/volumes/dav as the controlplane mounts it; the resolver wants
one bearer token. Files are checked on disk, where the volume's directory is.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import random
import socket
import time
import tracemalloc
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from levers9.volumes.webdav import UPLOAD_PREFIX
from tests.fixtures.tmpfs import fill, tmpfs
from tests.volumes.dav_server import PREFIX, DavServer, serve_dav

D = "{DAV:}"


@pytest.fixture
def dirs(tmp_path: Path) -> dict[str, Path]:
    found = {name: tmp_path / name for name in ("vol", "vol2", "other")}
    for path in found.values():
        path.mkdir()
    (found["other"] / "secret").write_text("another workspace's\n")
    return found


@pytest.fixture
def dav(dirs: dict[str, Path]) -> Iterator[DavServer]:
    with serve_dav({"vol": dirs["vol"], "vol2": dirs["vol2"]}) as server:
        yield server


@pytest.fixture
def client(dav: DavServer) -> Iterator[httpx.Client]:
    with httpx.Client(headers=dav.auth, timeout=30) as c:
        yield c


def _propfind(client: httpx.Client, url: str, depth: str = "1", body: bytes = b"") -> dict[str, ET.Element]:
    answer = client.request("PROPFIND", url, headers={"Depth": depth}, content=body)
    assert answer.status_code == 207, answer.text
    tree = ET.fromstring(answer.content)
    return {r.findtext(f"{D}href") or "": r for r in tree.findall(f"{D}response")}


def _prop(response: ET.Element, name: str) -> str | None:
    for stat in response.findall(f"{D}propstat"):
        if "200" in (stat.findtext(f"{D}status") or ""):
            found = stat.find(f"{D}prop/{D}{name}")
            if found is not None:
                return found.text or ""
    return None


def _wait_for(check: object, what: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_valid_bearer_token_is_needed_for_every_method(dav: DavServer, dirs: dict[str, Path]) -> None:
    (dirs["vol"] / "f").write_text("x")
    with httpx.Client(timeout=30) as anonymous:
        for method in ("OPTIONS", "PROPFIND", "GET", "HEAD", "PUT", "DELETE", "MKCOL", "MOVE", "COPY"):
            answer = anonymous.request(method, dav.url("vol", "f"))
            assert answer.status_code == 401, method
            assert answer.headers["www-authenticate"].startswith("Bearer")
            wrong = anonymous.request(method, dav.url("vol", "f"), headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401, method
        assert "not valid" in anonymous.get(dav.url("vol", "f"), headers={"Authorization": "Bearer n"}).text
        unknown = anonymous.get(dav.url("missing", "f"), headers=dav.auth)
        assert (unknown.status_code, unknown.text.strip()) == (404, "no volume 'missing'")
    assert (dirs["vol"] / "f").read_text() == "x"


def test_options_and_propfind(client: httpx.Client, dav: DavServer, dirs: dict[str, Path]) -> None:
    root = dirs["vol"]
    (root / "sub").mkdir()
    (root / "a file.txt").write_bytes(b"12345")
    (root / f"{UPLOAD_PREFIX}0123").write_bytes(b"half an upload")
    os.utime(root / "a file.txt", (1_700_000_000, 1_700_000_000))
    options = client.options(dav.url("vol"))
    assert options.status_code == 200
    assert options.headers["dav"] == "1"
    assert "PROPFIND" in options.headers["allow"]

    listing = _propfind(client, dav.url("vol"))
    assert sorted(listing) == [f"{PREFIX}/vol/", f"{PREFIX}/vol/a%20file.txt", f"{PREFIX}/vol/sub/"]
    file = listing[f"{PREFIX}/vol/a%20file.txt"]
    assert _prop(file, "getcontentlength") == "5"
    assert _prop(file, "getlastmodified") == "Tue, 14 Nov 2023 22:13:20 GMT"
    assert _prop(file, "displayname") == "a file.txt"
    assert (_prop(file, "getetag") or "").startswith('"')
    assert file.find(f"{D}propstat/{D}prop/{D}resourcetype/{D}collection") is None
    sub = listing[f"{PREFIX}/vol/sub/"]
    assert sub.find(f"{D}propstat/{D}prop/{D}resourcetype/{D}collection") is not None
    assert _prop(sub, "getcontentlength") is None

    assert list(_propfind(client, dav.url("vol"), depth="0")) == [f"{PREFIX}/vol/"]
    assert list(_propfind(client, dav.url("vol", "a file.txt"))) == [f"{PREFIX}/vol/a%20file.txt"]
    for depth in ("infinity", None):
        headers = {"Depth": depth} if depth else {}
        assert client.request("PROPFIND", dav.url("vol"), headers=headers).status_code == 403
    assert client.request("PROPFIND", dav.url("vol"), headers={"Depth": "2"}).status_code == 400

    asked = (
        b'<?xml version="1.0"?><D:propfind xmlns:D="DAV:" xmlns:Q="urn:q">'
        b"<D:prop><D:getcontentlength/><D:quota-available-bytes/><Q:checksum/></D:prop></D:propfind>"
    )
    one = _propfind(client, dav.url("vol", "a file.txt"), depth="0", body=asked)[f"{PREFIX}/vol/a%20file.txt"]
    assert _prop(one, "getcontentlength") == "5"
    assert _prop(one, "displayname") is None
    missing = [s for s in one.findall(f"{D}propstat") if "404" in (s.findtext(f"{D}status") or "")]
    assert [p.tag for p in missing[0].find(f"{D}prop") or []] == [f"{D}quota-available-bytes", "{urn:q}checksum"]
    names = b'<D:propfind xmlns:D="DAV:"><D:propname/></D:propfind>'
    named = _propfind(client, dav.url("vol", "a file.txt"), depth="0", body=names)[f"{PREFIX}/vol/a%20file.txt"]
    assert _prop(named, "getcontentlength") == ""
    for bad in (b"<not xml", b'<D:propfind xmlns:D="DAV:"/>', b"<!DOCTYPE x []><x/>"):
        answer = client.request("PROPFIND", dav.url("vol"), headers={"Depth": "0"}, content=bad)
        assert answer.status_code == 400, bad
    assert client.request("PROPFIND", dav.url("vol", "nothing"), headers={"Depth": "0"}).status_code == 404
    assert client.request("LOCK", dav.url("vol", "a file.txt")).status_code == 405


def test_get_and_head_with_a_range(client: httpx.Client, dav: DavServer, dirs: dict[str, Path]) -> None:
    (dirs["vol"] / "ten").write_bytes(b"0123456789")
    (dirs["vol"] / "dir").mkdir()
    whole = client.get(dav.url("vol", "ten"))
    assert (whole.status_code, whole.content, whole.headers["accept-ranges"]) == (200, b"0123456789", "bytes")
    head = client.head(dav.url("vol", "ten"))
    assert (head.status_code, head.headers["content-length"], head.content) == (200, "10", b"")
    assert head.headers["etag"] == whole.headers["etag"]
    assert "GMT" in head.headers["last-modified"]
    for asked, content, span in (
        ("bytes=2-5", b"2345", "2-5/10"),
        ("bytes=7-", b"789", "7-9/10"),
        ("bytes=-3", b"789", "7-9/10"),
        ("bytes=8-100", b"89", "8-9/10"),
    ):
        part = client.get(dav.url("vol", "ten"), headers={"Range": asked})
        assert (part.status_code, part.content, part.headers["content-range"]) == (206, content, f"bytes {span}")
    outside = client.get(dav.url("vol", "ten"), headers={"Range": "bytes=10-"})
    assert (outside.status_code, outside.headers["content-range"]) == (416, "bytes */10")
    for ignored in ("bytes=0-1,4-5", "bytes=5-2", "items=0-1"):
        assert client.get(dav.url("vol", "ten"), headers={"Range": ignored}).content == b"0123456789"
    assert client.get(dav.url("vol", "nothing")).status_code == 404
    assert client.get(dav.url("vol", "dir")).status_code == 409


def _body(size: int, seed: int, digest: hashlib._Hash) -> Iterator[bytes]:
    rng = random.Random(seed)
    left = size
    while left:
        chunk = rng.randbytes(min(left, 1024 * 1024))
        digest.update(chunk)
        left -= len(chunk)
        yield chunk


def test_put_streams_a_big_body_to_disk_and_back(client: httpx.Client, dav: DavServer, dirs: dict[str, Path]) -> None:
    sent = hashlib.sha256()
    tracemalloc.start()
    try:
        answer = client.put(dav.url("vol", "big.bin"), content=_body(20 * 1024 * 1024, 7, sent))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert answer.status_code == 201, answer.text
    assert peak < 10 * 1024 * 1024, f"the upload held {peak} bytes at once"  # the body is 20 MiB
    assert hashlib.sha256((dirs["vol"] / "big.bin").read_bytes()).hexdigest() == sent.hexdigest()
    got = hashlib.sha256()
    with client.stream("GET", dav.url("vol", "big.bin")) as reading:
        for chunk in reading.iter_bytes():
            got.update(chunk)
    assert got.hexdigest() == sent.hexdigest()
    assert sorted(os.listdir(dirs["vol"])) == ["big.bin"]

    assert client.put(dav.url("vol", "big.bin"), content=b"small now").status_code == 204
    assert (dirs["vol"] / "big.bin").read_bytes() == b"small now"
    assert client.put(dav.url("vol", "no/parent"), content=b"x").status_code == 409
    assert client.put(dav.url("vol", "big.bin/under"), content=b"x").status_code == 409
    (dirs["vol"] / "dir").mkdir()
    assert client.put(dav.url("vol", "dir"), content=b"x").status_code == 409
    assert client.put(dav.url("vol", f"{UPLOAD_PREFIX}mine"), content=b"x").status_code == 403
    assert sorted(os.listdir(dirs["vol"])) == ["big.bin", "dir"]


def _start_put(dav: DavServer, path: str, total: int, first: bytes) -> socket.socket:
    port = int(dav.origin.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port))
    head = (
        f"PUT {PREFIX}/vol/{path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {dav.token}\r\n"
        f"Content-Length: {total}\r\n\r\n"
    )
    sock.sendall(head.encode() + first)
    return sock


def test_an_interrupted_put_leaves_neither_the_target_nor_a_temporary(
    client: httpx.Client, dav: DavServer, dirs: dict[str, Path]
) -> None:
    root = dirs["vol"]
    (root / "kept.txt").write_text("the old version\n")
    for target, before in (("fresh.bin", None), ("kept.txt", b"the old version\n")):
        sock = _start_put(dav, target, 8 * 1024 * 1024, b"x" * 3 * 1024 * 1024)
        try:
            _wait_for(lambda: any(n.startswith(UPLOAD_PREFIX) for n in os.listdir(root)), "the temporary")
            temporary = next(n for n in os.listdir(root) if n.startswith(UPLOAD_PREFIX))
            listed = _propfind(client, dav.url("vol"))
            assert not [href for href in listed if UPLOAD_PREFIX in href]
            assert client.get(dav.url("vol", temporary)).status_code == 403
            reading = client.get(dav.url("vol", target))
            assert (reading.status_code, reading.content) == (
                (404, reading.content) if before is None else (200, before)
            )
        finally:
            sock.close()
        _wait_for(lambda: not any(n.startswith(UPLOAD_PREFIX) for n in os.listdir(root)), "the temporary to go")
        assert (root / target).exists() == (before is not None)
        if before is not None:
            assert (root / target).read_bytes() == before
    assert sorted(os.listdir(root)) == ["kept.txt"]


def test_delete_and_mkcol(client: httpx.Client, dav: DavServer, dirs: dict[str, Path]) -> None:
    root = dirs["vol"]
    assert client.request("MKCOL", dav.url("vol", "d/")).status_code == 201
    assert client.request("MKCOL", dav.url("vol", "d/")).status_code == 405
    assert client.request("MKCOL", dav.url("vol", "")).status_code == 405
    assert client.request("MKCOL", dav.url("vol", "x/y/")).status_code == 409
    assert client.request("MKCOL", dav.url("vol", "e/"), content=b"<x/>").status_code == 415
    assert client.request("MKCOL", dav.url("vol", "d/e/")).status_code == 201
    (root / "d" / "e" / "f").write_text("f")
    (root / "g").write_text("g")
    assert client.request("MKCOL", dav.url("vol", "g/h/")).status_code == 409
    assert client.delete(dav.url("vol", "g")).status_code == 204
    assert client.delete(dav.url("vol", "g")).status_code == 404
    assert client.delete(dav.url("vol", "d/")).status_code == 204
    assert client.delete(dav.url("vol", "")).status_code == 403
    assert os.listdir(root) == []


def test_move_and_copy(client: httpx.Client, dav: DavServer, dirs: dict[str, Path]) -> None:
    root = dirs["vol"]
    (root / "a.txt").write_text("a")
    (root / "b.txt").write_text("b")
    (root / "tree" / "sub").mkdir(parents=True)
    (root / "tree" / "sub" / "leaf").write_text("leaf")

    def call(method: str, source: str, target: str, **headers: str) -> int:
        hdrs = {"Destination": target if "://" in target or target.startswith("/") else dav.url("vol", target)}
        return client.request(method, dav.url("vol", source), headers={**hdrs, **headers}).status_code

    assert call("COPY", "a.txt", "c.txt") == 201
    assert call("COPY", "a.txt", "b.txt", Overwrite="F") == 412
    assert (root / "b.txt").read_text() == "b"
    assert call("COPY", "a.txt", "b.txt", Overwrite="T") == 204
    assert (root / "b.txt").read_text() == "a"
    assert (root / "a.txt").read_text() == "a"
    assert call("COPY", "tree/", "copy/") == 201
    assert (root / "copy" / "sub" / "leaf").read_text() == "leaf"
    assert call("COPY", "tree/", "shallow/", Depth="0") == 201
    assert os.listdir(root / "shallow") == []

    assert call("MOVE", "c.txt", "b.txt", Overwrite="F") == 412
    assert call("MOVE", "c.txt", f"{PREFIX}/vol/moved.txt") == 201  # a path, no host
    assert not (root / "c.txt").exists()
    assert (root / "moved.txt").read_text() == "a"
    assert call("MOVE", "tree/", "copy/", Overwrite="F") == 412
    assert call("MOVE", "tree/", "copy/") == 204
    assert not (root / "tree").exists()
    assert (root / "copy" / "sub" / "leaf").read_text() == "leaf"
    assert call("MOVE", "copy/", "copy/sub/inside/") == 403
    assert call("MOVE", "moved.txt", "missing/parent.txt") == 409
    assert call("MOVE", "nothing", "x") == 404
    assert call("MOVE", "moved.txt", dav.url("vol2", "moved.txt")) == 403
    assert call("MOVE", "moved.txt", "http://127.0.0.1:1/elsewhere/moved.txt") == 502
    assert call("MOVE", "moved.txt", "x", Overwrite="maybe") == 400
    assert call("MOVE", "moved.txt", dav.url("vol", "%2e%2e/vol2/moved.txt")) == 403
    assert client.request("MOVE", dav.url("vol", "moved.txt")).status_code == 400  # no Destination
    assert os.listdir(dirs["vol2"]) == []
    assert (root / "moved.txt").exists()


def test_links_leading_out_of_the_volume_are_refused(
    client: httpx.Client, dav: DavServer, dirs: dict[str, Path]
) -> None:
    root, other = dirs["vol"], dirs["other"]
    os.symlink("/etc/passwd", root / "absolute")
    os.symlink("../other/secret", root / "relative")
    os.symlink(str(other), root / "outdir")
    (root / "inside").write_text("kept inside")
    os.symlink("inside", root / "link-inside")
    for path in ("absolute", "relative", "outdir/secret"):
        for method in ("GET", "HEAD"):
            assert client.request(method, dav.url("vol", path)).status_code == 403, (method, path)
        answer = client.request("PROPFIND", dav.url("vol", path), headers={"Depth": "0"})
        assert answer.status_code == 403, path
        assert client.put(dav.url("vol", path), content=b"planted").status_code == 403, path
    assert "leads out of the volume" in client.get(dav.url("vol", "relative")).text
    assert client.put(dav.url("vol", "outdir/new"), content=b"planted").status_code == 403
    assert client.request("MKCOL", dav.url("vol", "outdir/newdir/")).status_code == 403
    assert client.request("PROPFIND", dav.url("vol", "outdir/"), headers={"Depth": "1"}).status_code == 403
    assert sorted(os.listdir(other)) == ["secret"]
    assert (other / "secret").read_text() == "another workspace's\n"
    listed = _propfind(client, dav.url("vol"))
    assert sorted(listed) == [f"{PREFIX}/vol/", f"{PREFIX}/vol/inside", f"{PREFIX}/vol/link-inside"]
    assert _prop(listed[f"{PREFIX}/vol/link-inside"], "getcontentlength") == "11"
    assert client.get(dav.url("vol", "link-inside")).text == "kept inside"


def test_dot_dot_is_refused_encoded_or_not(client: httpx.Client, dav: DavServer, dirs: dict[str, Path]) -> None:
    (dirs["vol2"] / "theirs").write_text("vol2's")
    for path in ("%2e%2e/other/secret", "a/%2e%2e/%2E%2E/vol2/theirs", "%2e%2e%2fvol2%2ftheirs"):
        answer = client.get(f"{dav.origin}{PREFIX}/vol/{path}")
        assert answer.status_code == 403, path
        assert "leads out of the volume" in answer.text
    assert client.put(f"{dav.origin}{PREFIX}/vol/%2e%2e/vol2/planted", content=b"x").status_code == 403
    port = int(dav.origin.rsplit(":", 1)[1])
    raw = http.client.HTTPConnection("127.0.0.1", port, timeout=30)  # sends the target as written, '..' and all
    try:
        raw.request("GET", f"{PREFIX}/vol/../vol2/theirs", headers=dav.auth)
        got = raw.getresponse()
        assert got.status == 403, got.read()
    finally:
        raw.close()
    assert os.listdir(dirs["vol2"]) == ["theirs"]


def test_a_full_volume_answers_507_and_keeps_no_temporary(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", 2 * 1024 * 1024) as small:
        (small / "kept.txt").write_text("kept")
        with serve_dav({"vol": small}) as dav, httpx.Client(headers=dav.auth, timeout=30) as client:
            answer = client.put(dav.url("vol", "big.bin"), content=_body(4 * 1024 * 1024, 3, hashlib.sha256()))
            assert answer.status_code == 507, answer.text
            assert "storage is full" in answer.text
            assert sorted(os.listdir(small)) == ["kept.txt"]
            fill(small)
            copied = client.request("COPY", dav.url("vol", "kept.txt"), headers={"Destination": dav.url("vol", "c")})
            assert copied.status_code == 507, copied.text
            assert "storage is full" in copied.text
            assert sorted(os.listdir(small)) == ["filler", "kept.txt"]
