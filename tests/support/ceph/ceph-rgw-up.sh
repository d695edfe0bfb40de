#!/bin/bash
# Single-node Ceph Pacific (Debian 12 packages 16.2.15) + RADOS Gateway (S3) entirely under $D, no systemd,
# auth none, 1 mon, 1 mgr (optional, MGR=0 to skip), 1 memstore OSD (data in RAM), radosgw on 127.0.0.1:7480.
# Prereq: apt-get install -y --no-install-recommends ceph-mon ceph-mgr ceph-osd radosgw ceph-common
# Modelled on ceph/src/vstart.sh. Ports: mon v2 46790 / v1 46789, daemons 46800-46899, rgw 7480
# (kept away from the default OSD range 6800-7300, which would include 7233).
set -euo pipefail
D=${D:-${TMPDIR:-/tmp}/sco-ceph}
RGW_PORT=${RGW_PORT:-7480}
MGR=${MGR:-1}
MON_PORT=${MON_PORT:-46789}  # v1; v2 is MON_PORT+1
PORT_MIN=${PORT_MIN:-46800}
PORT_MAX=$((PORT_MIN + 99))
MON_ADDR="[v2:127.0.0.1:$((MON_PORT + 1)),v1:127.0.0.1:$MON_PORT]"
CONF=$D/ceph.conf
t0=$(date +%s.%N)
mkdir -p $D/{run,log,mon.a,osd.0,mgr.x,rgw}
FSID=$(uuidgen)
cat > $CONF <<EOC
[global]
fsid = $FSID
mon host = $MON_ADDR
public addr = 127.0.0.1
ms bind port min = $PORT_MIN
ms bind port max = $PORT_MAX
auth cluster required = none
auth service required = none
auth client required = none
auth supported = none
keyring = $D/keyring
run dir = $D/run
admin socket = $D/run/\$name.asok
pid file = $D/run/\$name.pid
log file = $D/log/\$name.log
mon cluster log file = $D/log/cluster.log
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon max pg per osd = 1000
# silence HEALTH_WARNs that are irrelevant for a throwaway dev cluster
mon data avail warn = 1
mon warn on insecure global id reclaim allowed = false
[mon]
mon data = $D/mon.\$id
[mgr]
mgr data = $D/mgr.\$id
[osd]
osd data = $D/osd.\$id
osd objectstore = memstore
memstore device bytes = 4294967296
osd memory target = 939524096
[client.rgw.local]
rgw data = $D/rgw
rgw frontends = beast endpoint=127.0.0.1:$RGW_PORT
rgw dns name = localhost
# radosgw defaults ms_mon_client_mode to 'secure', which auth=none cannot do -> 'get_initial_auth_request returned -13' forever
ms mon client mode = crc
EOC
touch $D/keyring
# --- mon
monmaptool --create --clobber --fsid $FSID --addv a "$MON_ADDR" $D/monmap >/dev/null
ceph-mon -c $CONF -i a --mkfs --monmap $D/monmap
setsid ceph-mon -c $CONF -i a -f </dev/null >>$D/log/mon.a.out 2>&1 &
echo $! > $D/run/mon.a.mypid
C="ceph -c $CONF"
for i in $(seq 1 60); do $C -s --connect-timeout 2 >/dev/null 2>&1 && break; sleep 0.5; done
# --- mgr (optional: pool creation works without it, but 'ceph -s' health is nicer with it)
if [ "$MGR" = 1 ]; then
  setsid ceph-mgr -c $CONF -i x -f </dev/null >>$D/log/mgr.x.out 2>&1 &
  echo $! > $D/run/mgr.x.mypid
fi
# --- osd (memstore)
OSD_UUID=$(uuidgen)
OSD_ID=$($C osd new $OSD_UUID)
ceph-osd -c $CONF -i $OSD_ID --mkfs --osd-uuid $OSD_UUID >>$D/log/osd.$OSD_ID.out 2>&1
setsid ceph-osd -c $CONF -i $OSD_ID -f </dev/null >>$D/log/osd.$OSD_ID.out 2>&1 &
echo $! > $D/run/osd.$OSD_ID.mypid
for i in $(seq 1 120); do $C osd stat 2>/dev/null | grep -q '1 up' && break; sleep 0.5; done
# --- rgw
setsid radosgw -c $CONF -n client.rgw.local -f </dev/null >>$D/log/rgw.out 2>&1 &
echo $! > $D/run/rgw.mypid
for i in $(seq 1 240); do curl -s -o /dev/null http://127.0.0.1:$RGW_PORT/ && break; sleep 0.5; done
curl -s http://127.0.0.1:$RGW_PORT/ || true; echo
t1=$(date +%s.%N)
echo "bring-up seconds: $(echo "$t1 - $t0" | bc)"
$C -s
