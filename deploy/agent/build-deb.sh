#!/usr/bin/env bash
# Build the node agent's Debian package for one Debian release (plain dpkg-deb, no debhelper
# needed; the maintainer scripts are debhelper's own systemd snippets).
#
#   deploy/agent/build-deb.sh [--target debian12|debian13] [--out DIR]   (default debian12)
#
# Targets: debian12 (bookworm, python3.11, glibc 2.36), debian13 (trixie, python3.13,
# glibc 2.41). pynacl and cffi are binary wheels for one CPython
# minor version, so each release gets its own package, version <upstream>-1~deb12 or ~deb13.
# The wheels for the target's Python are taken from PyPI (or PIP_ARGS, e.g. "--no-index
# --find-links /srv/wheels" offline) with pip's --python-version/--platform: no target
# interpreter or container is needed on the build host.
#
# Layout of the package:
#   /usr/lib/sco-agent/               the agent, contracts and every dependency, installed
#                                     with `pip install --target` at the versions of
#                                     requirements.lock; byte-compiled by postinst
#   /usr/bin/sco-agent                `#!/usr/bin/python3 -I` launcher onto that directory
#                                     (Depends: python3 (>= 3.X~), python3 (<< 3.X+1~):
#                                     the release's own python3 is the wheels' CPython)
#   /lib/systemd/system/sco-agent.service        (debian13: /usr/lib/systemd/system)
#   /usr/share/sco-agent/agent.toml.example      copied to /etc/sco-agent/agent.toml by
#                                                postinst when there is none
#   /usr/share/man/man8/sco-agent.8.gz
#   /usr/share/doc/sco-agent/         README.md, copyright, changelog.Debian.gz
#   /usr/share/lintian/overrides/sco-agent       each override says why
# postinst creates the `sco-agent` system user, /etc/sco-agent{,/trust},
# /var/lib/sco-agent{,/bundle}, enables the unit with deb-systemd-helper and restarts it on
# an upgrade (a fresh node needs its region, hall and trust keys first: it is started once
# agent.toml is edited). prerm stops it on removal; postrm masks/purges the unit state and
# on purge removes the state and agent.toml.
#
# Environment: PYTHON (default .venv/bin/python, else python3) runs pip on the build host;
# DEB_MAINTAINER sets the Maintainer field.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$repo/dist"
target=debian12
while [[ $# -gt 0 ]]; do
    case "$1" in
        --target) target="$2"; shift ;;
        --out) out="$2"; shift ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "build-deb.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
case "$target" in
    debian12) codename=bookworm; pyver=3.11; next=3.12; glibc=36; unitdir=lib/systemd/system ;;
    debian13) codename=trixie; pyver=3.13; next=3.14; glibc=41; unitdir=usr/lib/systemd/system ;;
    *) echo "build-deb.sh: --target: $target is not debian12 or debian13" >&2; exit 2 ;;
esac
command -v dpkg-deb >/dev/null || { echo "build-deb.sh: dpkg-deb is needed" >&2; exit 1; }

if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$repo/.venv/bin/python" ]]; then PYTHON="$repo/.venv/bin/python"; else PYTHON=python3; fi
fi
upstream="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$here/pyproject.toml" | head -1)"
[[ -n "$upstream" ]] || { echo "build-deb.sh: no version in pyproject.toml" >&2; exit 1; }
release="${target#debian}"
version="$upstream-1~deb$release"
arch="$(dpkg --print-architecture)"
case "$arch" in
    amd64) machine=x86_64 ;;
    arm64) machine=aarch64 ;;
    *) echo "build-deb.sh: no manylinux wheels known for $arch" >&2; exit 1 ;;
esac
maintainer="${DEB_MAINTAINER:-SCO maintainers <sco-maintainers@example.com>}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
root="$work/root"
lib="$root/usr/lib/sco-agent"
mkdir -p "$lib" "$root/DEBIAN" "$root/$unitdir" "$root/usr/bin" "$root/usr/share/sco-agent" \
    "$root/usr/share/doc/sco-agent" "$root/usr/share/man/man8" "$root/usr/share/lintian/overrides"

# The agent wheel (pure), from a copy of its sources (setuptools writes build/ and
# egg-info beside pyproject.toml: builds for two targets at once must not share them), then it and its dependencies for the target's CPython, pinned to
# the versions the repository locked (requirements.lock, without its hashes).
isolation=()  # setuptools already here: no isolated build environment to download
if "$PYTHON" -c 'import setuptools, wheel' 2>/dev/null; then isolation=(--no-build-isolation); fi
mkdir -p "$work/src/deploy/agent"
cp "$here/pyproject.toml" "$work/src/deploy/agent/"
cp -r "$repo/agent" "$repo/contracts" "$work/src/"
find "$work/src" -name __pycache__ -type d -prune -exec rm -rf {} +
"$PYTHON" -m pip wheel --quiet --no-deps "${isolation[@]}" -w "$work/wheel" "$work/src/deploy/agent" 2>"$work/pip.log" \
    || { cat "$work/pip.log" >&2; exit 1; }
sed -n 's/^\([A-Za-z0-9_.-]*==[^ ]*\).*/\1/p' "$repo/requirements.lock" >"$work/constraints.txt"
platforms=(--platform "manylinux2014_$machine")
for minor in $(seq 17 "$glibc"); do platforms+=(--platform "manylinux_2_${minor}_$machine"); done
# shellcheck disable=SC2086  # PIP_ARGS is a list of pip options
"$PYTHON" -m pip install --quiet --disable-pip-version-check --no-compile ${PIP_ARGS:-} \
    --target "$lib" --python-version "$pyver" --implementation cp --only-binary=:all: \
    "${platforms[@]}" -c "$work/constraints.txt" "$work"/wheel/sco_agent-"$upstream"-*.whl \
    2>"$work/pip.log" || { cat "$work/pip.log" >&2; exit 1; }
rm -rf "$lib/bin"  # console scripts of the dependencies: not for this package
# dist-info RECORD files list paths relative to a site-packages this package has not got.
find "$lib" -name RECORD -path '*.dist-info/*' -delete
find "$lib" -type f -exec chmod 0644 {} + && find "$lib" -type d -exec chmod 0755 {} +
# What dh_strip does: the wheels' extension modules carry symbols and .comment sections.
if command -v strip >/dev/null; then
    find "$lib" -name '*.so' -exec strip --remove-section=.comment --remove-section=.note \
        --strip-unneeded {} +
fi

cat >"$root/usr/bin/sco-agent" <<EOF
#!/usr/bin/python3 -I
# The SCO node agent, from /usr/lib/sco-agent (-I: no user site, no PYTHON* variables).
import sys

sys.path.insert(0, "/usr/lib/sco-agent")
from agent.cli import main  # noqa: E402

sys.exit(main())
EOF
chmod 0755 "$root/usr/bin/sco-agent"
install -m 0644 "$here/sco-agent.service" "$root/$unitdir/sco-agent.service"
install -m 0644 "$here/agent.toml.example" "$root/usr/share/sco-agent/agent.toml.example"
install -m 0644 "$here/README.md" "$root/usr/share/doc/sco-agent/README.md"
gzip -9n <"$here/sco-agent.8" >"$root/usr/share/man/man8/sco-agent.8.gz"
# The changelog's newest entry is this build: upstream revision 1 for the target release.
sed -e "1s/^sco-agent ($upstream-1) unstable;/sco-agent ($version) $codename;/" \
    -e "s/^ -- SCO maintainers <[^>]*>/ -- $maintainer/" "$here/changelog" | gzip -9n >"$root/usr/share/doc/sco-agent/changelog.Debian.gz"
zcat "$root/usr/share/doc/sco-agent/changelog.Debian.gz" | head -1 | grep -qF "($version) $codename;" \
    || { echo "build-deb.sh: deploy/agent/changelog does not start with sco-agent ($upstream-1) unstable;" >&2; exit 1; }
install -m 0644 "$here/lintian-overrides" "$root/usr/share/lintian/overrides/sco-agent"
chmod 0644 "$root/usr/share/man/man8/sco-agent.8.gz" "$root/usr/share/doc/sco-agent/changelog.Debian.gz"
cat >"$root/usr/share/doc/sco-agent/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: sco-agent
Comment: the SCO node agent, and under /usr/lib/sco-agent the Python packages it needs
 (nats-py, pynacl, cffi and theirs), each under its own
 licence: see its .dist-info directory there.

Files: *
Copyright: 2026 SCO maintainers
License: proprietary
 All rights reserved by the SCO maintainers; for use on the operator's own nodes.
EOF

cat >"$root/DEBIAN/postinst" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = "configure" ]; then
    if ! getent passwd sco-agent >/dev/null; then
        useradd --system --user-group --home-dir /var/lib/sco-agent --no-create-home \
            --shell /usr/sbin/nologin --comment "SCO node agent" sco-agent
    fi
    install -d -m 0755 /etc/sco-agent /etc/sco-agent/trust
    install -d -o sco-agent -g sco-agent -m 0750 /var/lib/sco-agent /var/lib/sco-agent/bundle
    fresh=0
    if [ ! -e /etc/sco-agent/agent.toml ]; then
        install -m 0640 -g sco-agent /usr/share/sco-agent/agent.toml.example \
            /etc/sco-agent/agent.toml
        fresh=1
    fi
    # Byte-compile once here: the unit runs with a read-only /usr (ProtectSystem=strict).
    PYTHON -m compileall -q -j 0 /usr/lib/sco-agent >/dev/null || true
    if [ "$fresh" = 1 ]; then
        echo "sco-agent: edit /etc/sco-agent/agent.toml, put the region's signing keys in" \
            "/etc/sco-agent/trust, run 'sco-agent --check', then 'systemctl start sco-agent'."
    fi
fi
# Automatically added by dh_installsystemd (debhelper's snippet): enable, never start a
# fresh install (it needs its agent.toml first), restart on an upgrade.
if [ "$1" = "configure" ] || [ "$1" = "abort-upgrade" ] || [ "$1" = "abort-deconfigure" ] || [ "$1" = "abort-remove" ] ; then
    # This will only remove masks created by d-s-h on package removal.
    deb-systemd-helper unmask 'sco-agent.service' >/dev/null || true
    # was-enabled defaults to true, so new installations run enable.
    if deb-systemd-helper --quiet was-enabled 'sco-agent.service'; then
        deb-systemd-helper enable 'sco-agent.service' >/dev/null || true
    else
        deb-systemd-helper update-state 'sco-agent.service' >/dev/null || true
    fi
fi
if [ "$1" = "configure" ] || [ "$1" = "abort-upgrade" ] || [ "$1" = "abort-deconfigure" ] || [ "$1" = "abort-remove" ] ; then
    if [ -d /run/systemd/system ]; then
        systemctl --system daemon-reload >/dev/null || true
        if [ -n "$2" ]; then
            deb-systemd-invoke try-restart 'sco-agent.service' >/dev/null || true
        fi
    fi
fi
exit 0
EOF
sed -i "s|PYTHON -m compileall|python$pyver -m compileall|" "$root/DEBIAN/postinst"

cat >"$root/DEBIAN/prerm" <<'EOF'
#!/bin/sh
set -e
if [ -d /run/systemd/system ] && [ "$1" = remove ]; then
    deb-systemd-invoke stop 'sco-agent.service' >/dev/null || true
fi
if [ "$1" = remove ] || [ "$1" = upgrade ]; then
    # What postinst byte-compiled: not in the package's file list.
    find /usr/lib/sco-agent -name __pycache__ -type d -prune -exec rm -rf {} + 2>/dev/null || true
fi
exit 0
EOF

cat >"$root/DEBIAN/postrm" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = "remove" ]; then
    if [ -x "/usr/bin/deb-systemd-helper" ]; then
        deb-systemd-helper mask 'sco-agent.service' >/dev/null || true
    fi
fi
if [ "$1" = "purge" ]; then
    if [ -x "/usr/bin/deb-systemd-helper" ]; then
        deb-systemd-helper purge 'sco-agent.service' >/dev/null || true
        deb-systemd-helper unmask 'sco-agent.service' >/dev/null || true
    fi
    rm -rf /var/lib/sco-agent
    rm -f /etc/sco-agent/agent.toml
    rmdir /etc/sco-agent/trust /etc/sco-agent 2>/dev/null || true
    # The sco-agent user stays: files it owned may remain (Debian policy keeps system users).
fi
if [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null || true
fi
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
Depends: python3 (>= $pyver~), python3 (<< $next~), libc6, passwd, init-system-helpers (>= 1.52)
Section: admin
Priority: optional
Description: SCO node agent: drains a reclaimable node on a reclaim notice
 Runs on every compute node lent as reclaimable capacity. On a reclaim notice
 it cordons the node, tells every workload per its contract (checkpoint,
 decommission, requeue) over a Unix socket, waits a bounded time and forces
 what is left.
 Built for Debian $release ($codename, Python $pyver).
EOF
(cd "$root" && find . -type f ! -path './DEBIAN/*' -printf '%P\0' | sort -z \
    | xargs -0 md5sum >DEBIAN/md5sums)
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/md5sums"

mkdir -p "$out"
deb="$out/sco-agent_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
