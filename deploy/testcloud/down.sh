#!/usr/bin/env bash
# Stop the SCO test cloud: exactly the processes up.sh started, found by its pid files (a pid
# is signalled only while its process has the start time up.sh recorded beside it, so a
# reused pid is never hit), each with its whole process group. The machine's own MariaDB
# and RabbitMQ are never touched; private ones that up.sh had to start are stopped.
#
# Usage: deploy/testcloud/down.sh            stop; keep data (the next up.sh takes ~35 s)
#        deploy/testcloud/down.sh --purge    stop, then drop the test cloud's databases, user
#                                            and vhost, and delete the data folder
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BASE=${SCO_TESTCLOUD_DIR:-$REPO/.sco/testcloud}
PURGE=0
case "${1:-}" in
  "") ;;
  --purge) PURGE=1 ;;
  *) echo "usage: $0 [--purge]" >&2; exit 2 ;;
esac
[ -d "$BASE" ] || { echo "testcloud: nothing to stop ($BASE does not exist)"; exit 0; }
BASE=$(cd "$BASE" && pwd)
R=$BASE/run

# start_time, alive, ours: shared with the other script
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/pids.sh"
# stop NAME...: TERM each one's process group, wait up to 15 s for all, then KILL the rest
stop() {
  local n pids=() names=()
  for n in "$@"; do
    if ours "$n"; then
      pids+=("$(cat "$R/$n.pid")"); names+=("$n")
      kill -TERM -- "-$(cat "$R/$n.pid")" 2>/dev/null
    elif [ -f "$R/$n.pid" ]; then
      echo "  $n: not running (stale pid file removed)"
    fi
    rm -f "$R/$n".{pid,start,cfg}
  done
  [ ${#pids[@]} -gt 0 ] || return 0
  for _ in $(seq 60); do
    local alive=0 p
    for p in "${pids[@]}"; do alive "$p" && alive=1; done
    [ $alive = 0 ] && break; sleep 0.25
  done
  for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null; done
  echo "  stopped: ${names[*]}"
}

T0=$SECONDS
echo "testcloud: stopping $BASE"
services=()
for f in "$R"/*.pid; do
  [ -e "$f" ] || continue
  n=$(basename "$f" .pid)
  case $n in mariadbd|rabbitmq|epmd) ;; *) services+=("$n") ;; esac
done
[ ${#services[@]} -eq 0 ] || stop "${services[@]}"
# private infrastructure (only when up.sh had to start its own): RabbitMQ, then its epmd, then MariaDB
stop rabbitmq
stop epmd
stop mariadbd

if [ $PURGE = 1 ]; then
  if [ -f "$BASE/state/infra.env" ]; then
    # shellcheck disable=SC1091
    . "$BASE/state/infra.env"
    if [ "${DB_MODE:-}" = machine ]; then
      { for db in keystone placement glance neutron nova_api nova nova_cell0 blazar ironic; do
          echo "DROP DATABASE IF EXISTS \`$DB_PREFIX$db\`;"; done
        echo "DROP USER IF EXISTS '$DB_USER'@'127.0.0.1', '$DB_USER'@'localhost';"
      } | mariadb -h127.0.0.1 -P"$DB_PORT" -uroot && echo "  dropped databases ${DB_PREFIX}* and user $DB_USER"
    fi
    if [ "${RABBIT_MODE:-}" = machine ] && [ -n "${VHOST:-}" ] && [ "$VHOST" != / ]; then
      rabbitmqctl -q delete_vhost "$VHOST" >/dev/null 2>&1 && echo "  deleted RabbitMQ vhost $VHOST"
    fi
  fi
  rm -rf "$BASE" && echo "  removed $BASE"
fi
echo "testcloud: down in $((SECONDS - T0))s"
