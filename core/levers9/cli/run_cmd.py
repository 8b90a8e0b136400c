"""``levers9 run FILE[::FUNCTION] [ARGS...]``: run a local app against a context's controlplane.

The app is ordinary Python that uses the SDK; this command only chooses the
context (through ``$LEVERS9_CONTEXT``, which the SDK reads, so code the app
starts inherits it too) and starts the app the way ``python FILE`` would: its
directory first on ``sys.path``, ``sys.argv`` its own. With ``::FUNCTION`` the
file is imported instead and that function called with the remaining arguments,
which saves writing an argument parser for a quick entry point: a levers9
function (``@levers9.function``) is called remotely, ``.remote(...)``, a plain
function in this process. Each argument is a Python literal (``7``, ``2.5``,
``'text'``, ``[1, 2]``, ``{"k": 1}``, ``True``, ``None``) or else the text as
it is; a parameter annotated ``str`` always gets the text; ``NAME=VALUE``
passes a keyword argument when NAME is one of the function's parameters.

Arguments after FILE belong to the app, options included, except ``-c`` and
``--context``; put ``--`` before the app's arguments when they use those too.

The SDK's client is told to announce itself (:data:`levers9.sdk.client.ANNOUNCE`):
when the app's first call is not connected within half a second, stderr says
which addresses it is connecting to, and a controlplane that is not there at
all (every address refusing) fails the app in seconds with a message saying
so, rather than after the context's ``reconnect_s``. A levers9
error the app does not catch (the context, the controlplane, a refused token, a
call that cannot be scheduled, a remote function that raised) is printed as one
``error:`` line, without a traceback through the SDK; ``--debug`` (or
``$LEVERS9_DEBUG=1``) prints the traceback too. Any other exception is the
app's own, and its traceback (the app's frames only) is printed as Python would.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any, NoReturn

import typer

from levers9.cli.client_cmds import context_option, resolve_context
from levers9.cli.output import err

#: click settings for the command: unknown options are the app's, not errors
CONTEXT_SETTINGS: dict[str, Any] = {"ignore_unknown_options": True}
#: print a levers9 error's traceback too (--debug, $LEVERS9_DEBUG)
DEBUG = False


def run(
    target: str = typer.Argument(
        ...,
        metavar="FILE[::FUNCTION]",
        help="The app file; with ::FUNCTION, a function in it to call (a levers9 function runs remotely).",
    ),
    args: list[str] | None = typer.Argument(
        None,
        metavar="ARGS",
        help="The app's arguments; for ::FUNCTION its arguments, each a Python literal (7, 'a b', [1, 2]) or else "
        "text, NAME=VALUE for a keyword argument; a parameter annotated str gets the text as typed.",
    ),
    context: str | None = context_option(),
    debug: bool = typer.Option(
        False, "--debug", help="On a levers9 error, print its traceback too (also $LEVERS9_DEBUG=1)."
    ),
) -> None:
    """Run a Python app that uses levers9, against the chosen context's controlplane.

    `levers9 run app.py` runs the file as `python app.py` would; `levers9 run app.py::square 7` calls square(7),
    remotely when square is a levers9 function, and prints what it returns."""
    import os

    from levers9.sdk.context import ENV_CONTEXT

    global DEBUG
    DEBUG = debug or os.environ.get("LEVERS9_DEBUG", "") not in ("", "0")

    app_args = list(args or [])
    file_text, _, function = target.rpartition("::") if "::" in target else (target, "", "")
    path = Path(file_text)
    if not file_text or not path.exists():
        fail(f"no such file: {file_text or target}")
    if function and not path.is_file():
        fail(f"{path} is not a file: FILE::FUNCTION imports a Python file")
    if context is not None:
        os.environ[ENV_CONTEXT] = resolve_context(context).name
    from levers9.sdk import client as sdk_client

    sdk_client.ANNOUNCE = True

    # As `python FILE` does: the app's own modules import, and argv is the app's.
    app_dir = path.resolve() if path.is_dir() else path.resolve().parent
    sys.path.insert(0, str(app_dir))
    sys.argv = [str(path), *app_args]

    if function:
        _call_function(path, function, app_args)
    else:
        _run_file(path)


def _run_file(path: Path) -> None:
    """Run the file as ``python FILE`` would, as ``__main__``."""
    import runpy

    try:
        runpy.run_path(str(path), run_name="__main__")
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except Exception as exc:
        _app_failed(exc)


def _call_function(path: Path, function: str, app_args: list[str]) -> None:
    """Import the file, call its ``function`` with the arguments as strings, print what it returns."""
    try:
        module = import_file(path)
    except typer.Exit:
        raise
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except Exception as exc:
        _app_failed(exc)
    target_fn = getattr(module, function, None)
    if target_fn is None:
        names = ", ".join(_functions(module)) or "none"
        fail(f"{path} has no function {function!r} (functions: {names})")
    if not callable(target_fn):
        fail(f"{path}: {function!r} is a {type(target_fn).__name__}, not a function")
    positional, keywords = _arguments(path, function, target_fn, app_args)
    remote = getattr(target_fn, "remote", None)
    call = remote if callable(remote) else target_fn
    try:
        result = call(*positional, **keywords)
        if _awaitable(result):
            import asyncio

            result = asyncio.run(_wait(result))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except Exception as exc:
        _app_failed(exc)
    if result is not None:
        print(result)


def import_file(path: Path) -> ModuleType:
    """Import ``path`` under its file name, so that ``if __name__ == "__main__"`` stays off."""
    import importlib
    import importlib.util

    name = path.stem
    resolved = path.resolve()
    existing = sys.modules.get(name)
    if existing is not None:
        existing_file = getattr(existing, "__file__", None)
        if existing_file is None or Path(existing_file).resolve() != resolved:
            fail(
                f"{path}: its module name {name!r} is already taken by {existing_file or 'a built-in module'}; rename the file"
            )
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        fail(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    # The app is not installed where its functions run: cloudpickle must send its code by
    # value, as it does for __main__, rather than by a module name the container cannot import.
    cloudpickle: Any = importlib.import_module("cloudpickle")
    cloudpickle.register_pickle_by_value(module)
    return module


def _arguments(path: Path, function: str, fn: Any, args: list[str]) -> tuple[list[Any], dict[str, Any]]:
    """The call's arguments from the command line's (see the module's doc), refused before the call when the
    function cannot take them, naming its signature."""
    import inspect

    try:
        signature: inspect.Signature | None = inspect.signature(getattr(fn, "fn", fn), eval_str=True)
    except (NameError, SyntaxError, TypeError, ValueError):
        try:
            signature = inspect.signature(getattr(fn, "fn", fn))
        except (TypeError, ValueError):
            signature = None  # no signature (a builtin, an odd callable): literals, and the call decides
    params = list(signature.parameters.values()) if signature is not None else []
    named = {p.name: p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    positional: list[Any] = []
    keywords: dict[str, Any] = {}
    for text in args:
        name, eq, value = text.partition("=")
        if eq and name in named:
            keywords[name] = _value(value, named[name])
            continue
        index = len(positional)
        fitting = (
            params[index]
            if index < len(params)
            and params[index].kind
            in (
                inspect.Parameter.POSITIONAL_ONLY,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
            )
            else next((p for p in params if p.kind is inspect.Parameter.VAR_POSITIONAL), None)
        )
        positional.append(_value(text, fitting))
    if signature is not None:
        try:
            signature.bind(*positional, **keywords)
        except TypeError as exc:
            fail(f"{path}::{function}{signature}: {exc} (given {len(args)}: {' '.join(args) or 'none'})")
    return positional, keywords


def _value(text: str, param: Any) -> Any:
    """``text`` as a Python literal, or as it is when it is none or the parameter is annotated ``str``."""
    import ast

    if param is not None and param.annotation in (str, "str"):
        return text
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text


def _functions(module: ModuleType) -> list[str]:
    """The public callables the module itself defines, for the 'no such function' message."""
    return sorted(
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and callable(value)
        and not isinstance(value, type)
        and getattr(value, "__module__", None) == module.__name__
    )


def _awaitable(value: Any) -> bool:
    import inspect

    return inspect.isawaitable(value)


async def _wait(awaitable: Any) -> Any:
    return await awaitable


def _app_failed(exc: BaseException) -> NoReturn:
    """Print the app's traceback without this command's frames above it, and exit 1.

    A controlplane that cannot be reached (or refuses the context's token) is the context's trouble, not the
    app's: its one message is printed alone, without the SDK's frames.
    """
    import traceback

    from levers9.hooks.errors import Levers9Error

    if isinstance(exc, Levers9Error):  # the context, the controlplane, the call: levers9's, not the app's bug
        if DEBUG:
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
        if type(exc).__name__ in ("ControlPlaneError", "ContextError"):
            fail(str(exc))  # where the controlplane is, or is not: the message is all there is to it
        fail(f"{type(exc).__name__}: {exc}" + ("" if DEBUG else " (--debug shows the traceback)"))

    traceback.print_exception(type(exc), exc, _app_frames(exc.__traceback__), file=sys.stderr)
    raise typer.Exit(1) from None


def _app_frames(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the first frame that is the app's; runpy and importlib frames are noise to its author."""
    import runpy

    ours = {str(Path(__file__).resolve()), str(Path(runpy.__file__).resolve())}
    current = tb
    while current is not None:
        filename = current.tb_frame.f_code.co_filename
        if not (filename.startswith("<frozen ") or str(Path(filename).resolve()) in ours):
            return current
        current = current.tb_next
    return None


def fail(message: str) -> NoReturn:
    err.print(f"error: {message}", markup=False)
    raise typer.Exit(1)
