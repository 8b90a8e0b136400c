"""Steps 4 and 5 of joining a box over SSH: the join token, the start script, and the service that runs it.

Where the files go is an :class:`~levers9.cli.machine_install.box.AgentLayout`: as root (or with sudo) the
state directory ``/var/lib/levers9/agent``, the scripts in
``/usr/local/lib/levers9``; as another user, all under ``~/.levers9``.

The start script (``<lib>/agent-start``) is what the service runs, every
time: with a saved credential (``<state>/agent.json``) it runs ``levers9
agent run``; without one, ``levers9 agent join --token-file
<state>/join-token``. The token file is written 0600 in the 0700 state
directory from the SSH channel's stdin (so the token is in no command line,
no unit, no script) and the start script deletes it as soon as the agent has
saved its credential, or when the agent exits with status 3 (the token was
refused: it is useless). It is kept only while the join has not happened yet
(the agent exited otherwise, for instance the controlplane was unreachable),
so that the next start tries again; the token expires anyway. Exit status 3
also means "do not restart": systemd has ``RestartPreventExitStatus=3`` and
the supervisor stops.

The service: a systemd unit (``Restart=always``) where systemd runs and we are
root; else a supervisor shell loop started with ``setsid nohup`` (it survives
logout, not a reboot: run ``levers9 machine create --ssh`` again then), with a
pid file and a log file, that restarts the start script when it exits with a
back-off of 1 s doubling to 30 s (reset after a minute of running).

Run again: a joined box whose service runs is left as it is; a joined box whose
service is down has it installed and started (``agent run``, no token); a box
not joined gets the new token and its service restarted to use it. A box whose
credential is of a machine the controlplane no longer has (``levers9 machine
remove``: the credential is revoked for good) is not joined any more: when the
caller says so (``is_live``), its service is stopped, the credential moved
aside to ``agent.json.replaced`` (never reused, never read again) and the box
joins with the new token. A credential for another controlplane is never
replaced (:class:`SshJoinError` says whose it is and how to free the box).
Without a join token (``machine create --ssh`` of a machine that exists
already) a box that is not joined is refused, since nothing could join it.
"""

from __future__ import annotations

import base64
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from levers9.cli.machine_install.box import AgentLayout, AgentSoftware, BoxFacts
from levers9.cli.machine_install.remote import STEPS, Remote, SshJoinError, SshJoinResult

__all__ = ["install", "start_script", "supervisor_script", "systemd_unit"]

_START_WAIT_S = 15
_STOP_WAIT_S = 20


def _agent_args(argv: tuple[str, ...], *args: str) -> str:
    return shlex.join([*argv, "agent", *args])


def start_script(layout: AgentLayout, software: AgentSoftware, box: BoxFacts, *, controlplane: str, ca_pem: str) -> str:
    """The script the service runs each time it starts the agent (no secret in it)."""
    q = shlex.quote
    state = layout.state_dir
    join = ["join", "--controlplane", controlplane]
    if controlplane.startswith("grpc://"):  # plain text: development only, and the agent refuses it unless told
        join.append("--insecure")
    if ca_pem:
        join += ["--ca-b64", base64.b64encode(ca_pem.encode()).decode()]
    join += ["--state-dir", state, "--token-file", layout.token_file]
    stop = 'kill -TERM "$agent" 2>/dev/null'
    cleanup = ""
    if software.container:
        stop = f"docker stop -t 10 {q(software.container)} >/dev/null 2>&1; {stop}"
        cleanup = f"docker rm -f {q(software.container)} >/dev/null 2>&1\n"
    return f"""#!/bin/sh
# The levers9 agent's start script, written by 'levers9 machine create --ssh'; its service runs it.
# With a saved credential it runs the agent; without one it joins with the one-use token file, deleted as soon
# as the credential is saved (or the token is refused: exit status 3, which also means: do not restart).
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH
export PATH
{box.env()}
state={q(state)}
token={q(layout.token_file)}
{cleanup}if [ -f "$state/agent.json" ]; then
  rm -f "$token"
  set -- {_agent_args(software.argv, "run", "--state-dir", state)}
elif [ -f "$token" ]; then
  set -- {_agent_args(software.argv, *join)}
else
  echo "levers9-agent: no credential in $state/agent.json and no join token: run 'levers9 machine create --ssh' again" >&2
  exit 3
fi
"$@" &
agent=$!
trap '{stop}' TERM INT
while [ -f "$token" ] && kill -0 "$agent" 2>/dev/null; do
  if [ -f "$state/agent.json" ]; then rm -f "$token"; fi
  sleep 1
done
code=0
wait "$agent" || code=$?
while kill -0 "$agent" 2>/dev/null; do code=0; wait "$agent" || code=$?; done
if [ -f "$state/agent.json" ] || [ "$code" -eq 3 ]; then rm -f "$token"; fi
exit "$code"
"""


def supervisor_script(layout: AgentLayout) -> str:
    """The supervisor loop for boxes without systemd (started with ``setsid nohup``)."""
    q = shlex.quote
    return f"""#!/bin/sh
# The levers9 agent's supervisor, written by 'levers9 machine create --ssh' (this box has no systemd):
# runs the start script and restarts it when it exits, after 1 s doubling to 30 s (back to 1 s after a minute
# of running); stops on SIGTERM or when the agent exits with status 3 (credential refused or missing) or 2 (its
# command or the controlplane's address refused: starting it again would change nothing).
pidfile={q(layout.pid_file)}
start={q(layout.start_script)}
stamp() {{ date -u +%Y-%m-%dT%H:%M:%SZ; }}
echo $$ > "$pidfile"
child=
stopping=
trap 'stopping=1; if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null; fi' TERM INT
delay=1
echo "$(stamp) levers9-agent supervisor $$ started"
while [ -z "$stopping" ]; do
  began=$(date +%s)
  sh "$start" &
  child=$!
  code=0
  wait "$child" || code=$?
  while kill -0 "$child" 2>/dev/null; do code=0; wait "$child" || code=$?; done
  child=
  if [ -n "$stopping" ]; then break; fi
  if [ "$code" -eq 3 ]; then
    echo "$(stamp) levers9-agent exited with status 3 (credential refused or missing): not restarted"
    break
  fi
  if [ "$code" -eq 2 ]; then
    echo "$(stamp) levers9-agent exited with status 2 (its command or controlplane address is refused): not restarted"
    break
  fi
  if [ $(( $(date +%s) - began )) -ge 60 ]; then delay=1; fi
  echo "$(stamp) levers9-agent exited with status $code: restarted in $delay s"
  sleep "$delay"
  delay=$(( delay * 2 ))
  if [ "$delay" -gt 30 ]; then delay=30; fi
done
echo "$(stamp) levers9-agent supervisor $$ stopped"
rm -f "$pidfile"
"""


def systemd_unit(layout: AgentLayout) -> str:
    """The systemd unit that runs the start script (no secret in it)."""
    return f"""[Unit]
Description=levers9 agent (a machine joined to levers9)
Wants=network-online.target
After=network-online.target docker.service

[Service]
Type=simple
ExecStart=/bin/sh {shlex.quote(layout.start_script)}
Restart=always
RestartSec=5
RestartPreventExitStatus=2 3
KillMode=mixed
TimeoutStopSec=30

[Install]
WantedBy=multi-user.target
"""


def _put(remote: Remote, path: str, content: bytes, mode: str, what: str) -> None:
    """Write ``content`` (from the channel's stdin) to ``path`` on the box, whole (a temporary file renamed)."""
    q = shlex.quote
    directory = path.rsplit("/", 1)[0] or "/"
    done = remote.run(
        f"umask 077 && mkdir -p {q(directory)} && cat > {q(path + '.tmp')} && chmod {mode} {q(path + '.tmp')} "
        f"&& mv -f {q(path + '.tmp')} {q(path)}",
        stdin=content,
    )
    if not done.ok:
        raise SshJoinError(f"cannot write {what} {path} on the box: {done.why()}")


def _supervisor_pid(layout: AgentLayout) -> str:
    """Shell: prints the running supervisor's pid and exits 0, else exits 1 (pid reuse guarded by its cmdline)."""
    q = shlex.quote
    return (
        f'pid=$(cat {q(layout.pid_file)} 2>/dev/null); [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && '
        f'tr "\\000" " " < /proc/"$pid"/cmdline | grep -qF -- {q(layout.supervisor_script)} && echo "$pid"'
    )


@dataclass(frozen=True)
class _BoxState:
    joined: bool
    agent_id: str | None
    #: the controlplane the credential dials (None: unreadable)
    controlplane: str | None
    running: bool


def _field(name: str, path: str) -> str:
    """Shell: prints ``name=VALUE`` for the JSON text field ``name`` of the file, on a line of its own."""
    return f'sed -n \'s/.*"{name}" *: *"\\([^"]*\\)".*/{name}=\\1/p\' {shlex.quote(path)} | head -n 1; echo; '


def _state(remote: Remote, layout: AgentLayout, systemd: bool) -> _BoxState:
    q = shlex.quote
    running = f"systemctl is-active --quiet {q(layout.unit_name)}" if systemd else _supervisor_pid(layout)
    done = remote.run(
        f"if [ -f {q(layout.credential)} ]; then echo joined=1; "
        + _field("agent_id", layout.credential)
        + _field("controlplane", layout.credential)
        + f"fi; if {running} >/dev/null; then echo running=1; fi"
    )
    facts = dict(line.split("=", 1) for line in done.out.splitlines() if "=" in line)
    return _BoxState(
        facts.get("joined") == "1",
        facts.get("agent_id") or None,
        facts.get("controlplane") or None,
        facts.get("running") == "1",
    )


def _stop_service(remote: Remote, layout: AgentLayout, systemd: bool, box: BoxFacts) -> None:
    """Stop the agent's service and its container (when it runs in one); nothing when nothing runs."""
    q = shlex.quote
    if systemd:
        remote.run(f"systemctl stop {q(layout.unit_name)} >/dev/null 2>&1; exit 0")
    else:
        _stop_supervisor(remote, layout)
    remote.run(f"{box.env()}docker rm -f {q(layout.container_name)} >/dev/null 2>&1; exit 0")


def _set_aside(remote: Remote, layout: AgentLayout) -> None:
    q = shlex.quote
    done = remote.run(f"mv -f {q(layout.credential)} {q(layout.replaced_credential)}")
    if not done.ok:
        raise SshJoinError(f"[4/{STEPS}] cannot move the revoked credential {layout.credential} aside: {done.why()}")


def _start_systemd(remote: Remote, layout: AgentLayout) -> str:
    q = shlex.quote
    unit = q(layout.unit_name)
    done = remote.run(
        f"systemctl daemon-reload && systemctl enable {unit} && systemctl restart {unit} && "
        f"sleep 1 && systemctl is-active --quiet {unit}"
    )
    if not done.ok:
        journal = remote.run(f"journalctl -u {unit} -n 20 --no-pager").out.strip()
        raise SshJoinError(
            f"[5/{STEPS}] the service {layout.unit_name} did not start on the box: {done.why()}\n{journal}"
        )
    return f"systemd unit {layout.unit_name} enabled and started"


def _stop_supervisor(remote: Remote, layout: AgentLayout) -> None:
    remote.run(
        f'pid=$({_supervisor_pid(layout)}) || exit 0; kill -TERM "$pid"; i=0; '
        f'while kill -0 "$pid" 2>/dev/null && [ $i -lt {_STOP_WAIT_S} ]; do sleep 1; i=$((i+1)); done; '
        f'kill -KILL -- -"$pid" "$pid" 2>/dev/null; exit 0'
    )


def _start_supervisor(remote: Remote, layout: AgentLayout) -> str:
    q = shlex.quote
    sup, log = q(layout.supervisor_script), q(layout.log_file)
    done = remote.run(
        f"mkdir -p {q(layout.log_file.rsplit('/', 1)[0] or '/')} {q(layout.pid_file.rsplit('/', 1)[0] or '/')} && "
        f"if command -v setsid >/dev/null 2>&1; then setsid nohup sh {sup} >> {log} 2>&1 < /dev/null & "
        f"else nohup sh {sup} >> {log} 2>&1 < /dev/null & fi; "
        f"i=0; while [ $i -lt {_START_WAIT_S} ]; do {_supervisor_pid(layout)} && exit 0; sleep 1; i=$((i+1)); done; "
        f"tail -n 20 {log} >&2; exit 1"
    )
    if not done.ok:
        raise SshJoinError(f"[5/{STEPS}] the agent's supervisor did not start on the box: {done.why()}")
    return f"supervisor {done.out.strip()} started (no systemd; log {layout.log_file}, pid file {layout.pid_file})"


def install(
    remote: Remote,
    box: BoxFacts,
    layout: AgentLayout,
    software: AgentSoftware,
    *,
    controlplane: str,
    join_token: str | None,
    ca_pem: str,
    echo: Callable[[str], None],
    is_live: Callable[[str], bool] | None = None,
) -> SshJoinResult:
    """Steps 4 and 5: the token and the start script written, the service installed and (re)started.

    ``is_live(agent_id)``: whether the controlplane still has the machine of that id; a credential of one it
    has not is replaced (see the module docstring). ``join_token`` None: join nothing new (refused when the box
    is not joined).
    """
    systemd = layout.service == "systemd" or (layout.service == "auto" and box.systemd and box.uid == 0)
    kind = "systemd" if systemd else "supervisor"
    state = _state(remote, layout, systemd)
    joined, agent_id, running = state.joined, state.agent_id, state.running
    step4 = f"[4/{STEPS}] the agent's credential bootstrap ({layout.state_dir})"
    step5 = f"[5/{STEPS}] the agent's service ({kind})"
    if joined and is_live is not None and (agent_id is None or not is_live(agent_id)):
        if state.controlplane is not None and state.controlplane != controlplane:
            raise SshJoinError(
                f"[4/{STEPS}] the box is joined to another controlplane ({state.controlplane}, as agent "
                f"{agent_id or '(unreadable)'}); levers9 does not take it over: remove the machine there, or stop "
                f"its agent and delete {layout.credential} on the box, then run this again"
            )
        echo(
            f"{step4} ... the box's credential is of agent {agent_id or '(unreadable)'}, which this controlplane no "
            f"longer has (removed): stopping its agent and replacing it"
        )
        _stop_service(remote, layout, systemd, box)
        _set_aside(remote, layout)
        joined, running = False, False
    if joined and running:
        echo(f"{step4} ... ok: already joined as {agent_id or '(agent id unreadable)'}, no token written")
        echo(f"{step5} ... ok: already running, left as it is")
        return SshJoinResult(already_joined=True, agent_id=agent_id, service=kind)
    if not joined and join_token is None:
        raise SshJoinError(
            f"[4/{STEPS}] the box is not joined (no credential in {layout.credential}) and no join token was given"
        )
    echo(f"{step4} ...")
    if joined:
        note = f"already joined as {agent_id or '(agent id unreadable)'}: no token written, the agent runs from it"
    else:
        assert join_token is not None
        _put(remote, layout.token_file, join_token.encode(), "600", "the join token file")
        note = "join token written (0600, deleted once the agent has joined)"
    script = start_script(layout, software, box, controlplane=controlplane, ca_pem=ca_pem)
    _put(remote, layout.start_script, script.encode(), "755", "the start script")
    echo(f"{step4} ... ok: {note}; start script {layout.start_script}")
    echo(f"{step5} ...")
    if systemd:
        _put(remote, layout.unit_file, systemd_unit(layout).encode(), "644", "the systemd unit")
        how = _start_systemd(remote, layout)
    else:
        _put(remote, layout.supervisor_script, supervisor_script(layout).encode(), "755", "the supervisor script")
        if running:  # not joined yet, with an older token: start again with the new one
            _stop_supervisor(remote, layout)
        how = _start_supervisor(remote, layout)
    echo(f"{step5} ... ok: {how}")
    return SshJoinResult(already_joined=False, agent_id=agent_id if joined else None, service=kind)
