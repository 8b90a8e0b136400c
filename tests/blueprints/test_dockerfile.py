"""The Dockerfile subset: each supported instruction becomes its step; everything else is refused by line."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from levers9.blueprints.context import LocalCopy
from levers9.blueprints.dockerfile import parse_dockerfile
from levers9.blueprints.spec import Base, BlueprintError, Step

FROM = "FROM registry.example:5000/team/py:3.11\n"


def _parse(text: str, context: Path | None = None) -> list[Step | LocalCopy]:
    base, steps = parse_dockerfile(text, context or Path("/nonexistent"))
    assert base == Base("registry", ref="registry.example:5000/team/py:3.11")
    return steps


def _refused(text: str, context: Path | None = None) -> BlueprintError:
    with pytest.raises(BlueprintError) as caught:
        parse_dockerfile(text, context or Path("/nonexistent"))
    return caught.value


def _copy_names(copy: Step | LocalCopy) -> tuple[str, list[str], dict[str, bytes]]:
    assert isinstance(copy, LocalCopy)
    with tarfile.open(fileobj=io.BytesIO(copy.files.tar())) as tar:
        contents = {}
        for m in tar.getmembers():
            f = tar.extractfile(m) if m.isfile() else None
            if f is not None:
                contents[m.name] = f.read()
        return copy.dest, [m.name for m in tar.getmembers()], contents


def test_from_with_a_digest_and_a_stage_name() -> None:
    ref = "registry.example/team/py@sha256:" + "a" * 64
    base, steps = parse_dockerfile(f"from {ref} AS build\n", Path("."))
    assert base == Base("registry", ref=ref)
    assert steps == []


def test_run_in_shell_form_with_continuations_comments_and_blank_lines() -> None:
    text = FROM + (
        "# a comment\n"
        "\n"
        "RUN apt-get update && \\\n"
        "    # a comment inside the continuation is dropped\n"
        "\n"
        "    apt-get install -y jq \\\n"
        '    && echo "$HOME" > /home.txt\n'
        "run echo lower-case instruction\n"
    )
    assert _parse(text) == [
        Step("run", ('apt-get update &&     apt-get install -y jq     && echo "$HOME" > /home.txt',)),
        Step("run", ("echo lower-case instruction",)),
    ]


def test_run_in_exec_form_is_quoted_so_the_shell_expands_nothing() -> None:
    steps = _parse(FROM + 'RUN ["echo", "$HOME", "two words"]\nRUN [not json\n')
    assert steps == [Step("run", ("echo '$HOME' 'two words'",)), Step("run", ("[not json",))]


def test_env_in_both_forms_with_quotes_and_earlier_variables() -> None:
    text = FROM + (
        "ENV A=1 B=\"two words\" C='$A stays' D=a\\ b\nENV LEGACY the rest of the line\nENV E=${A}-$B F=$LEGACY\n"
    )
    assert _parse(text) == [
        Step("env", env=(("A", "1"), ("B", "two words"), ("C", "$A stays"), ("D", "a b"))),
        Step("env", env=(("LEGACY", "the rest of the line"),)),
        Step("env", env=(("E", "1-two words"), ("F", "the rest of the line"))),
    ]


def test_workdir_relative_to_the_one_before() -> None:
    text = FROM + "WORKDIR /srv\nWORKDIR app\nWORKDIR ../other/./x\nENV D=/opt\nWORKDIR $D/y\n"
    steps = _parse(text)
    assert [s.args for s in steps if isinstance(s, Step) and s.op == "workdir"] == [
        ("/srv",),
        ("/srv/app",),
        ("/srv/other/x",),
        ("/opt/y",),
    ]


def test_copy_a_directory_a_file_renamed_a_glob_and_relative_to_the_workdir(tmp_path: Path) -> None:
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "m.py").write_text("m")
    (tmp_path / "src" / "main.py").write_text("main")
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / ".hidden.txt").write_text("h")
    text = FROM + (
        "WORKDIR /app\n"
        "COPY src .\n"
        "COPY a.txt /etc/renamed.conf\n"
        "COPY *.txt data/\n"
        'COPY ["a.txt", "src/main.py", "/multi/"]\n'
    )
    steps = _parse(text, tmp_path)
    assert _copy_names(steps[1]) == ("/app", ["main.py", "pkg", "pkg/m.py"], {"main.py": b"main", "pkg/m.py": b"m"})
    assert _copy_names(steps[2]) == ("/etc", ["renamed.conf"], {"renamed.conf": b"a"})
    assert _copy_names(steps[3]) == (
        "/app/data",
        [".hidden.txt", "a.txt"],
        {".hidden.txt": b"h", "a.txt": b"a"},
    )
    assert _copy_names(steps[4]) == ("/multi", ["a.txt", "main.py"], {"a.txt": b"a", "main.py": b"main"})
    for step in steps[1:]:
        assert isinstance(step, LocalCopy)
        assert step.step().op == "copy"


REFUSED = [
    "ADD a.tar /",
    "ARG VERSION=1",
    'CMD ["python"]',
    'ENTRYPOINT ["python"]',
    "USER nobody",
    "EXPOSE 80",
    "VOLUME /data",
    "LABEL a=b",
    "HEALTHCHECK NONE",
    "ONBUILD RUN true",
    'SHELL ["/bin/bash", "-c"]',
    "STOPSIGNAL SIGTERM",
    "MAINTAINER me",
]


@pytest.mark.parametrize("line", REFUSED)
def test_every_other_instruction_is_refused_naming_its_line_and_what_is_supported(line: str) -> None:
    error = _refused(FROM + "RUN true\n" + line + "\n")
    instruction = line.split()[0]
    assert error.field == f"Dockerfile line 3 ({instruction})"
    assert (
        error.problem
        == f"{instruction} is not supported: a blueprint's Dockerfile may use FROM, RUN, ENV, WORKDIR, COPY"
    )


def test_an_unknown_word_is_refused_as_not_an_instruction() -> None:
    error = _refused(FROM + "FROBNICATE x\n")
    assert "FROBNICATE (not a Dockerfile instruction) is not supported" in str(error)


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ("RUN true\n", "Dockerfile line 1 (RUN)", "the first instruction must be FROM"),
        ("", "Dockerfile", "has no FROM instruction"),
        ("# only a comment\n", "Dockerfile", "has no FROM instruction"),
        ("FROM scratch\n", "Dockerfile line 1 (FROM)", "FROM scratch is not supported"),
        ("FROM python:3.11\n", "Dockerfile line 1 (FROM)", "ref: 'python:3.11' names no registry host"),
        ("FROM --platform=linux/arm64 r.example/a:1\n", "Dockerfile line 1 (FROM)", "FROM --platform is not supported"),
        (FROM + FROM, "Dockerfile line 2 (FROM)", "multi-stage builds are not supported"),
        (FROM + "RUN --mount=type=cache,target=/c true\n", "Dockerfile line 2 (RUN)", "RUN --mount is not supported"),
        (FROM + "RUN\n", "Dockerfile line 2 (RUN)", "RUN needs an argument"),
        (FROM + "RUN []\n", "Dockerfile line 2 (RUN)", "names no program"),
        (FROM + "ENV PATH=/opt/bin:$PATH\n", "Dockerfile line 2 (ENV)", "$PATH is not set by an earlier ENV"),
        (FROM + "ENV A=${B:-x}\n", "Dockerfile line 2 (ENV)", "is not supported: only $NAME and ${NAME}"),
        (FROM + "ENV A=1 B\n", "Dockerfile line 2 (ENV)", "'B' is not NAME=value"),
        (FROM + "ENV A\n", "Dockerfile line 2 (ENV)", "ENV A has no value"),
        (FROM + "ENV 1A=x\n", "Dockerfile line 2 (ENV)", "'1A' is not a variable name"),
        (FROM + 'ENV A="open\n', "Dockerfile line 2 (ENV)", 'a " quote is not closed'),
        (FROM + "WORKDIR /a b\n", "Dockerfile line 2 (WORKDIR)", "WORKDIR takes one path, not 2"),
        (FROM + "COPY --from=build /x /y\n", "Dockerfile line 2 (COPY)", "COPY --from is not supported: copying from"),
        (FROM + "COPY --chown=1:1 a /y\n", "Dockerfile line 2 (COPY)", "COPY --chown is not supported: files are"),
        (FROM + "COPY a\n", "Dockerfile line 2 (COPY)", "write COPY <source>... <destination>"),
        ("# escape=`\n" + FROM, "Dockerfile line 1", "the escape directive '`' is not supported"),
    ],
)
def test_bad_lines_are_refused_naming_the_line(text: str, field: str, words: str) -> None:
    error = _refused(text)
    assert error.field == field, str(error)
    assert words in error.problem, str(error)


def test_the_line_named_is_the_first_of_a_continued_instruction() -> None:
    error = _refused(FROM + "RUN a \\\n  b\nRUN c \\\n\n   d\nADD \\\n  x /\n")
    assert error.field == "Dockerfile line 7 (ADD)"


def test_a_continuation_on_the_last_line_ends_the_instruction() -> None:
    assert _parse(FROM + "RUN echo a \\") == [Step("run", ("echo a",))]


def test_copy_sources_must_exist_and_stay_inside_the_context(tmp_path: Path) -> None:
    context = tmp_path / "ctx"
    context.mkdir()
    (tmp_path / "secret").write_text("s")
    (context / "out").symlink_to(tmp_path)
    (context / "link").symlink_to(tmp_path / "secret")
    assert "'missing' does not exist in the context directory" in str(_refused(FROM + "COPY missing /x\n", context))
    assert "'*.none' matches nothing" in str(_refused(FROM + "COPY *.none /x/\n", context))
    assert "'../secret' is outside the context directory" in str(_refused(FROM + "COPY ../secret /x\n", context))
    assert "leads outside the context directory" in str(_refused(FROM + "COPY out/secret /x\n", context))
    # a symlink named itself is copied as the link it is
    copy = _parse(FROM + "COPY link /x/\n", context)[0]
    assert isinstance(copy, LocalCopy)
    with tarfile.open(fileobj=io.BytesIO(copy.files.tar())) as tar:
        (member,) = tar.getmembers()
        assert member.issym()
        assert member.linkname == str(tmp_path / "secret")


def test_a_dockerignore_is_refused_rather_than_ignored(tmp_path: Path) -> None:
    (tmp_path / ".dockerignore").write_text(".env\n")
    (tmp_path / ".env").write_text("KEY=v")
    error = _refused(FROM + "COPY . /app\n", tmp_path)
    assert error.field == "Dockerfile line 2 (COPY)"
    assert ".dockerignore exists and is not read here" in error.problem
    assert _parse(FROM + "RUN true\n", tmp_path) == [Step("run", ("true",))]


def test_the_name_given_is_used_in_messages() -> None:
    with pytest.raises(BlueprintError, match=r"^docker/Dockerfile.dev line 2 \(ADD\): "):
        parse_dockerfile(FROM + "ADD x /\n", Path("."), name="docker/Dockerfile.dev")
