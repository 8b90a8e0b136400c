"""``levers9.Blueprint``: each method's step, their order, and the errors that name what was wrong."""

from __future__ import annotations

import hashlib
import io
import os
import re
import tarfile
from pathlib import Path

import pytest

import levers9
from levers9.blueprints.spec import Base, BlueprintError, BuildSpec, Step, keys
from levers9.sdk.blueprint import DEFAULT_PYTHON, Blueprint, PythonVersion


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_issue_s_example_in_order() -> None:
    image = (
        levers9.Blueprint(python_version="3.11")
        .apt_install(["jq"])
        .add_python_packages(["six"])
        .add_commands(["echo hi > /built"])
    )
    assert image.spec() == BuildSpec(
        Base("debian", "3.11"),
        (Step("apt", ("jq",)), Step("pip", ("six",)), Step("run", ("echo hi > /built",))),
    )
    assert image.key == keys(image.spec())[-1]
    assert levers9.Blueprint is Blueprint


def test_the_constructor_adds_env_then_packages_then_commands_and_methods_follow_in_call_order() -> None:
    image = Blueprint(commands=["c1", "c2"], python_packages=["p1", "p2"], env_vars={"A": "1"})
    image.add_commands(["c3"]).add_python_packages(["p3"]).with_envs("B=2").apt_install("jq")
    assert image.spec().steps == (
        Step("env", env=(("A", "1"),)),
        Step("pip", ("p1", "p2")),
        Step("run", ("c1",)),
        Step("run", ("c2",)),
        Step("run", ("c3",)),
        Step("pip", ("p3",)),
        Step("env", env=(("B", "2"),)),
        Step("apt", ("jq",)),
    )


@pytest.mark.parametrize(
    ("given", "version"),
    [
        ("3.11", "3.11"),
        ("python3.13", "3.13"),
        (PythonVersion.Python312, "3.12"),
        ("python3", DEFAULT_PYTHON),
        (PythonVersion.Python3, DEFAULT_PYTHON),
    ],
)
def test_python_version_forms(given: str, version: str) -> None:
    assert Blueprint(python_version=given).spec().base == Base("debian", version)
    assert Blueprint().add_python_version(given).spec().base == Base("debian", version)


@pytest.mark.parametrize("given", ["2.7", "python", "micromamba3.11", "3.11.2", ""])
def test_a_bad_python_version_is_refused_saying_what_is_accepted(given: str) -> None:
    with pytest.raises(BlueprintError, match=r"^python_version: .* write '3.11', 'python3.11' or 'python3'"):
        Blueprint(python_version=given)


def test_a_registry_base_its_credentials_and_python() -> None:
    image = Blueprint.from_registry("registry.example:5000/team/py:3.11", credentials=["REG_USER", "REG_PASS"])
    assert image.spec().base == Base(
        "registry", ref="registry.example:5000/team/py:3.11", credentials=("REG_USER", "REG_PASS")
    )
    image = Blueprint(python_version="3.12", base_image="registry.example/a:1")
    assert image.spec().base == Base("registry", python_version="3.12", ref="registry.example/a:1")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"base_image": "python:3.11"}, "base_image: 'python:3.11' names no registry host"),
        ({"base_image": "r.example/a"}, "base_image: 'r.example/a' has neither a tag nor a digest"),
        (
            {"base_image": "r.example/a:1", "base_image_creds": {"USER": "me", "PASS": "x"}},
            "base_image_creds: takes the names of workspace secrets, not values",
        ),
        ({"base_image_creds": ["A"]}, "base_image_creds: only a base_image has registry credentials"),
        ({"base_image": "r.example/a:1", "base_image_creds": ["bad-name"]}, "base_image_creds[0]: 'bad-name'"),
        ({"base_image": "r.example/a:1", "base_image_creds": ["A", "A"]}, "base_image_creds[1]: 'A' is named twice"),
    ],
)
def test_base_errors_name_the_argument(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(BlueprintError) as caught:
        Blueprint(**kwargs)  # type: ignore[arg-type]
    assert str(caught.value).startswith(message), str(caught.value)


def test_a_credential_value_is_never_in_the_message() -> None:
    with pytest.raises(BlueprintError) as caught:
        Blueprint(base_image="r.example/a:1", base_image_creds={"USER": "hunter2"})  # type: ignore[arg-type]
    assert "hunter2" not in str(caught.value)


def test_with_envs_forms_and_clear() -> None:
    image = Blueprint(env_vars="A=1").with_envs(["B=2", "C=x=y", "EMPTY="]).with_envs({"D": "4"})
    image.add_commands(["true"])
    assert [s.env for s in image.spec().steps if s.op == "env"] == [
        (("A", "1"),),
        (("B", "2"), ("C", "x=y"), ("EMPTY", "")),
        (("D", "4"),),
    ]
    image.with_envs({"E": "5"}, clear=True)
    assert image.spec().steps == (Step("run", ("true",)), Step("env", env=(("E", "5"),)))


@pytest.mark.parametrize(
    ("env_vars", "message"),
    [
        ("NOEQUALS", "env_vars['NOEQUALS']: has no '=': write NAME=value"),
        (["A=1", "1A=x"], "env_vars['1A=x']: '1A' is not a variable name"),
        (["=x"], "env_vars['=x']: '' is not a variable name"),
        ({"MY-VAR": "x"}, "env_vars['MY-VAR']: 'MY-VAR' is not a variable name"),
        ({"A": "two\nlines"}, "env_vars['A']: the value of A holds a NUL or newline"),
        ({"A": 1}, "env_vars['A']: names and values must be strings"),
        (7, "env_vars: must be a list of 'NAME=value' strings, not int"),
    ],
)
def test_env_validation_messages(env_vars: object, message: str) -> None:
    with pytest.raises(BlueprintError) as caught:
        Blueprint().with_envs(env_vars)  # type: ignore[arg-type]
    assert str(caught.value).startswith(message), str(caught.value)
    with pytest.raises(BlueprintError):
        Blueprint(env_vars=env_vars)  # type: ignore[arg-type]


def test_secrets_reach_the_later_run_pip_and_apt_steps_and_per_command_ones_those_alone() -> None:
    image = (
        Blueprint()
        .add_commands(["before"])
        .with_secrets(["TOKEN"])
        .add_commands(["one"], secrets=["EXTRA"])
        .add_python_packages(["six"])
        .apt_install(["jq"])
        .with_envs("A=1")
        .with_secrets("TOKEN")
        .add_commands("after")
    )
    assert [(s.op, s.secrets) for s in image.spec().steps] == [
        ("run", ()),
        ("run", ("EXTRA", "TOKEN")),
        ("pip", ("TOKEN",)),
        ("apt", ("TOKEN",)),
        ("env", ()),
        ("run", ("TOKEN",)),
    ]
    with pytest.raises(BlueprintError, match=r"^secrets\[0\]: 'no-dash' is not a secret name"):
        Blueprint().with_secrets(["no-dash"])
    with pytest.raises(BlueprintError, match=r"^secrets\[1\]: '1X'"):
        Blueprint().add_commands(["x"], secrets=["OK", "1X"])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda b: b.add_python_packages(["six", " "]), "packages[1]: is empty"),
        (lambda b: b.add_python_packages(["six", "-e ."]), "packages[1]: '-e .' is a pip option"),
        (lambda b: b.add_python_packages([3]), "packages[0]: must be a string"),
        (lambda b: b.apt_install(["jq", "Bad"]), "packages[1]: 'Bad' is not a Debian package"),
        (lambda b: b.add_commands(["ok", "  "]), "commands[1]: the command is blank"),
        (lambda b: b.add_commands(["a\0b"]), "commands[0]: the command holds a NUL"),
        (lambda b: Blueprint(python_packages=["ok", "a\nb"]), "python_packages[1]: 'a\\nb' holds a NUL or newline"),
        (lambda b: Blueprint(commands=[""]), "commands[0]: is empty"),
    ],
)
def test_step_errors_name_the_argument_and_its_index(call: object, message: str) -> None:
    with pytest.raises(BlueprintError) as caught:
        call(Blueprint())  # type: ignore[operator]
    assert str(caught.value).startswith(message), str(caught.value)


def test_empty_lists_add_no_step() -> None:
    assert Blueprint().add_python_packages([]).apt_install([]).add_commands([]).with_envs([]).spec().steps == ()


def test_a_requirements_file_with_comments_continuations_includes_and_an_index(in_tmp: Path) -> None:
    (in_tmp / "base.txt").write_text("requests==2.32.3  # pinned\n")
    (in_tmp / "requirements.txt").write_text(
        "# the app\n"
        "\n"
        "six\n"
        "numpy>=1.26; python_version >= '3.9'\n"
        "-r base.txt\n"
        "--index-url https://pypi.example/simple\n"
        "long-name-\\\n"
        "continued\n"
    )
    image = Blueprint(python_packages="requirements.txt")
    assert image.spec().steps == (
        Step(
            "pip",
            ("six", "numpy>=1.26; python_version >= '3.9'", "requests==2.32.3", "long-name-continued"),
            index_url="https://pypi.example/simple",
        ),
    )
    assert Blueprint().add_python_packages("requirements.txt").spec() == image.spec()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("six\n-e .\n", "packages: {req} line 2: -e is not supported in a blueprint's requirements"),
        ("--extra-index-url https://x.example\n", "packages: {req} line 1: --extra-index-url is not supported"),
        ("six --hash=sha256:abc\n", "packages: {req} line 1: --hash after a requirement is not supported"),
        ("-i https://a.example\n-i https://b.example\n", "packages: {req} line 2: a second index"),
        ("-r requirements.txt\n", "packages: {req} includes itself"),
        ("-r missing.txt\n", "packages: the requirements file missing.txt does not exist"),
    ],
)
def test_requirements_file_errors_name_the_file_and_line(in_tmp: Path, content: str, message: str) -> None:
    (in_tmp / "requirements.txt").write_text(content)
    with pytest.raises(BlueprintError) as caught:
        Blueprint().add_python_packages("requirements.txt")
    assert str(caught.value).startswith(message.format(req="requirements.txt", dir=".")), str(caught.value)


def test_a_missing_or_unreadable_requirements_file_is_named(in_tmp: Path) -> None:
    with pytest.raises(BlueprintError, match=r"^python_packages: the requirements file nope\.txt does not exist"):
        Blueprint(python_packages="nope.txt")
    (in_tmp / "dir.txt").mkdir()
    with pytest.raises(BlueprintError, match=r"^packages: cannot read the requirements file dir\.txt: Is a directory"):
        Blueprint().add_python_packages("dir.txt")
    (in_tmp / "latin1.txt").write_bytes(b"caf\xe9\n")
    with pytest.raises(BlueprintError, match=r"latin1\.txt: it is not UTF-8 text"):
        Blueprint().add_python_packages("latin1.txt")


def _tar_names(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [m.name for m in tar.getmembers()]


def test_add_local_path_copies_what_matches_under_app_keeping_relative_paths(in_tmp: Path) -> None:
    (in_tmp / "src" / "pkg").mkdir(parents=True)
    (in_tmp / "src" / "pkg" / "m.py").write_text("m")
    (in_tmp / "src" / "notes.txt").write_text("n")
    (in_tmp / "main.py").write_text("main")
    (in_tmp / ".env").write_text("KEY=v")
    image = Blueprint().add_local_path("src/**/*.py").add_local_path("*", remote_path="/srv/all")
    steps = image.spec().steps
    assert [(s.op, s.args) for s in steps] == [("copy", ("/app",)), ("copy", ("/srv/all",))]
    files = image.local_files()
    assert set(files) == {s.content for s in steps}
    first, second = (files[s.content or ""].tar() for s in steps)
    assert _tar_names(first) == ["src", "src/pkg", "src/pkg/m.py"]
    assert _tar_names(second) == ["main.py", "src", "src/notes.txt", "src/pkg", "src/pkg/m.py"]
    assert ".env" not in _tar_names(second), "* matches no dotfile, as in a shell"
    for step in steps:
        data = files[step.content or ""].tar()
        assert step.content == "sha256:" + hashlib.sha256(data).hexdigest()
    assert _tar_names(Blueprint().add_local_path(".env").local_files().popitem()[1].tar()) == [".env"]


def test_a_local_file_s_content_changes_the_key_and_its_mtime_does_not(in_tmp: Path) -> None:
    (in_tmp / "app.py").write_text("v1")
    image = Blueprint().add_commands(["true"]).add_local_path("app.py").add_commands(["after"])
    first = keys(image.spec())
    os.utime(in_tmp / "app.py", (1, 1))
    assert keys(image.spec()) == first
    (in_tmp / "app.py").write_text("v2")
    second = keys(image.spec())
    assert second[:2] == first[:2]
    assert second[2] != first[2]
    assert second[3] != first[3]


@pytest.mark.parametrize(
    ("pattern", "remote", "message"),
    [
        ("../x", None, "pattern: '../x' must be relative to the current directory and inside it"),
        ("/etc/passwd", None, "pattern: '/etc/passwd' must be relative"),
        ("", None, "pattern: must be a non-empty glob"),
        ("*", "app", "remote_path: 'app' is not absolute"),
        ("*", "/app/", "remote_path: '/app/' is not normalized: write '/app'"),
    ],
)
def test_add_local_path_errors(in_tmp: Path, pattern: str, remote: str | None, message: str) -> None:
    (in_tmp / "a.py").write_text("a")
    with pytest.raises(BlueprintError) as caught:
        Blueprint().add_local_path(pattern, remote_path=remote)
    assert str(caught.value).startswith(message.format(dir=in_tmp)), str(caught.value)


@pytest.mark.parametrize("pattern", ["missing.py", "*.none"])
def test_files_are_looked_for_when_the_spec_is_made_not_when_added(in_tmp: Path, pattern: str) -> None:
    # a module making its blueprint where the files are not (a container importing it) does not fail
    image = Blueprint().add_local_path(pattern)
    with pytest.raises(BlueprintError, match=rf"^pattern: '{re.escape(pattern)}' matches nothing in {in_tmp}"):
        image.spec()
    (in_tmp / "missing.py").write_text("here now")
    if pattern == "missing.py":
        assert image.spec().steps[0].op == "copy"


def test_a_local_file_removed_after_it_was_added_is_named_when_the_spec_is_made(in_tmp: Path) -> None:
    (in_tmp / "a.py").write_text("a")
    image = Blueprint().add_local_path("a.py")
    image.spec()
    (in_tmp / "a.py").unlink()
    with pytest.raises(BlueprintError, match=r"^pattern: 'a.py' matches nothing"):
        image.spec()


def test_from_dockerfile_and_chaining(tmp_path: Path) -> None:
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "app.py").write_text("print()")
    (tmp_path / "Dockerfile").write_text(
        "FROM registry.example/team/py:3.11\nENV A=1\nCOPY app.py /app/\nRUN echo built\n"
    )
    image = Blueprint.from_dockerfile(tmp_path / "Dockerfile", context_dir=tmp_path / "ctx")
    image.add_python_packages(["six"])
    spec = image.spec()
    assert spec.base == Base("registry", ref="registry.example/team/py:3.11")
    assert [s.op for s in spec.steps] == ["env", "copy", "run", "pip"]
    (digest,) = image.local_files()
    assert spec.steps[1].content == digest
    assert _tar_names(image.local_files()[digest].tar()) == ["app.py"]


def test_from_dockerfile_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(BlueprintError, match=f"^path: the Dockerfile {tmp_path / 'nope'} does not exist"):
        Blueprint.from_dockerfile(tmp_path / "nope")
    (tmp_path / "Dockerfile").write_text('FROM registry.example/a:1\nCMD ["python"]\n')
    with pytest.raises(BlueprintError, match=rf"^{tmp_path / 'Dockerfile'} line 2 \(CMD\): CMD is not supported"):
        Blueprint.from_dockerfile(str(tmp_path / "Dockerfile"))
    with pytest.raises(BlueprintError, match=r"^context_dir: .* is not a directory"):
        Blueprint.from_dockerfile(tmp_path / "Dockerfile", context_dir=tmp_path / "none")


def test_equality_is_the_spec_and_a_blueprint_is_not_hashable() -> None:
    assert Blueprint().add_commands(["a"]) == Blueprint(python_version="3.11", commands=["a"])
    assert Blueprint().add_commands(["a"]) != Blueprint().add_commands(["b"])
    assert Blueprint(base_image="r.example/a:1") != Blueprint(base_image="r.example/a:1", base_image_creds=["U"])
    assert (
        Blueprint(base_image="r.example/a:1").key == Blueprint(base_image="r.example/a:1", base_image_creds=["U"]).key
    )
    assert Blueprint() != "python3.11"
    with pytest.raises(TypeError):
        hash(Blueprint())


def test_too_many_steps_is_refused_when_the_spec_is_made() -> None:
    image = Blueprint().add_commands([f"echo {i}" for i in range(201)])
    with pytest.raises(BlueprintError, match=r"^steps: 201 steps; at most 200"):
        image.spec()
