#!/usr/bin/env bash
# SCO test cloud: a real OpenStack on this machine, seeded from a region file.
#
#   Keystone, Placement, Glance, Neutron (API server only), Nova API/conductor/scheduler with
#   two fake-driver nova-compute hosts per hall (hall-a, hall-a-committed, ...), Blazar (with
#   the blazar-nova scheduler filter) and Ironic (fake-hardware), from PyPI into their own
#   venv, on the machine's MariaDB and RabbitMQ (or private ones when those do not answer).
#
# Usage: deploy/testcloud/up.sh        idempotent: a second run with everything healthy
#                                      changes nothing; a changed config restarts its service
# Stop:  deploy/testcloud/down.sh [--purge]
#
# Environment (all optional):
#   SCO_TESTCLOUD_DIR      data folder: venv, configs, logs, pid files   (<repo>/.sco/testcloud)
#   SCO_TESTCLOUD_REGION   region file to seed from                      (deploy/regions/r1.toml)
#   SCO_PYTHON             python that can import the repo, runs seed.py (<repo>/.venv/bin/python)
#   SCO_TESTCLOUD_PYTHON   python that makes the test-cloud venv         (python3.11, else python3)
#   SCO_TESTCLOUD_DB_PORT / SCO_TESTCLOUD_RABBIT_PORT   MariaDB / RabbitMQ port (3306 / 5672)
#   SCO_TESTCLOUD_DB_PREFIX  prefix of the test cloud's databases         (sco_tc_)
# See README.md beside this script.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BASE=${SCO_TESTCLOUD_DIR:-$REPO/.sco/testcloud}
mkdir -p "$BASE" && BASE=$(cd "$BASE" && pwd)
REGION_FILE=${SCO_TESTCLOUD_REGION:-$REPO/deploy/regions/r1.toml}
SCO_PYTHON=${SCO_PYTHON:-$REPO/.venv/bin/python}
DB_PORT=${SCO_TESTCLOUD_DB_PORT:-3306}
RABBIT_PORT=${SCO_TESTCLOUD_RABBIT_PORT:-5672}
DB_PREFIX=${SCO_TESTCLOUD_DB_PREFIX:-sco_tc_}
# everything of this test cloud in MariaDB and RabbitMQ is named after the prefix, so a
# second data folder with another prefix (e.g. CI's) never touches this one's
DB_USER=${DB_PREFIX%_} DB_PASS=sco_testcloud
VHOST=${DB_PREFIX%_}
CLOUD=sco-testcloud
DATABASES="keystone placement glance neutron nova_api nova nova_cell0 blazar ironic"
# Everything the venv gets; versions pinned by constraints.txt (resolved together, pip check clean).
PIP_PACKAGES="nova openstack-placement keystone glance neutron blazar blazar-nova ironic gunicorn
  PyMySQL openstacksdk python-openstackclient python-blazarclient python-ironicclient"

VENV=$BASE/venv V=$BASE/venv/bin
E=$BASE/etc L=$BASE/logs R=$BASE/run D=$BASE/data W=$BASE/wsgi S=$BASE/state
export PYTHONWARNINGS=ignore OS_CLIENT_CONFIG_FILE=$BASE/clouds.yaml OS_CLOUD=$CLOUD
T0=${EPOCHREALTIME//[.,]/}

# ------------------------------------------------------------------------------ helpers
say() { local us=$(( ${EPOCHREALTIME//[.,]/} - T0 )); printf '[%4d.%01ds] %s\n' $((us / 1000000)) $((us / 100000 % 10)) "$*"; }
die() { echo "testcloud: error: $*" >&2; exit 1; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
port_owner() { command -v ss >/dev/null && ss -Hltnp "sport = :$1" 2>/dev/null | grep -o 'users:(("[^"]*",pid=[0-9]*' | head -1 | sed 's/users:(("/process /; s/",pid=/ pid /'; }
# start_time, alive, ours: shared with the other script
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/pids.sh"
# bg NAME CMD...: own session (so down.sh can stop its whole process group), pid file, log
bg() {
  local name=$1; shift
  setsid nohup "$@" > "$L/$name.out" 2>&1 < /dev/null &
  echo $! > "$R/$name.pid"; start_time $! > "$R/$name.start"
}
# put FILE: write stdin to FILE only when it differs (keeps a healthy second run a no-op)
# (the temporary file lives in $TMPDIR, so not even a folder's mtime changes)
put() { local t; t=$(mktemp); cat > "$t"; if cmp -s "$t" "$1"; then rm -f "$t"; else cat "$t" > "$1"; rm -f "$t"; fi; }
wait_http() { # URL NAME [timeout-s]
  local code n=$(( ${3:-120} * 4 ))
  for _ in $(seq "$n"); do
    code=$(curl -s -o /dev/null -w '%{http_code}' "$1" || true)
    [[ $code =~ ^(200|300|401)$ ]] && return 0; sleep 0.25
  done
  die "$2 did not answer on $1 within ${3:-120}s; see $L/$2.out and $L/$2.log"
}
sql() { mariadb -h127.0.0.1 -P"$DB_PORT" -uroot --batch --skip-column-names "$@"; }
apt_install() {
  command -v apt-get >/dev/null || die "$* missing and no apt-get to install it"
  say "installing Debian packages: $*"
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"; } \
    > "$L/apt.log" 2>&1 || die "apt-get install $* failed; see $L/apt.log"
}

mkdir -p "$E"/{keystone,placement,glance,neutron,nova,blazar,ironic} "$L" "$R" "$S" "$W" \
         "$D"/{glance/images,glance/staging,glance/tasks,locks}

# ------------------------------------------------------------------------------ preflight
command -v curl >/dev/null || die "curl is missing (apt-get install curl)"
PY=${SCO_TESTCLOUD_PYTHON:-$(command -v python3.11 || command -v python3 || true)}
[ -n "$PY" ] || die "python3 is missing"
"$PY" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 10))' 2>/dev/null \
  || die "$PY must be Python >= 3.10 with venv and ensurepip (Debian: apt-get install python3-venv)"
[ -x "$SCO_PYTHON" ] || die "project venv missing: $SCO_PYTHON (make the repo's .venv first, e.g. 'make lint', or set SCO_PYTHON)"
[ -f "$REGION_FILE" ] || die "region file not found: $REGION_FILE"
# the compute hosts, one line per host: "hall-a A spot", "hall-a-committed A committed", ...
HOSTS=$("$SCO_PYTHON" "$HERE/seed.py" hosts --region "$REGION_FILE" 2>"$L/seed-hosts.err" | awk '{printf "%s ", $1}') \
  || die "$SCO_PYTHON cannot load $REGION_FILE with contracts.region; see $L/seed-hosts.err"
HOSTS=${HOSTS% }
# name:port of every API; a port that someone else holds is a one-line error, before anything starts
APIS="keystone:5000 placement:8778 glance:9292 neutron:9696 nova-api:8774 blazar-api:1234 ironic:6385"
for np in $APIS; do
  n=${np%%:*} p=${np##*:}
  if ! ours "$n" && port_open "$p"; then
    die "port $p (for $n) is already in use by $(port_owner "$p" || echo 'another process'); free it and rerun"
  fi
done
say "testcloud in $BASE (region $(basename "$REGION_FILE" .toml), hosts: $HOSTS)"

# ------------------------------------------------------------------------------ venv
# two stamps: the OpenStack packages (slow, ~1.5 min) and our plugins (seconds)
STAMP=$( { cat "$HERE/constraints.txt"; echo "$PIP_PACKAGES"; "$PY" -V; } | sha1sum | cut -c1-16)
PLUGIN_STAMP=$(cat "$HERE"/plugins/pyproject.toml "$HERE"/plugins/sco_testcloud_plugins/*.py | sha1sum | cut -c1-16)
if [ "$(cat "$VENV/.sco-stamp" 2>/dev/null)" != "$STAMP" ] || ! "$V/python" -c '' 2>/dev/null; then
  rm -rf "$VENV"; "$PY" -m venv "$VENV"
  # uv beside the project's python (its dev extra) when there: the same constraints, its
  # downloads and installs in parallel (a CI run's pip took 274 s of a 476 s bring-up, uv
  # ~60 s with the bytecode compiled, which every service start then reads); else pip.
  UV=$(dirname "$SCO_PYTHON")/uv
  if [ -x "$UV" ]; then
    say "installing OpenStack into $VENV (uv, about 1 min on a fresh machine)"
    # shellcheck disable=SC2086
    "$UV" pip install -q --compile-bytecode --python "$V/python" -c "$HERE/constraints.txt" \
      $PIP_PACKAGES > "$L/pip.log" 2>&1 \
      || { tail -5 "$L/pip.log" >&2; die "uv pip install failed; see $L/pip.log"; }
  else
    say "installing OpenStack into $VENV (pip, about 1.5 min on a fresh machine)"
    # shellcheck disable=SC2086
    "$V/pip" install -q -c "$HERE/constraints.txt" $PIP_PACKAGES > "$L/pip.log" 2>&1 \
      || { tail -5 "$L/pip.log" >&2; die "pip install failed; see $L/pip.log"; }
  fi
  echo "$STAMP" > "$VENV/.sco-stamp"
  say "venv ready ($(du -sh "$VENV" | cut -f1))"
else
  say "venv up to date"
fi
if [ "$(cat "$VENV/.sco-plugins-stamp" 2>/dev/null)" != "$PLUGIN_STAMP" ]; then
  # a copy, so the build leaves nothing in the repo
  rm -rf "$BASE/src"; mkdir -p "$BASE/src"; cp -r "$HERE/plugins" "$BASE/src/"
  "$V/pip" install -q --no-deps --force-reinstall "$BASE/src/plugins" > "$L/pip-plugins.log" 2>&1 \
    || die "installing deploy/testcloud/plugins failed; see $L/pip-plugins.log"
  echo "$PLUGIN_STAMP" > "$VENV/.sco-plugins-stamp"
  say "test-cloud plugins installed"
fi

# ------------------------------------------------------------------------------ MariaDB
# The machine's MariaDB when it answers; else a private mariadbd on $DB_PORT under $D/mysql.
command -v mariadb >/dev/null || apt_install mariadb-client
if ours mariadbd; then
  DB_MODE=own
elif port_open "$DB_PORT"; then
  DB_MODE=machine
  sql -e 'select 1' >/dev/null 2>&1 \
    || die "MariaDB on 127.0.0.1:$DB_PORT refuses root without a password; the test cloud needs it to create its databases"
else
  DB_MODE=own
  command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ] || apt_install mariadb-server
  MARIADBD=$(command -v mariadbd || echo /usr/sbin/mariadbd)
  if [ ! -d "$D/mysql/mysql" ]; then
    say "initialising a private MariaDB in $D/mysql"
    # --no-defaults first: the machine's /etc/mysql/my.cnf (user=mysql, its datadir, logs) must not apply
    mariadb-install-db --no-defaults --datadir="$D/mysql" --user=root --auth-root-authentication-method=normal \
      --skip-test-db > "$L/mysql-install.log" 2>&1 || die "mariadb-install-db failed; see $L/mysql-install.log"
  fi
  bg mariadbd "$MARIADBD" --no-defaults --datadir="$D/mysql" --socket="$R/mysqld.sock" \
    --pid-file="$R/mysqld.pidfile" --port="$DB_PORT" --bind-address=127.0.0.1 --user=root \
    --max-connections=1000 --innodb-buffer-pool-size=128M --skip-log-bin --log-error="$L/mysqld.err"
  for _ in $(seq 120); do sql -e 'select 1' >/dev/null 2>&1 && break; sleep 0.25; done
  sql -e 'select 1' >/dev/null 2>&1 || die "private MariaDB did not start; see $L/mysqld.err"
fi
say "MariaDB on 127.0.0.1:$DB_PORT ($DB_MODE)"

# ------------------------------------------------------------------------------ RabbitMQ
# The machine's RabbitMQ when it answers (the test cloud gets its own vhost); else a private
# rabbitmq-server on $RABBIT_PORT under $D/rabbit.
RABBIT_ENV=$BASE/rabbit-env.sh
amqp_ok() { "$V/python" - "$RABBIT_PORT" "$1" <<'PY' >/dev/null 2>&1
import sys, amqp
c = amqp.Connection(f"127.0.0.1:{sys.argv[1]}", userid="guest", password="guest",
                    virtual_host=sys.argv[2], connect_timeout=5)
c.connect(); c.close()
PY
}
if ours rabbitmq; then
  RABBIT_MODE=own
elif port_open "$RABBIT_PORT"; then
  RABBIT_MODE=machine
  amqp_ok / || die "RabbitMQ on 127.0.0.1:$RABBIT_PORT refuses guest/guest"
else
  RABBIT_MODE=own
  [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || apt_install rabbitmq-server
  mkdir -p "$D/rabbit/mnesia" "$L/rabbit"
  put "$RABBIT_ENV" <<EOF
export HOME=$D/rabbit RABBITMQ_MNESIA_BASE=$D/rabbit/mnesia RABBITMQ_LOG_BASE=$L/rabbit
export RABBITMQ_NODENAME=sco-testcloud@localhost RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
export RABBITMQ_NODE_PORT=$RABBIT_PORT RABBITMQ_DIST_PORT=$((RABBIT_PORT + 20000))
export RABBITMQ_ENABLED_PLUGINS_FILE=$D/rabbit/enabled_plugins RABBITMQ_PID_FILE=$R/rabbit.pidfile
export ERL_EPMD_ADDRESS=127.0.0.1
# our own config files, so that none of the machine's /etc/rabbitmq applies
export RABBITMQ_CONFIG_FILE=$D/rabbit/rabbitmq.conf RABBITMQ_CONF_ENV_FILE=$D/rabbit/rabbitmq-env.conf
export RABBITMQ_ADVANCED_CONFIG_FILE=$D/rabbit/advanced.config
EOF
  echo '[].' > "$D/rabbit/enabled_plugins"
  echo "listeners.tcp.local = 127.0.0.1:$RABBIT_PORT" > "$D/rabbit/rabbitmq.conf"
  : > "$D/rabbit/rabbitmq-env.conf"
  # Erlang's port mapper: reuse a running one, else run our own (so down.sh can stop it)
  if ! port_open 4369; then (. "$RABBIT_ENV"; bg epmd epmd); fi
  (. "$RABBIT_ENV"; bg rabbitmq /usr/lib/rabbitmq/bin/rabbitmq-server)
  # rabbitmqctl needs the same HOME (Erlang cookie) as the server
  (. "$RABBIT_ENV"; /usr/lib/rabbitmq/bin/rabbitmqctl -q wait --timeout 90 "$R/rabbit.pidfile" > "$L/rabbit-wait.log" 2>&1) \
    || die "private RabbitMQ did not start; see $L/rabbitmq.out and $L/rabbit/"
fi
rabbitctl() { if [ "$RABBIT_MODE" = own ]; then (. "$RABBIT_ENV"; /usr/lib/rabbitmq/bin/rabbitmqctl "$@"); else rabbitmqctl "$@"; fi; }

# The services' database user (every run: it may have been dropped; a no-op when present)
GRANT_DB=$(printf '%s' "$DB_PREFIX" | sed 's/_/\\_/g')
for h in 127.0.0.1 localhost; do
  echo "CREATE USER IF NOT EXISTS '$DB_USER'@'$h' IDENTIFIED BY '$DB_PASS';"
  echo "GRANT ALL ON \`$GRANT_DB%\`.* TO '$DB_USER'@'$h';"
done | sql || die "could not create MariaDB user $DB_USER on 127.0.0.1:$DB_PORT"

# ------------------------------------------------------------------------------ fresh or not
# Fresh = never initialised here, or the databases are gone (e.g. another MariaDB): then
# databases, vhost, keys and compute state are (re)made from scratch.
FRESH=0
[ -f "$S/initialised" ] || FRESH=1
[ -n "$(sql -e "SHOW DATABASES LIKE '${DB_PREFIX}keystone'")" ] || FRESH=1
[ -n "$(ls "$E/keystone/fernet-keys" 2>/dev/null)" ] || FRESH=1

# The vhost: a clean one for a fresh cloud (stale queues of an older cloud would be
# consumed), re-made when it went missing. Without rabbitmqctl (the machine's broker seen
# only over AMQP), or when it fails, the default vhost "/".
ensure_vhost() {
  command -v rabbitmqctl >/dev/null || [ "$RABBIT_MODE" = own ] || return 1
  rabbitctl -q list_vhosts 2>/dev/null | grep -qxF "$1" && return 0
  { rabbitctl -q add_vhost "$1" && rabbitctl -q set_permissions -p "$1" guest '.*' '.*' '.*'; } \
    > "$L/rabbit-vhost.log" 2>&1
}
if [ "$FRESH" = 1 ]; then
  if command -v rabbitmqctl >/dev/null || [ "$RABBIT_MODE" = own ]; then
    rabbitctl -q delete_vhost "$VHOST" >/dev/null 2>&1 || true
  fi
  ensure_vhost "$VHOST" || VHOST=/
  echo "$VHOST" > "$S/vhost"
else
  VHOST=$(cat "$S/vhost" 2>/dev/null || echo /)
  [ "$VHOST" = / ] || ensure_vhost "$VHOST" || true
fi
amqp_ok "$VHOST" || die "RabbitMQ vhost '$VHOST' is not usable by guest (see $L/rabbit-vhost.log)"
[ "$VHOST" = / ] && VH="" || VH=$VHOST
say "RabbitMQ on 127.0.0.1:$RABBIT_PORT ($RABBIT_MODE, vhost ${VHOST})"
printf 'DB_MODE=%s\nDB_PORT=%s\nDB_PREFIX=%s\nDB_USER=%s\nRABBIT_MODE=%s\nRABBIT_PORT=%s\nVHOST=%s\n' \
  "$DB_MODE" "$DB_PORT" "$DB_PREFIX" "$DB_USER" "$RABBIT_MODE" "$RABBIT_PORT" "$VHOST" | put "$S/infra.env"

# ------------------------------------------------------------------------------ configs
DB="mysql+pymysql://$DB_USER:$DB_PASS@127.0.0.1:$DB_PORT/$DB_PREFIX"
RABBIT="rabbit://guest:guest@127.0.0.1:$RABBIT_PORT/$VH"
AUTH="auth_url = http://127.0.0.1:5000
auth_type = password
project_domain_name = Default
user_domain_name = Default
project_name = admin
username = admin
password = admin"
KSA="[keystone_authtoken]
www_authenticate_uri = http://127.0.0.1:5000
$AUTH"

put "$E/keystone/keystone.conf" <<EOF
[DEFAULT]
log_file = $L/keystone.log
[database]
connection = ${DB}keystone
[token]
provider = fernet
expiration = 86400
[fernet_tokens]
key_repository = $E/keystone/fernet-keys
[fernet_receipts]
key_repository = $E/keystone/receipt-keys
[credential]
key_repository = $E/keystone/credential-keys
[cache]
enabled = true
backend = dogpile.cache.memory
[identity]
# bcrypt cost 12 (default) is ~0.4 s per password token; Blazar re-authenticates per action
password_hash_rounds = 4
EOF
put "$E/placement/placement.conf" <<EOF
[DEFAULT]
log_file = $L/placement.log
[placement_database]
connection = ${DB}placement
[api]
auth_strategy = keystone
$KSA
EOF
put "$E/glance/glance-api-paste.ini" < "$VENV/etc/glance/glance-api-paste.ini"
put "$E/glance/glance-api.conf" <<EOF
[DEFAULT]
log_file = $L/glance.log
enabled_backends = fs:file
[database]
connection = ${DB}glance
[glance_store]
default_backend = fs
[fs]
filesystem_store_datadir = $D/glance/images
[os_glance_staging_store]
filesystem_store_datadir = $D/glance/staging
[os_glance_tasks_store]
filesystem_store_datadir = $D/glance/tasks
[paste_deploy]
flavor = keystone
config_file = $E/glance/glance-api-paste.ini
$KSA
EOF
put "$E/neutron/api-paste.ini" < "$VENV/etc/neutron/api-paste.ini"
put "$E/neutron/neutron.conf" <<EOF
[DEFAULT]
log_file = $L/neutron.log
core_plugin = ml2
service_plugins =
auth_strategy = keystone
transport_url = $RABBIT
notify_nova_on_port_status_changes = false
notify_nova_on_port_data_changes = false
dhcp_agent_notification = false
api_paste_config = $E/neutron/api-paste.ini
[database]
connection = ${DB}neutron
[oslo_concurrency]
lock_path = $D/locks
$KSA
[ml2]
type_drivers = flat,vlan,local
tenant_network_types = local
# binds every port without an agent (plugins/sco_testcloud_plugins/neutron_fakebind.py)
mechanism_drivers = sco_fakebind
extension_drivers = port_security
[ml2_type_flat]
flat_networks = *
EOF
put "$E/nova/api-paste.ini" < "$VENV/etc/nova/api-paste.ini"
# nova-common.conf has no database credentials: nova-compute gets only this (+ its host file)
put "$E/nova/nova-common.conf" <<EOF
[DEFAULT]
transport_url = $RABBIT
# added to nova.virt.fake by sco-testcloud-nova-compute (plugins/sco_testcloud_plugins/nova_fake.py)
compute_driver = fake.SizedFakeDriver
state_path = $D/nova
my_ip = 127.0.0.1
host = controller
heal_instance_info_cache_interval = -1
sync_power_state_interval = -1
update_resources_interval = 60
# periodic tasks start after a random delay of up to 60 s by default; the scheduler's host
# discovery (below) is one, and a fresh cloud would wait for it
periodic_fuzzy_delay = 0
graceful_shutdown_timeout = 5
cpu_allocation_ratio = 1.0
ram_allocation_ratio = 1.0
disk_allocation_ratio = 1.0
# nothing held back: the host sizes below are exactly what instances can use
reserved_host_memory_mb = 0
reserved_host_cpus = 0
[sco_fake]
# size of every fake host: 1024 vCPU, 1 TiB RAM, 100 TB disk. RAM decides: the largest shape
# (gpu-a.4xl, 768 GiB) fits once per host, every other shape at least twice (hmem.4xl and
# gpu-l.4xl, 512 GiB: 2; gpu-a.2xl: 2; mem.4xl: 4; gp.l, 16 GiB: 64).
vcpus = 1024
memory_mb = 1048576
local_gb = 100000
[wsgi]
api_paste_config = $E/nova/api-paste.ini
[conductor]
workers = 1
[scheduler]
workers = 1
discover_hosts_in_cells_interval = 5
[filter_scheduler]
available_filters = nova.scheduler.filters.all_filters
available_filters = blazarnova.scheduler.filters.blazar_filter.BlazarFilter
enabled_filters = ComputeFilter,ComputeCapabilitiesFilter,ImagePropertiesFilter,ServerGroupAntiAffinityFilter,ServerGroupAffinityFilter,AggregateInstanceExtraSpecsFilter,BlazarFilter
[quota]
instances = -1
cores = -1
ram = -1
[oslo_concurrency]
lock_path = $D/locks
[vnc]
enabled = false
$KSA
[placement]
region_name = RegionOne
$AUTH
[neutron]
region_name = RegionOne
$AUTH
[glance]
region_name = RegionOne
[cinder]
os_region_name = RegionOne
EOF
{ cat "$E/nova/nova-common.conf"; printf '[api_database]\nconnection = %snova_api\n[database]\nconnection = %snova\n' "$DB" "$DB"; } | put "$E/nova/nova.conf"
for h in $HOSTS; do
  mkdir -p "$D/nova-$h"
  printf '[DEFAULT]\nhost = %s\nstate_path = %s\n' "$h" "$D/nova-$h" | put "$E/nova/compute-$h.conf"
done
put "$E/blazar/blazar.conf" <<EOF
[DEFAULT]
graceful_shutdown_timeout = 5
log_file = $L/blazar.log
transport_url = $RABBIT
os_auth_host = 127.0.0.1
os_auth_port = 5000
os_auth_version = v3
os_admin_username = admin
os_admin_password = admin
os_admin_project_name = admin
os_admin_user_domain_name = Default
os_admin_project_domain_name = Default
identity_service = identity
os_region_name = RegionOne
[manager]
plugins = physical.host.plugin,virtual.instance.plugin,flavor.instance.plugin
[database]
connection = ${DB}blazar
$KSA
[nova]
aggregate_freepool_name = freepool
[oslo_concurrency]
lock_path = $D/locks
EOF
put "$E/ironic/ironic.conf" <<EOF
[DEFAULT]
graceful_shutdown_timeout = 5
log_file = $L/ironic.log
host = ironic-local
auth_strategy = keystone
rpc_transport = none
enabled_hardware_types = fake-hardware
enabled_boot_interfaces = fake
enabled_deploy_interfaces = fake
enabled_management_interfaces = fake
enabled_power_interfaces = fake
enabled_inspect_interfaces = fake,no-inspect
enabled_console_interfaces = fake,no-console
enabled_network_interfaces = noop
enabled_raid_interfaces = fake,no-raid
enabled_rescue_interfaces = fake,no-rescue
enabled_vendor_interfaces = fake,no-vendor
enabled_bios_interfaces = fake,no-bios
enabled_storage_interfaces = noop
minimum_memory_warning_only = true
[api]
host_ip = 127.0.0.1
port = 6385
[database]
connection = ${DB}ironic
[conductor]
automated_clean = false
[dhcp]
dhcp_provider = none
[oslo_concurrency]
lock_path = $D/locks
$KSA
[service_catalog]
region_name = RegionOne
$AUTH
EOF
# WSGI entry points for gunicorn. Keystone and Neutron parse sys.argv with oslo.config and
# would choke on gunicorn's arguments, so every wrapper hides them.
mk_wsgi() { printf 'import os\nimport sys\n\nsys.argv = sys.argv[:1]\nos.environ.setdefault("%s", "%s")\n%b\n' "$2" "$3" "$4" | put "$W/$1.py"; }
mk_wsgi ks_app        OS_KEYSTONE_CONFIG_FILES "$E/keystone/keystone.conf" 'from keystone.wsgi.api import application  # noqa'
mk_wsgi placement_app OS_PLACEMENT_CONFIG_DIR  "$E/placement" 'from placement.wsgi.api import application  # noqa'
mk_wsgi glance_app    OS_GLANCE_CONFIG_DIR     "$E/glance"    'from glance.wsgi.api import application  # noqa'
mk_wsgi neutron_app   OS_NEUTRON_CONFIG_FILES  "$E/neutron/neutron.conf" 'from neutron.wsgi.api import application  # noqa'
mk_wsgi nova_api_app  OS_NOVA_CONFIG_DIR       "$E/nova"      'from nova.wsgi.osapi_compute import application  # noqa'
mk_wsgi blazar_app    OS_BLAZAR_CONFIG_DIR     "$E/blazar"    'from blazar.api import wsgi_app\napplication = wsgi_app.init_app()'
put "$BASE/clouds.yaml" <<EOF
# Written by deploy/testcloud/up.sh. Use: OS_CLIENT_CONFIG_FILE=$BASE/clouds.yaml OS_CLOUD=$CLOUD
clouds:
  $CLOUD:
    auth:
      auth_url: http://127.0.0.1:5000/v3
      username: admin
      password: admin
      project_name: admin
      user_domain_name: Default
      project_domain_name: Default
    region_name: RegionOne
    identity_api_version: 3
    # without it openstacksdk's version discovery picks Blazar's /v2 API
    reservation_api_version: "1"
EOF

# ------------------------------------------------------------------------------ services
# svc NAME PORT|- CONFIG-FILES... -- CMD...: start NAME unless it runs with the same config.
# services() declares them all; it runs twice: SVC_MODE=plan collects the running services
# whose config changed (stopped together, in parallel), SVC_MODE=start starts what is down.
svc() {
  local name=$1 port=$2 files=() hash; shift 2
  while [ "$1" != -- ]; do files+=("$1"); shift; done; shift
  hash=$( { cat "${files[@]}"; echo "$*"; cat "$VENV"/.sco-*stamp; } | sha1sum | cut -c1-16)
  if [ "$SVC_MODE" = plan ]; then
    if ours "$name" && [ "$(cat "$R/$name.cfg" 2>/dev/null)" != "$hash" ]; then STALE+=("$name"); fi
    return 0
  fi
  ours "$name" && return 0
  if [ "$port" != - ] && port_open "$port"; then die "port $port (for $name) is already in use by $(port_owner "$port" || echo 'another process')"; fi
  bg "$name" "$@"; echo "$hash" > "$R/$name.cfg"; STARTED+=("$name")
}
stop_many() { # NAME...: TERM every process group at once, wait up to 15 s, KILL the rest
  local n p pids=()
  for n in "$@"; do p=$(cat "$R/$n.pid"); pids+=("$p"); kill -TERM -- "-$p" 2>/dev/null || true; done
  for _ in $(seq 60); do
    local up=0; for p in "${pids[@]}"; do if alive "$p"; then up=1; fi; done
    [ $up = 0 ] && break; sleep 0.25
  done
  for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done
  for n in "$@"; do rm -f "$R/$n".{pid,start,cfg}; done
}
gun() { # NAME PORT MODULE WORKERS THREADS CONFIG-FILES...
  local name=$1 port=$2 mod=$3 workers=$4 threads=$5; shift 5
  # --limit-request-line 0: nova asks neutron for ports with one device_id= per server
  # (a list of > ~60 servers breaks the 4094-byte default); no control socket: gunicorn
  # would put every master's at ~/.gunicorn/gunicorn.ctl
  svc "$name" "$port" "$W/$mod.py" "$@" -- "$V/gunicorn" --no-control-socket --limit-request-line 0 --graceful-timeout 5 \
    -w "$workers" --threads "$threads" -b "127.0.0.1:$port" --chdir "$W" --access-logfile "$L/$name-access.log" "$mod:application"
}
STARTED=()

if [ "$FRESH" = 1 ]; then
  say "fresh cloud: creating databases"
  # stop whatever an older cloud of this folder still runs (it would talk to dropped databases)
  OLD=()
  for f in "$R"/*.pid; do
    n=$(basename "$f" .pid)
    case $n in mariadbd|rabbitmq|epmd) ;; *) if ours "$n"; then OLD+=("$n"); fi;; esac
  done
  if [ ${#OLD[@]} -gt 0 ]; then stop_many "${OLD[@]}"; fi
  rm -f "$S/initialised"
  rm -rf "$E"/keystone/{fernet-keys,credential-keys,receipt-keys} "$D"/nova-* "$D"/glance/images/*
  for db in $DATABASES; do echo "DROP DATABASE IF EXISTS \`$DB_PREFIX$db\`; CREATE DATABASE \`$DB_PREFIX$db\`;"; done \
    | sql || die "could not create the test cloud's databases in MariaDB on 127.0.0.1:$DB_PORT"
  for h in $HOSTS; do mkdir -p "$D/nova-$h"; done
  mkdir -p "$E"/keystone/{fernet-keys,credential-keys,receipt-keys}
  KC=(--config-file "$E/keystone/keystone.conf")
  { "$V/keystone-manage" "${KC[@]}" db_sync &&
    "$V/keystone-manage" "${KC[@]}" fernet_setup --keystone-user root --keystone-group root &&
    "$V/keystone-manage" "${KC[@]}" credential_setup --keystone-user root --keystone-group root &&
    "$V/keystone-manage" "${KC[@]}" bootstrap --bootstrap-password admin --bootstrap-region-id RegionOne \
      --bootstrap-admin-url http://127.0.0.1:5000/v3/ --bootstrap-public-url http://127.0.0.1:5000/v3/ \
      --bootstrap-internal-url http://127.0.0.1:5000/v3/; } > "$L/sync-keystone.log" 2>&1 \
    || die "keystone db_sync/bootstrap failed; see $L/sync-keystone.log"
  say "keystone database ready"
  SVC_MODE=start gun keystone 5000 ks_app 1 8 "$E/keystone/keystone.conf"
  # every other schema in parallel (wait on these pids only: the daemons are children too)
  NM=("$V/nova-manage" --config-file "$E/nova/nova.conf")
  PIDS=()
  ( "${NM[@]}" api_db sync && "${NM[@]}" cell_v2 map_cell0 --database_connection "${DB}nova_cell0" &&
    "${NM[@]}" cell_v2 create_cell --name cell1 && "${NM[@]}" db sync ) > "$L/sync-nova.log" 2>&1 & PIDS+=($!)
  "$V/placement-manage" --config-file "$E/placement/placement.conf" db sync > "$L/sync-placement.log" 2>&1 & PIDS+=($!)
  "$V/glance-manage" --config-file "$E/glance/glance-api.conf" db_sync > "$L/sync-glance.log" 2>&1 & PIDS+=($!)
  "$V/neutron-db-manage" --config-file "$E/neutron/neutron.conf" upgrade heads > "$L/sync-neutron.log" 2>&1 & PIDS+=($!)
  "$V/blazar-db-manage" --config-file "$E/blazar/blazar.conf" upgrade head > "$L/sync-blazar.log" 2>&1 & PIDS+=($!)
  "$V/ironic-dbsync" --config-file "$E/ironic/ironic.conf" create_schema > "$L/sync-ironic.log" 2>&1 & PIDS+=($!)
  wait_http http://127.0.0.1:5000/v3 keystone
  "$V/python" "$HERE/bootstrap.py" catalog > "$L/catalog.log" 2>&1 & PIDS+=($!)
  for p in "${PIDS[@]}"; do wait "$p" || die "a schema migration or the catalog failed; see $L/sync-*.log and $L/catalog.log"; done
  say "all schemas migrated, catalog registered"
fi

services() {
gun keystone  5000 ks_app        1 8 "$E/keystone/keystone.conf"
gun placement 8778 placement_app 1 8 "$E/placement/placement.conf"
gun glance    9292 glance_app    1 8 "$E/glance/glance-api.conf" "$E/glance/glance-api-paste.ini"
gun neutron   9696 neutron_app   1 8 "$E/neutron/neutron.conf" "$E/neutron/api-paste.ini"
gun nova-api  8774 nova_api_app  2 4 "$E/nova/nova.conf" "$E/nova/api-paste.ini"
svc nova-conductor - "$E/nova/nova.conf" -- "$V/nova-conductor" --config-file "$E/nova/nova.conf" --log-file "$L/nova-conductor.log"
svc nova-scheduler - "$E/nova/nova.conf" -- "$V/nova-scheduler" --config-file "$E/nova/nova.conf" --log-file "$L/nova-scheduler.log"
for h in $HOSTS; do
  svc "nova-compute-$h" - "$E/nova/nova-common.conf" "$E/nova/compute-$h.conf" -- "$V/sco-testcloud-nova-compute" \
    --config-file "$E/nova/nova-common.conf" --config-file "$E/nova/compute-$h.conf" --log-file "$L/nova-compute-$h.log"
done
svc blazar-manager - "$E/blazar/blazar.conf" -- "$V/blazar-manager" --config-file "$E/blazar/blazar.conf" --log-file "$L/blazar-manager.log"
gun blazar-api 1234 blazar_app 1 8 "$E/blazar/blazar.conf"
svc ironic 6385 "$E/ironic/ironic.conf" -- "$V/ironic" --config-file "$E/ironic/ironic.conf"
}
STALE=()
SVC_MODE=plan services
if [ ${#STALE[@]} -gt 0 ]; then say "restarting (configuration changed): ${STALE[*]}"; stop_many "${STALE[@]}"; fi
SVC_MODE=start services
if [ ${#STARTED[@]} -gt 0 ]; then say "started: ${STARTED[*]}"; else say "all services already running"; fi

for np in $APIS; do wait_http "http://127.0.0.1:${np##*:}/" "${np%%:*}"; done
say "all APIs answer"
# shellcheck disable=SC2086
COMPUTES=$("$V/python" "$HERE/bootstrap.py" wait-computes $HOSTS 2>&1) \
  || die "compute hosts did not come up ($COMPUTES); see $L/nova-compute-*.log"
say "$COMPUTES"
[ -f "$S/initialised" ] || touch "$S/initialised"

if ! "$SCO_PYTHON" "$HERE/seed.py" seed --region "$REGION_FILE" --cloud "$CLOUD" 2> "$L/seed.err" \
     | while IFS= read -r line; do say "$line"; done; then
  tail -3 "$L/seed.err" >&2; die "seeding failed; see $L/seed.err"
fi

say "ready. Use it with:"
echo "    export OS_CLIENT_CONFIG_FILE=$BASE/clouds.yaml OS_CLOUD=$CLOUD"
echo "    $V/openstack server list            # or: import openstack; openstack.connect(cloud=\"$CLOUD\")"
echo "  logs: $L   stop: $HERE/down.sh [--purge]"
