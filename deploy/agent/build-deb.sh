#!/usr/bin/env bash
# Build the node agent's Debian package with plain dpkg-deb (no debhelper needed).
#
#   deploy/agent/build-deb.sh [--no-venv] [--out DIR]       (from anywhere in the repo)
#
# Layout of the package:
#   /opt/sco-agent/wheels/*.whl       wheelhouse: `pip wheel deploy/agent` (the agent and
#                                     every dependency; --no-venv: the agent wheel only)
#   /opt/sco-agent/venv/              NOT in the package: postinst makes it with
#                                     `python3.X -m venv` and `pip install --no-index
#                                     --find-links /opt/sco-agent/wheels sco-agent==V`
#   /usr/bin/sco-agent                symlink into the venv
#   /lib/systemd/system/sco-agent.service
#   /usr/share/doc/sco-agent/         README.md, agent.toml.example, copyright
# postinst creates the `sco-agent` system user, /etc/sco-agent{,/trust},
# /var/lib/sco-agent{,/bundle}, copies agent.toml.example to /etc/sco-agent/agent.toml when
# there is none, builds the venv and enables the unit (started only on upgrade, or once
# agent.toml has been edited: a fresh node needs its region, hall and trust keys first).
# prerm stops the unit; postrm removes the venv, and on purge the state and agent.toml.
#
# Why a wheelhouse and a venv made on the node, not a venv made here: a venv is not
# relocatable (console-script shebangs and pyvenv.cfg name the interpreter that made
# it), so one built in a staging directory would point at this machine's Python. The
# wheels are built once here (from pip's cache / find-links / index: pass e.g.
# PIP_WHEEL_ARGS="--no-index --find-links /srv/wheels" to build fully offline) and the
# node installs them with --no-index: installing the .deb never needs the network.
#
# Architecture and Python: pydantic-core, pynacl, cffi and pyyaml are binary wheels for
# this machine's CPU and Python (cp311 here), so the full package is `amd64` (`dpkg
# --print-architecture`) and depends on that exact python3.X; it is `all` only when every
# wheel is pure (py3-none-any). `--no-venv` ships the agent wheel only (pure: `all`, any
# python3 >= 3.11): postinst then resolves the dependencies through the node's pip
# configuration (an index or mirror), so that variant needs one at install time.
#
# Environment: PYTHON (default .venv/bin/python, else python3) builds the wheels and
# fixes the target Python version; DEB_MAINTAINER sets the Maintainer field.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$repo/dist"
full=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --no-venv) full=0 ;;
        --out) out="$2"; shift ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "build-deb.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
command -v dpkg-deb >/dev/null || { echo "build-deb.sh: dpkg-deb is needed" >&2; exit 1; }

if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$repo/.venv/bin/python" ]]; then PYTHON="$repo/.venv/bin/python"; else PYTHON=python3; fi
fi
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$here/pyproject.toml" | head -1)"
[[ -n "$version" ]] || { echo "build-deb.sh: no version in pyproject.toml" >&2; exit 1; }
pyver="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
maintainer="${DEB_MAINTAINER:-SCO maintainers <sco-agent@localhost>}"

work="$(mktemp -d)"
trap 'rm -rf "$work" "$here/build" "$here/sco_agent.egg-info"' EXIT
root="$work/root"
wheels="$root/opt/sco-agent/wheels"
mkdir -p "$wheels" "$root/DEBIAN" "$root/lib/systemd/system" "$root/usr/bin" \
    "$root/usr/share/doc/sco-agent"

# shellcheck disable=SC2086  # PIP_WHEEL_ARGS is a list of pip options
if [[ $full -eq 1 ]]; then
    "$PYTHON" -m pip wheel --quiet ${PIP_WHEEL_ARGS:-} -w "$wheels" "$here" 2>"$work/pip.log" \
        || { cat "$work/pip.log" >&2; exit 1; }
else
    "$PYTHON" -m pip wheel --quiet --no-deps ${PIP_WHEEL_ARGS:-} -w "$wheels" "$here" \
        2>"$work/pip.log" || { cat "$work/pip.log" >&2; exit 1; }
fi
ls "$wheels"/sco_agent-"$version"-*.whl >/dev/null

if ls "$wheels"/*.whl | grep -qv -- '-none-any\.whl$'; then
    arch="$(dpkg --print-architecture)"
    depends="python$pyver, python$pyver-venv, passwd"
    python_bin="/usr/bin/python$pyver"
else
    arch=all
    depends="python3 (>= 3.11), python3-venv, passwd"
    python_bin=/usr/bin/python3
fi
if [[ $full -eq 1 ]]; then pip_index="--no-index"; else pip_index=""; fi

install -m 0644 "$here/sco-agent.service" "$root/lib/systemd/system/sco-agent.service"
install -m 0644 "$here/README.md" "$here/agent.toml.example" "$root/usr/share/doc/sco-agent/"
ln -s /opt/sco-agent/venv/bin/sco-agent "$root/usr/bin/sco-agent"
cat >"$root/usr/share/doc/sco-agent/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: sco-agent
Comment: the SCO node agent and the wheels of its dependencies (nats-py, pynacl,
 pydantic, pyyaml and theirs) under /opt/sco-agent/wheels, each under its own licence
 (see the wheel's .dist-info).

Files: *
Copyright: SCO maintainers
License: proprietary
EOF

cat >"$root/DEBIAN/postinst" <<EOF
#!/bin/sh
set -e
case "\$1" in
configure)
    if ! getent passwd sco-agent >/dev/null; then
        useradd --system --user-group --home-dir /var/lib/sco-agent --no-create-home \\
            --shell /usr/sbin/nologin --comment "SCO node agent" sco-agent
    fi
    install -d -m 0755 /etc/sco-agent /etc/sco-agent/trust
    install -d -o sco-agent -g sco-agent -m 0750 /var/lib/sco-agent /var/lib/sco-agent/bundle
    fresh=0
    if [ ! -e /etc/sco-agent/agent.toml ]; then
        install -m 0640 -g sco-agent /usr/share/doc/sco-agent/agent.toml.example \\
            /etc/sco-agent/agent.toml
        fresh=1
    fi
    # The venv is made here, on the node, from the wheels this package carries.
    rm -rf /opt/sco-agent/venv
    $python_bin -m venv /opt/sco-agent/venv
    /opt/sco-agent/venv/bin/pip install --quiet --disable-pip-version-check $pip_index \\
        --find-links /opt/sco-agent/wheels "sco-agent==$version"
    if [ -d /run/systemd/system ]; then
        systemctl daemon-reload || true
        systemctl enable sco-agent.service || true
        if [ "\$fresh" = 0 ] && [ -n "\$2" ]; then
            systemctl try-restart sco-agent.service || true
        fi
    fi
    if [ "\$fresh" = 1 ]; then
        echo "sco-agent: edit /etc/sco-agent/agent.toml, put the region's signing keys in" \\
            "/etc/sco-agent/trust, run 'sco-agent --check', then 'systemctl start sco-agent'."
    fi
    ;;
esac
exit 0
EOF

cat >"$root/DEBIAN/prerm" <<'EOF'
#!/bin/sh
set -e
case "$1" in
remove|upgrade|deconfigure)
    if [ -d /run/systemd/system ]; then
        systemctl stop sco-agent.service || true
    fi
    ;;
esac
exit 0
EOF

cat >"$root/DEBIAN/postrm" <<'EOF'
#!/bin/sh
set -e
case "$1" in
remove)
    rm -rf /opt/sco-agent/venv
    if [ -d /run/systemd/system ]; then
        systemctl disable sco-agent.service >/dev/null 2>&1 || true
        systemctl daemon-reload || true
    fi
    ;;
purge)
    rm -rf /opt/sco-agent/venv /var/lib/sco-agent
    rm -f /etc/sco-agent/agent.toml
    rmdir /etc/sco-agent/trust /etc/sco-agent /opt/sco-agent 2>/dev/null || true
    # The sco-agent user stays: files it owned may remain (Debian policy keeps system users).
    ;;
esac
exit 0
EOF
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm" "$root/DEBIAN/postrm"

installed_kb="$(du -sk --exclude=DEBIAN "$root" | cut -f1)"
cat >"$root/DEBIAN/control" <<EOF
Package: sco-agent
Version: $version
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $installed_kb
Depends: $depends
Section: admin
Priority: optional
Description: SCO node agent: drains a reclaimable node on a reclaim notice
 Runs on every compute node lent as reclaimable capacity. On a reclaim notice it
 cordons the node, tells every workload per its contract (checkpoint, decommission,
 requeue) over a Unix socket, waits a bounded time and forces what is left.
 Installed into /opt/sco-agent/venv from the wheels under /opt/sco-agent/wheels.
EOF
(cd "$root" && find . -type f ! -path './DEBIAN/*' -printf '%P\0' | sort -z \
    | xargs -0 md5sum >DEBIAN/md5sums)

mkdir -p "$out"
deb="$out/sco-agent_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
