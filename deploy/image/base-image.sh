#!/bin/bash
# localhost/debian:bookworm from Debian packages (debootstrap), for hosts that reach no
# container registry; idempotent (an existing image is kept). ~45 s, 121 MB.
# Needs: apt-get install -y podman runc debootstrap.
set -euo pipefail
here=$(dirname "$(readlink -f "$0")")
export CONTAINERS_CONF=${CONTAINERS_CONF:-$here/containers.conf}
base=${BASE_IMAGE:-localhost/debian:bookworm}
podman image exists "$base" && exit 0
work=$(mktemp -d "${TMPDIR:-/tmp}/sco-rootfs.XXXXXX")
trap 'rm -rf "$work"' EXIT
mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
debootstrap --variant=minbase bookworm "$work/rootfs" "${mirror:-http://deb.debian.org/debian}" >"$work/log" \
    || { tail -20 "$work/log" >&2; exit 1; }
rm -rf "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/var/lib/apt/lists/*
tar -C "$work/rootfs" -c . | podman import - "$base" >/dev/null
echo "$base imported"
