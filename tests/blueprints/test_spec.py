"""The build spec: what it accepts, what it refuses (naming the field), and its canonical JSON."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from levers9.blueprints.spec import MAX_COMMAND_BYTES, MAX_STEPS, Base, BlueprintError, BuildSpec, Step
from levers9.hooks.errors import Levers9Error

DIGEST = "sha256:" + "ab" * 32
DEBIAN = {"kind": "debian", "python_version": "3.11"}


def _spec(*steps: dict[str, Any], base: dict[str, Any] | None = None) -> str:
    return json.dumps({"base": base if base is not None else DEBIAN, "steps": list(steps)})


def test_every_op_round_trips_through_canonical_json() -> None:
    spec = BuildSpec(
        Base("registry", python_version="3.13", ref="registry.example:5000/team/py:3.13", credentials=("REG_USER",)),
        (
            Step("apt", ("jq", "curl=7.88.1-10+deb12u5"), secrets=("APT_TOKEN",)),
            Step("pip", ("six", "numpy>=1.26; python_version >= '3.9'"), index_url="https://pypi.example/simple"),
            Step("run", ("echo hi > /built\necho 'ünïcode' >> /built",), secrets=("A", "B")),
            Step("env", env=(("PATH", "/opt/bin:/usr/bin"), ("EMPTY", ""), ("EQ", "a=b"))),
            Step("workdir", ("/srv/app",)),
            Step("copy", ("/app",), content=DIGEST),
        ),
    )
    text = spec.to_json()
    assert BuildSpec.from_json(text) == spec
    assert BuildSpec.from_json(text).to_json() == text
    assert text.isascii()
    # sorted keys at every level, no whitespace between tokens
    document = json.loads(text)
    assert json.dumps(document, sort_keys=True, separators=(",", ":")) == text


def test_defaults_are_left_out_of_the_canonical_form() -> None:
    text = BuildSpec(Base("debian", "3.11"), (Step("run", ("true",)),)).to_json()
    assert text == '{"base":{"kind":"debian","python_version":"3.11"},"steps":[{"args":["true"],"op":"run"}]}'


def test_explicit_nulls_and_empty_lists_read_as_the_defaults() -> None:
    text = _spec(
        {"op": "run", "args": ["true"], "env": [], "secrets": [], "content": None, "index_url": None},
        base={"kind": "debian", "python_version": "3.11", "ref": None, "credentials": []},
    )
    assert BuildSpec.from_json(text) == BuildSpec(Base("debian", "3.11"), (Step("run", ("true",)),))


def test_error_is_a_levers9_error_and_a_value_error() -> None:
    with pytest.raises(BlueprintError) as caught:
        BuildSpec.from_json(_spec({"op": "nope"}))
    assert isinstance(caught.value, Levers9Error)
    assert isinstance(caught.value, ValueError)
    assert caught.value.field == "steps[0].op"


BAD: list[tuple[str, str, str]] = [
    # (spec text, field named, words of what is accepted or wrong)
    ("[]", "spec", "must be an object"),
    ("{", "spec", "is not JSON"),
    ('{"base":{"kind":"debian","python_version":"3.11"},"steps":[],"steps":[]}', "spec", "appears twice"),
    ('{"base":{"kind":"debian","python_version":NaN},"steps":[]}', "spec", "NaN is not JSON"),
    ('{"steps":[]}', "base", "is missing"),
    ('{"base":{"kind":"debian","python_version":"3.11"}}', "steps", "is missing"),
    ('{"base":{"kind":"debian","python_version":"3.11"},"steps":[],"extra":1}', "extra", "one of base, steps"),
    (_spec(base={"python_version": "3.11"}), "base.kind", "is missing"),
    (_spec(base={"kind": "alpine"}), "base.kind", "one of debian, registry"),
    (_spec(base={"kind": 3}), "base.kind", "must be a string"),
    (_spec(base={"kind": "debian"}), "base.python_version", "a debian base needs one"),
    (_spec(base={"kind": "debian", "python_version": "2.7"}), "base.python_version", "3.N"),
    (_spec(base={"kind": "debian", "python_version": 3.11}), "base.python_version", "must be a string"),
    (_spec(base={"kind": "debian", "python_version": "3.11", "ref": "r.example/a:1"}), "base.ref", "only a registry"),
    (_spec(base={"kind": "debian", "python_version": "3.11", "credentials": ["A"]}), "base.credentials", "only a"),
    (_spec(base={"kind": "debian", "python_version": "3.11", "tag": "x"}), "base.tag", "is not a field"),
    (_spec(base={"kind": "registry"}), "base.ref", "needs an image reference"),
    (_spec(base={"kind": "registry", "ref": "python:3.11"}), "base.ref", "names no registry host"),
    (_spec(base={"kind": "registry", "ref": "r.example/Team/py:1"}), "base.ref", "lowercase path"),
    (_spec(base={"kind": "registry", "ref": "r.example/team/py"}), "base.ref", "neither a tag nor a digest"),
    (_spec(base={"kind": "registry", "ref": "r.example/a@sha256:abc"}), "base.ref", "not an image reference"),
    (_spec(base={"kind": "registry", "ref": "r.example/a:1", "credentials": ["1X"]}), "base.credentials[0]", "secret"),
    (
        _spec(base={"kind": "registry", "ref": "r.example/a:1", "credentials": ["A", "A"]}),
        "base.credentials[1]",
        "twice",
    ),
    (_spec(base={"kind": "registry", "ref": "r.example/a:1", "credentials": "A"}), "base.credentials", "list"),
    (_spec(base={"kind": "registry", "ref": "r.example/a:1", "credentials": [None]}), "base.credentials[0]", "string"),
    ('{"base":{"kind":"debian","python_version":"3.11"},"steps":{}}', "steps", "must be a list"),
    (_spec("run"), "steps[0]", "must be an object"),
    (_spec({"args": ["true"]}), "steps[0].op", "is missing"),
    (_spec({"op": "add"}), "steps[0].op", "apt, pip, run, env, workdir, copy"),
    (_spec({"op": "run", "args": ["true"], "shell": "bash"}), "steps[0].shell", "is not a field"),
    (_spec({"op": "run"}), "steps[0].args", "exactly one shell command"),
    (_spec({"op": "run", "args": ["a", "b"]}), "steps[0].args", "exactly one shell command"),
    (_spec({"op": "run", "args": ["   "]}), "steps[0].args[0]", "blank"),
    (_spec({"op": "run", "args": ["a\u0000b"]}), "steps[0].args[0]", "NUL"),
    (_spec({"op": "run", "args": ["x" * (MAX_COMMAND_BYTES + 1)]}), "steps[0].args[0]", "at most 65536"),
    (_spec({"op": "run", "args": [1]}), "steps[0].args[0]", "must be a string"),
    (_spec({"op": "run", "args": ["\ud800"]}), "steps[0].args[0]", "lone surrogate"),
    (_spec({"op": "run", "args": ["true"], "content": DIGEST}), "steps[0].content", "only copy steps"),
    (_spec({"op": "run", "args": ["true"], "index_url": "https://x.example"}), "steps[0].index_url", "only pip"),
    (_spec({"op": "run", "args": ["true"], "secrets": ["bad-name"]}), "steps[0].secrets[0]", "not a secret name"),
    (_spec({"op": "apt"}), "steps[0].args", "at least one package"),
    (_spec({"op": "apt", "args": ["Jq"]}), "steps[0].args[0]", "[a-z0-9][a-z0-9+.-]+"),
    (_spec({"op": "apt", "args": ["jq; rm -rf /"]}), "steps[0].args[0]", "not a Debian package"),
    (_spec({"op": "apt", "args": ["jq=latest"]}), "steps[0].args[0]", "=version"),
    (_spec({"op": "pip", "args": ["six", ""]}), "steps[0].args[1]", "is empty"),
    (_spec({"op": "pip", "args": ["six\nnumpy"]}), "steps[0].args[0]", "one requirement each"),
    (_spec({"op": "pip", "args": [" six"]}), "steps[0].args[0]", "whitespace"),
    (_spec({"op": "pip", "args": ["--index-url=http://evil"]}), "steps[0].args[0]", "index_url"),
    (_spec({"op": "pip", "args": ["x" * 501]}), "steps[0].args[0]", "at most 500"),
    (_spec({"op": "pip", "args": ["six"], "index_url": "ftp://x"}), "steps[0].index_url", "http(s)://"),
    (_spec({"op": "pip", "args": ["six"], "index_url": "https://a b"}), "steps[0].index_url", "whitespace"),
    (_spec({"op": "env"}), "steps[0].env", "at least one variable"),
    (_spec({"op": "env", "env": {"A": "b"}}), "steps[0].env", "[name, value] pairs"),
    (_spec({"op": "env", "env": [["A"]]}), "steps[0].env[0]", "pair of strings"),
    (_spec({"op": "env", "env": [["1A", "x"]]}), "steps[0].env[0][0]", "not a variable name"),
    (_spec({"op": "env", "env": [["A", "x\ny"]]}), "steps[0].env[0][1]", "NUL or newline"),
    (_spec({"op": "env", "env": [["A", "x"]], "args": ["y"]}), "steps[0].args", "only apt, pip, run, workdir, copy"),
    (_spec({"op": "env", "env": [["A", "x"]], "secrets": ["S"]}), "steps[0].secrets", "only apt, pip, run"),
    (_spec({"op": "workdir", "args": ["app"]}), "steps[0].args[0]", "not absolute"),
    (_spec({"op": "workdir", "args": ["/app/"]}), "steps[0].args[0]", "write '/app'"),
    (_spec({"op": "workdir", "args": ["/a/../b"]}), "steps[0].args[0]", "write '/b'"),
    (_spec({"op": "workdir", "args": ["//app"]}), "steps[0].args[0]", "write '/app'"),
    (_spec({"op": "workdir", "args": ["/a\nb"]}), "steps[0].args[0]", "NUL or newline"),
    (_spec({"op": "workdir", "args": []}), "steps[0].args", "exactly one path"),
    (_spec({"op": "copy", "args": ["/app"]}), "steps[0].content", "needs the sha256"),
    (_spec({"op": "copy", "args": ["/app"], "content": "sha256:XYZ"}), "steps[0].content", "64 lowercase hex"),
    (_spec({"op": "copy", "content": DIGEST}), "steps[0].args", "exactly one path"),
    (_spec(*[{"op": "run", "args": ["true"]}] * (MAX_STEPS + 1)), "steps", "at most 200"),
]


@pytest.mark.parametrize(("text", "field", "words"), BAD, ids=[f"{f}:{w}" for _, f, w in BAD])
def test_from_json_refuses_each_bad_field_naming_it(text: str, field: str, words: str) -> None:
    with pytest.raises(BlueprintError) as caught:
        BuildSpec.from_json(text)
    assert caught.value.field == field, str(caught.value)
    assert words in caught.value.problem, str(caught.value)
    assert str(caught.value).startswith(f"{field}: ")


def test_a_long_refused_value_is_cut_short_in_the_message() -> None:
    with pytest.raises(BlueprintError) as caught:
        Step("apt", ("A" * 10_000,))
    assert len(str(caught.value)) < 400


def test_constructors_check_types_too() -> None:
    with pytest.raises(BlueprintError, match="args: must be a tuple"):
        Step("run", ["true"])  # type: ignore[arg-type]
    with pytest.raises(BlueprintError, match="steps: must be a tuple of Step"):
        BuildSpec(Base("debian", "3.11"), [Step("run", ("true",))])  # type: ignore[arg-type]


def test_accepted_edges() -> None:
    Base("registry", ref="localhost/a:1")
    Base("registry", ref="10.0.0.1:5000/a/b-c__d.e:v1.2_3")
    Base("registry", ref="r.example/a:1@sha256:" + "0" * 64)
    Base("registry", ref="r.example/a@sha256:" + "0" * 64)
    Step("workdir", ("/",))
    Step("apt", ("g++", "libc6=2.36-9+deb12u7", "lib32z1=1:1.2.13.dfsg-1"))
    Step("pip", ("./local/pkg",))
    Step("run", ("x" * MAX_COMMAND_BYTES,))
    BuildSpec(Base("debian", "3.13"), tuple([Step("run", ("true",))] * MAX_STEPS))


# Hypothesis: any valid spec survives the trip through its canonical JSON unchanged

_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\n\r"), min_size=1, max_size=20)
_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)
_secrets = st.lists(_names, max_size=3, unique=True).map(tuple)
_paths = st.lists(st.from_regex(r"[a-z0-9_]{1,8}", fullmatch=True), max_size=3).map(lambda p: "/" + "/".join(p))
_packages = st.lists(st.from_regex(r"[a-z0-9][a-z0-9+.-]{1,10}(=[0-9][a-z0-9.+~:-]{0,5})?", fullmatch=True), min_size=1)
_requirements = st.lists(_text.filter(lambda t: t == t.strip() and not t.startswith("-")), min_size=1, max_size=4)
_steps = st.one_of(
    st.builds(lambda a, s: Step("apt", tuple(a), secrets=s), _packages, _secrets),
    st.builds(
        lambda a, s, u: Step("pip", tuple(a), secrets=s, index_url=u),
        _requirements,
        _secrets,
        st.none() | st.from_regex(r"https://[a-z]{1,8}\.example/[a-z/]{0,8}", fullmatch=True),
    ),
    st.builds(lambda c, s: Step("run", (c,), secrets=s), _text.filter(str.strip), _secrets),
    st.builds(
        lambda e: Step("env", env=tuple(e)),
        st.lists(
            st.tuples(_names, st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0\n\r"))),
            min_size=1,
            max_size=3,
        ),
    ),
    st.builds(lambda p: Step("workdir", (p,)), _paths),
    st.builds(
        lambda p, h: Step("copy", (p,), content="sha256:" + h), _paths, st.from_regex(r"[0-9a-f]{64}", fullmatch=True)
    ),
)
_bases = st.one_of(
    st.builds(lambda v: Base("debian", python_version=v), st.sampled_from(["3.8", "3.11", "3.13", "3.0"])),
    st.builds(
        lambda r, v, c: Base("registry", python_version=v, ref=r, credentials=c),
        st.from_regex(
            r"[a-z]{1,6}\.example(:[0-9]{2,4})?(/[a-z0-9]{1,5}){1,3}:[a-z0-9_][a-z0-9_.-]{0,5}", fullmatch=True
        ),
        st.none() | st.sampled_from(["3.11", "3.12"]),
        _secrets,
    ),
)


@settings(max_examples=300, deadline=None)
@given(_bases, st.lists(_steps, max_size=8).map(tuple))
def test_from_json_of_to_json_is_the_spec(base: Base, steps: tuple[Step, ...]) -> None:
    spec = BuildSpec(base, steps)
    assert BuildSpec.from_json(spec.to_json()) == spec
    assert BuildSpec.from_json(spec.to_json()).to_json() == spec.to_json()
