#!/usr/bin/env bash
# `unkai sync` against `rclone copy` (issue 38's first target; recorded in docs/benchmarks.md):
#   scripts/bench-sync.sh [FILES] [THREADS] [DELAY_MS] [ROUNDS]
# A versitygw S3 server on 127.0.0.1 (scripts/servers.sh install) holds FILES files of 1 KiB
# (100 directories); both tools read them through the same examples/delayproxy.rs, which
# holds every request DELAY_MS (default 20) before passing it on, so each GET and LIST is that
# much later for both. Then ROUNDS times (default 3), in a rotating order, each tool copies
# the prefix into a fresh destination, then runs again with nothing changed:
#   uv: `unkai sync s3://... META-URL:/tree` into a fresh SQLite volume (no mount: the vfs in
#       its own process), THREADS files at once;
#   rv: `rclone copy` into a mount of a fresh volume made the same way (the same destination
#       as unkai's, through the kernel), --transfers and --checkers THREADS;
#   ul, rl: each into a plain local directory (the tools alone, no volume).
# The medians' seconds and files/s are printed; every copy is compared with the source.
# Everything runs in a temporary directory, removed at the end (mounts unmounted first).
set -euo pipefail
FILES=${1:-10000}
THREADS=${2:-50}
DELAY=${3:-20}
ROUNDS=${4:-3}
HERE=$(cd "$(dirname "$0")/.." && pwd)
BIN=${UNKAI_BIN:-$HERE/target/release/unkai}
PROXY=${UNKAI_PROXY:-$HERE/target/release/examples/delayproxy}
GW=${UNKAI_TOOLS:-$HOME/.cache/unkai-tools}/bin/versitygw
command -v rclone >/dev/null || { echo "rclone is missing: apt-get install rclone" >&2; exit 1; }
[ -x "$PROXY" ] || { echo "build the proxy first: cargo build --release --example delayproxy" >&2; exit 1; }
T=$(mktemp -d /tmp/unkai-syncbench-XXXXXX)
PIDS=()
MPS=()
cleanup() {
  for m in "${MPS[@]}"; do fusermount3 -u "$m" 2>/dev/null || umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 0.5
  rm -rf "$T"
}
trap cleanup EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 200); do (echo >/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }
GWP=$(port)
mkdir -p "$T/s3"
ROOT_ACCESS_KEY_ID=bench ROOT_SECRET_ACCESS_KEY=benchsecret "$GW" --port 127.0.0.1:$GWP posix "$T/s3" >"$T/gw.log" 2>&1 &
PIDS+=($!)
wait_port "$GWP"
PP=$(port)
"$PROXY" 127.0.0.1:$PP 127.0.0.1:$GWP "$DELAY" >"$T/proxy.log" 2>&1 &
PIDS+=($!)
wait_port "$PP"
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=benchsecret AWS_REGION=us-east-1
# The store is plain HTTP on the loopback; a CA bundle from the environment trips rclone.
unset AWS_CA_BUNDLE
NEAR=http://127.0.0.1:$GWP
FAR=http://127.0.0.1:$PP

# The source: FILES files of 1 KiB in 100 directories, put straight into the bucket.
python3 - "$T/src" "$FILES" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(root, "d%02d" % (i % 100))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%06d" % i), "wb") as f:
        f.write(os.urandom(1024))
PY
AWS_ENDPOINT_URL=$NEAR "$BIN" sync -q --threads 50 "$T/src" s3://srcb/tree >/dev/null

secs() { # COMMAND...: runs it, prints its wall seconds
  local a b; a=$(date +%s.%N); "$@" >"$T/last.out" 2>&1 || { cat "$T/last.out" >&2; exit 1; }; b=$(date +%s.%N)
  echo "$b - $a" | bc
}
row() { # LABEL SECONDS [FIRST_SECONDS]
  local rate ratio=""
  rate=$(echo "scale=0; $FILES / $2" | bc)
  [ -n "${3:-}" ] && ratio=$(echo "scale=3; $2 / $3" | bc)
  printf '%-44s %8.2f s %8s files/s %s\n' "$1" "$2" "$rate" "${ratio:+(${ratio} of the first)}"
}
same() { # DIR: the tree under DIR equals the source
  diff -r -q "$T/src" "$1" >/dev/null || { echo "copy in $1 differs from the source" >&2; exit 1; }
}
fresh_volume() { # NAME: a SQLite volume, blocks in a local directory
  "$BIN" format --storage "file://$T/blocks-$1" "sqlite://$T/$1.db" "bench-$1" >/dev/null
}

export RCLONE_CONFIG_SRC_TYPE=s3 RCLONE_CONFIG_SRC_PROVIDER=Other RCLONE_CONFIG_SRC_ENDPOINT=$FAR \
  RCLONE_CONFIG_SRC_ACCESS_KEY_ID=bench RCLONE_CONFIG_SRC_SECRET_ACCESS_KEY=benchsecret \
  RCLONE_CONFIG_SRC_REGION=us-east-1 RCLONE_CONFIG_SRC_FORCE_PATH_STYLE=true
RC=(rclone copy --config /dev/null --transfers "$THREADS" --checkers "$THREADS" src:srcb/tree)
US=(sync -q --threads "$THREADS" s3://srcb/tree)
mount_vol() { # NAME: mounts volume NAME on $T/mnt-NAME
  mkdir -p "$T/mnt-$1"
  "$BIN" mount --cache-dir "$T/cache-$1" "sqlite://$T/$1.db" "$T/mnt-$1" >"$T/mount-$1.log" 2>&1 &
  PIDS+=($!); MPS+=("$T/mnt-$1")
  for _ in $(seq 300); do mountpoint -q "$T/mnt-$1" && return; sleep 0.1; done
  echo "mount $1 did not come up" >&2; exit 1
}
unmount_vol() { fusermount3 -u "$T/mnt-$1"; for _ in $(seq 300); do mountpoint -q "$T/mnt-$1" || return 0; sleep 0.1; done; }
declare -A FIRST AGAIN
run_pair() { # LABEL: the first run and the rerun of one tool into a fresh destination
  local a b
  case $1 in
    uv) fresh_volume "uv$R"
        a=$(AWS_ENDPOINT_URL=$FAR secs "$BIN" "${US[@]}" --cache-dir "$T/cache-uv$R" "sqlite://$T/uv$R.db:/tree")
        grep -q "copied $FILES," "$T/last.out" || { echo "unkai sync did not copy every file: $(cat "$T/last.out")" >&2; exit 1; }
        b=$(AWS_ENDPOINT_URL=$FAR secs "$BIN" "${US[@]}" --cache-dir "$T/cache-uv$R" "sqlite://$T/uv$R.db:/tree")
        mount_vol "uv$R"; same "$T/mnt-uv$R/tree"; unmount_vol "uv$R" ;;
    rv) fresh_volume "rv$R"; mount_vol "rv$R"
        a=$(secs "${RC[@]}" "$T/mnt-rv$R/tree"); b=$(secs "${RC[@]}" "$T/mnt-rv$R/tree")
        same "$T/mnt-rv$R/tree"; unmount_vol "rv$R" ;;
    ul) a=$(AWS_ENDPOINT_URL=$FAR secs "$BIN" "${US[@]}" "$T/ul$R")
        b=$(AWS_ENDPOINT_URL=$FAR secs "$BIN" "${US[@]}" "$T/ul$R")
        same "$T/ul$R"; rm -rf "$T/ul$R" ;;
    rl) a=$(secs "${RC[@]}" "$T/rl$R"); b=$(secs "${RC[@]}" "$T/rl$R")
        same "$T/rl$R"; rm -rf "$T/rl$R" ;;
  esac
  FIRST[$1]+="$a "; AGAIN[$1]+="$b "
}
median() { printf '%s\n' $@ | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

echo "$FILES files of 1 KiB, every request to the store ${DELAY} ms late, $THREADS at once, $ROUNDS rounds"
ORDER=(uv rv ul rl)
for R in $(seq "$ROUNDS"); do
  # Each round in another order: a machine busy at one moment does not favour one tool.
  for i in 0 1 2 3; do run_pair "${ORDER[$(( (i + R - 1) % 4 ))]}"; done
done
declare -A NAME=([uv]="unkai sync -> volume (vfs, no mount)" [rv]="rclone copy -> mount of a volume"
  [ul]="unkai sync -> local directory" [rl]="rclone copy -> local directory")
declare -A MED
for k in uv rv ul rl; do
  MED[$k]=$(median ${FIRST[$k]})
  row "${NAME[$k]}" "${MED[$k]}"
  echo "    first runs: ${FIRST[$k]}"
  row "  again, nothing changed" "$(median ${AGAIN[$k]})" "${MED[$k]}"
  echo "    reruns: ${AGAIN[$k]}"
done
echo "unkai's speed / rclone's, into a volume: $(echo "scale=2; ${MED[rv]} / ${MED[uv]}" | bc); into a local directory: $(echo "scale=2; ${MED[rl]} / ${MED[ul]}" | bc)"
