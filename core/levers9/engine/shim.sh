#!/bin/sh
# The per-container shim (see shim.py, which builds this command line and documents why it exists).
# Written in sh because it is on every container's start-up path: sh starts in a millisecond.
# Usage: shim.sh ID STATE_DIR CGROUP DELETE(0|1) N RUNTIME_ARGS... ACTION_ARGS...
# The runtime's N arguments followed by the action's are the command; the first N alone delete it.
id=$1 dir=$2 cgroup=$3 delete=$4 n=$5
shift 5
echo $$ > "$dir/shim.pid"
# the container is ended through the runtime's kill, never by signalling the shim
trap '' TERM INT HUP


# Nothing here forks but the runtime itself and the final rename: each fork costs about a millisecond on the
# start-up path. The engine takes the start and end times from the modification times of child.pid and
# exit.json (see shim.py), so the shim needs no `date`.
oom_killed() {
  [ "$cgroup" = "-" ] && return 1
  rel=${cgroup#/}
  for f in "/sys/fs/cgroup/memory/$rel/memory.oom_control" "/sys/fs/cgroup/$rel/memory.events"; do
    if [ -r "$f" ]; then
      while read -r key value; do
        [ "$key" = oom_kill ] && [ -n "$value" ] && [ "$value" -gt 0 ] && return 0
      done < "$f"
    fi
  done
  return 1
}

# A session and process group of its own (the process runtime kills the whole group). A background job
# of a non-interactive shell is never a group leader, so setsid execs in place: $! is the command itself.
setsid "$@" < /dev/null >> "$dir/output.log" 2>&1 &
child=$!
echo "$child" > "$dir/child.pid"
wait "$child"
code=$?
# the memory cgroup outlives the container (runc --keep; levers9 created it for runsc), so reading now is safe
oom=false
if oom_killed; then oom=true; fi
printf '{"exit_code": %d, "oom_killed": %s, "error": null}' "$code" "$oom" > "$dir/.exit.json.tmp"
mv -f "$dir/.exit.json.tmp" "$dir/exit.json"
if [ "$delete" = 1 ] && [ "$n" -gt 0 ]; then
  # keep the first n arguments (the runtime and its global flags), without eval or forks
  total=$# i=0
  for a do
    [ "$i" -lt "$n" ] && set -- "$@" "$a"
    i=$((i + 1))
  done
  shift "$total"
  "$@" delete --force "$id" > /dev/null 2>&1
fi
exit 0
