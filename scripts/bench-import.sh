#!/usr/bin/env bash
# A cold read of an imported object against a cold read of the same bytes written into the
# volume (issue 38's third target; recorded in docs/benchmarks.md):
#   scripts/bench-import.sh [SIZE_MIB] [RUNS]
# A versitygw S3 server on 127.0.0.1 (scripts/servers.sh install) holds one object of
# SIZE_MIB (default 1024) random bytes; a SQLite volume whose blocks are on the same server
# imports it (`unkai import`, no byte copied) and holds the same bytes written through a mount
# (`--writeback off`: in the bucket at once). Then RUNS rounds (default 6), each starting with
# another: a fresh mount with an empty cache directory reads one of the two with `dd bs=1M`.
# Prints each run (seconds, and the CPU seconds of the mount and of versitygw: on a loaded
# machine the CPU a byte costs is steadier than the wall time), the medians and the ratio
# of speeds. BEFORE=BINARY: each round also reads the
# imported object through a mount by BINARY (an older build: before and after in one run).
# Everything runs in a temporary directory, removed at the end (mounts unmounted first).
set -euo pipefail
SIZE=${1:-1024}
RUNS=${2:-6}
HERE=$(cd "$(dirname "$0")/.." && pwd)
BIN=${UNKAI_BIN:-$HERE/target/release/unkai}
GW=${UNKAI_TOOLS:-$HOME/.cache/unkai-tools}/bin/versitygw
command -v rclone >/dev/null || { echo "rclone is missing (it puts the object): apt-get install rclone" >&2; exit 1; }
T=$(mktemp -d /tmp/unkai-importbench-XXXXXX)
PIDS=()
MP=$T/mnt
cleanup() {
  mountpoint -q "$MP" 2>/dev/null && { fusermount3 -u "$MP" 2>/dev/null || umount -l "$MP" 2>/dev/null || true; }
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 0.5
  rm -rf "$T"
}
trap cleanup EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
GWP=$(port)
mkdir -p "$T/s3" "$MP"
ROOT_ACCESS_KEY_ID=bench ROOT_SECRET_ACCESS_KEY=benchsecret "$GW" --port 127.0.0.1:$GWP posix "$T/s3" >"$T/gw.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 200); do (echo >/dev/tcp/127.0.0.1/$GWP) 2>/dev/null && break; sleep 0.1; done
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=benchsecret AWS_REGION=us-east-1 AWS_ENDPOINT_URL=http://127.0.0.1:$GWP
unset AWS_CA_BUNDLE
export RCLONE_CONFIG_S_TYPE=s3 RCLONE_CONFIG_S_PROVIDER=Other RCLONE_CONFIG_S_ENDPOINT=$AWS_ENDPOINT_URL \
  RCLONE_CONFIG_S_ACCESS_KEY_ID=bench RCLONE_CONFIG_S_SECRET_ACCESS_KEY=benchsecret \
  RCLONE_CONFIG_S_REGION=us-east-1 RCLONE_CONFIG_S_FORCE_PATH_STYLE=true
META=sqlite://$T/meta.db
"$BIN" format --storage s3://vol/vols "$META" bench >/dev/null
head -c $((SIZE << 20)) /dev/urandom >"$T/big"
rclone mkdir --config /dev/null s:src
rclone copyto --config /dev/null "$T/big" s:src/imp/big
"$BIN" import --quiet --cache-dir "$T/cache-i" "$META" s3://src/imp --at /imp >/dev/null
mount_it() { # CACHE [flags]
  local c=$1; shift
  "${MBIN:-$BIN}" mount --cache-dir "$c" "$@" "$META" "$MP" >>"$T/mount.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 300); do mountpoint -q "$MP" && return; sleep 0.1; done
  echo "the mount did not come up: $(tail -3 "$T/mount.log")" >&2; exit 1
}
unmount_it() { fusermount3 -u "$MP"; for _ in $(seq 300); do mountpoint -q "$MP" || return 0; sleep 0.1; done; }
mount_it "$T/cache-w" --writeback off
mkdir -p "$MP/own"
dd if="$T/big" of="$MP/own/big" bs=1M conv=fsync status=none
cmp "$T/big" "$MP/imp/big"
unmount_it
rm -rf "$T/cache-w"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
read_cold() { # FILE: "SECONDS MOUNT_CPU SERVER_CPU" of a cold dd of it through a fresh mount
  local c=$T/cache-$RANDOM$RANDOM a b g0 g1 m
  mount_it "$c"
  g0=$(ticks "${PIDS[0]}")
  a=$(date +%s.%N); dd if="$MP/$1" of=/dev/null bs=1M status=none; b=$(date +%s.%N)
  m=$(ticks "${PIDS[-1]}"); g1=$(ticks "${PIDS[0]}")
  unmount_it; rm -rf "$c"
  echo "$(echo "$b - $a" | bc) $(echo "scale=2; $m / 100" | bc) $(echo "scale=2; ($g1 - $g0) / 100" | bc)"
}
IMP=() OWN=() OLD=()
KINDS=(imp own)
[ -n "${BEFORE:-}" ] && KINDS+=(old)
for i in $(seq "$RUNS"); do
  # Each round starts with another kind: a machine busier at one moment favours none.
  for j in $(seq 0 $(( ${#KINDS[@]} - 1 ))); do
    case ${KINDS[$(( (i + j) % ${#KINDS[@]} ))]} in
      imp) IMP+=("$(read_cold imp/big)") ;;
      own) OWN+=("$(read_cold own/big)") ;;
      old) OLD+=("$(MBIN=$BEFORE read_cold imp/big)") ;;
    esac
  done
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
field() { local n=$1; shift; for r in "$@"; do echo "$r" | awk -v n="$n" '{print $n}'; done; }
report() { # LABEL RUNS...: the runs, the medians of seconds, the mount's and the server's CPU
  local label=$1; shift
  local s; s=$(median $(field 1 "$@"))
  echo "$label: runs (s, mount CPU s, server CPU s): $(printf '[%s] ' "$@")"
  echo "    median $s s ($(echo "scale=0; $SIZE / $s" | bc) MiB/s), mount CPU $(median $(field 2 "$@")) s, server CPU $(median $(field 3 "$@")) s"
  MED=$s
}
echo "cold read of $SIZE MiB, $RUNS rounds"
report "imported object" "${IMP[@]}"; mi=$MED
report "written into the volume" "${OWN[@]}"; mo=$MED
echo "imported / own (by speed): $(echo "scale=3; $mo / $mi" | bc)"
if [ -n "${BEFORE:-}" ]; then
  report "imported object, mounted by $BEFORE" "${OLD[@]}"
  echo "its imported / own: $(echo "scale=3; $mo / $MED" | bc)"
fi
