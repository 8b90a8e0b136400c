"""One-time sign-in codes (levers9.dashboard.auth_codes): spent once, expiring, stored hashed; PKCE's S256 check;
only local paths as places to go after signing in."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from levers9.dashboard.auth_codes import OneTimeCodes, check_challenge, check_verifier, local_path, new_code, s256
from levers9.state.redis.connect import EmbeddedRedis

# RFC 7636, appendix B
RFC_VERIFIER = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"
RFC_CHALLENGE = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"


@pytest.fixture
async def codes() -> AsyncIterator[OneTimeCodes]:
    redis = EmbeddedRedis().client()
    try:
        yield OneTimeCodes(redis, "l9test:")
    finally:
        await redis.aclose()


async def test_a_code_gives_its_payload_once(codes: OneTimeCodes) -> None:
    code = await codes.put("link", {"user": "usr_1", "workspace": "ws_1"}, 60)
    assert await codes.waiting("link", code)
    assert await codes.waiting("link", code)  # asking does not spend it
    assert await codes.take("link", code) == {"user": "usr_1", "workspace": "ws_1"}
    assert await codes.take("link", code) is None
    assert not await codes.waiting("link", code)


async def test_of_racing_takes_exactly_one_gets_the_payload(codes: OneTimeCodes) -> None:
    code = await codes.put("cli", {"n": 1}, 60)
    results = await asyncio.gather(*(codes.take("cli", code) for _ in range(20)))
    assert [r for r in results if r is not None] == [{"n": 1}]


async def test_a_code_expires(codes: OneTimeCodes) -> None:
    code = await codes.put("link", {"n": 1}, 0.2)
    await asyncio.sleep(0.5)
    assert await codes.take("link", code) is None


async def test_kinds_do_not_mix_and_unknown_codes_give_nothing(codes: OneTimeCodes) -> None:
    code = await codes.put("link", {"n": 1}, 60)
    assert await codes.take("cli", code) is None
    assert await codes.take("link", new_code()) is None
    assert await codes.take("link", "") is None
    assert await codes.take("link", "x" * 10_000) is None
    assert await codes.take("link", code) == {"n": 1}


async def test_only_a_hash_of_the_code_is_stored(codes: OneTimeCodes) -> None:
    code = await codes.put("link", {"n": 1}, 60)
    keys = [key async for key in codes._redis.scan_iter("l9test:*")]
    [key] = keys
    assert code not in key
    assert key.startswith("l9test:auth:link:")


async def test_a_code_must_live_some_time(codes: OneTimeCodes) -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        await codes.put("link", {}, 0)


def test_a_code_is_256_random_bits() -> None:
    made = {new_code() for _ in range(100)}
    assert len(made) == 100
    assert {len(code) for code in made} == {43}


def test_s256_is_rfc_7636s() -> None:
    assert s256(RFC_VERIFIER) == RFC_CHALLENGE
    assert check_verifier(RFC_VERIFIER, RFC_CHALLENGE)


def test_a_wrong_or_malformed_verifier_is_refused() -> None:
    assert not check_verifier(RFC_VERIFIER[:-1] + "M", RFC_CHALLENGE)
    assert not check_verifier("short", s256("short"))  # under 43 characters: not a verifier at all
    assert not check_verifier("a" * 129, s256("a" * 129))
    assert not check_verifier("a" * 42 + " ", s256("a" * 42 + " "))
    assert not check_verifier(RFC_CHALLENGE, RFC_CHALLENGE)  # the challenge itself is no verifier


def test_a_challenge_must_be_s256_shaped() -> None:
    assert check_challenge(RFC_CHALLENGE) == RFC_CHALLENGE
    for bad in ("", "plain-verifier", RFC_CHALLENGE + "=", RFC_CHALLENGE[:-1] + "+"):
        with pytest.raises(ValueError, match=r"^code_challenge: "):
            check_challenge(bad)


@pytest.mark.parametrize(
    "path",
    ["/dashboard/", "/dashboard/e/main/tasks?status=running", "/auth/cli/start?port=5&state=abc", "/"],
)
def test_local_paths_are_kept(path: str) -> None:
    assert local_path(path) == path


@pytest.mark.parametrize(
    "path",
    [
        None,
        "",
        "https://evil.example/",
        "//evil.example/dashboard/",
        "/\\evil.example",
        "/dashboard/\\..\\",
        "javascript:alert(1)",
        "dashboard/",
        "/dash board",
        "/dashboard/\r\nSet-Cookie: x=y",
        "/" + "a" * 3000,
    ],
)
def test_anything_but_a_local_path_goes_to_the_dashboard(path: str | None) -> None:
    assert local_path(path) == "/dashboard/"
