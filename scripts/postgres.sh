#!/usr/bin/env bash
# A private PostgreSQL server for tests and benchmarks, on 127.0.0.1 only.
#   scripts/postgres.sh install      installs Debian's postgresql if initdb is missing
#   scripts/postgres.sh start DIR [PORT]
#                                    creates a cluster in DIR (if new) and starts it on PORT
#                                    (default: a free port); prints the admin META-URL base,
#                                    postgres://unkai:PASSWORD@127.0.0.1:PORT/postgres?sslmode=disable
#                                    (also kept in DIR/url; the password in DIR/password)
#   scripts/postgres.sh stop DIR     stops it (immediately: test data only)
# As root, the cluster belongs to the `postgres` system user (PostgreSQL refuses to run as
# root). fsync is off: a test server, not a place for data. The tests start their own servers
# this way (tests/common/postgres.rs) when UNKAI_TEST_POSTGRES=local.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

pg_bin() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
  [ -n "$d" ] && [ -x "$d/initdb" ] || { echo "error: PostgreSQL is not installed: run $0 install" >&2; exit 1; }
  echo "$d"
}

# Runs a command as the owner of the cluster.
as_owner() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

port_free() {
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

install() {
  if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    . "$here/lib/deps.sh"
    apt_install postgresql
  fi
  pg_bin >/dev/null
  echo "==> PostgreSQL ready in $(pg_bin)"
}

start() {
  local dir="${1:?usage: $0 start DIR [PORT]}" port="${2:-}" bin
  bin=$(pg_bin)
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  if [ "$(id -u)" = 0 ]; then
    chown postgres: "$dir"
  fi
  if [ ! -f "$dir/data/PG_VERSION" ]; then
    # A random password for the superuser `unkai`, so that clients authenticate for real.
    local pw
    pw=$(head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n')
    (umask 077 && printf '%s\n' "$pw" > "$dir/password")
    [ "$(id -u)" = 0 ] && chown postgres: "$dir/password"
    as_owner "$bin/initdb" -D "$dir/data" -U unkai --pwfile="$dir/password" \
      --auth-host=scram-sha-256 --auth-local=scram-sha-256 -E UTF8 --no-sync \
      > "$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; exit 1; }
  fi
  local tries=0
  while :; do
    if [ -z "$port" ]; then
      port=$(( 20000 + RANDOM % 40000 ))
      port_free "$port" || { port=""; continue; }
    fi
    if as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300" \
        start >/dev/null; then
      break
    fi
    tries=$((tries + 1))
    if [ -n "${2:-}" ] || [ $tries -ge 5 ]; then
      tail -20 "$dir/server.log" >&2
      exit 1
    fi
    port=""  # taken meanwhile: try another
  done
  local url="postgres://unkai:$(head -1 "$dir/password")@127.0.0.1:$port/postgres?sslmode=disable"
  printf '%s\n' "$url" > "$dir/url"
  echo "$url"
}

stop() {
  local dir="${1:?usage: $0 stop DIR}" bin
  bin=$(pg_bin)
  if [ -f "$dir/data/postmaster.pid" ]; then
    as_owner "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null
  fi
}

case "${1:-}" in
  install) install ;;
  start) shift; start "$@" ;;
  stop) shift; stop "$@" ;;
  *) echo "usage: $0 install | start DIR [PORT] | stop DIR" >&2; exit 2 ;;
esac
