#!/usr/bin/env bash
# A private PostgreSQL server for tests and benchmarks, on 127.0.0.1 only.
#   scripts/postgres.sh install      installs Debian's postgresql if initdb is missing
#   scripts/postgres.sh start DIR [PORT]
#                                    creates a cluster in DIR (if new) and starts it on PORT
#                                    (default: a free port); prints the admin META-URL base,
#                                    postgres://unkai:PASSWORD@127.0.0.1:PORT/postgres?sslmode=disable
#                                    (also kept in DIR/url; the password in DIR/password)
#   scripts/postgres.sh stop DIR     stops it (immediately: test data only)
#   scripts/postgres.sh standby PRIMARY_DIR DIR [PORT]
#                                    makes DIR a streaming standby of the running server of
#                                    PRIMARY_DIR (pg_basebackup -R) and starts it like `start`
#                                    (same password; prints its URL); then makes the primary
#                                    commit synchronously (synchronous_standby_names = '*':
#                                    a commit waits until the standby has flushed it) and
#                                    waits until the standby streams as a synchronous one
#   scripts/postgres.sh promote DIR  promotes the standby in DIR to a primary (waits for it)
#   scripts/postgres.sh certs DIR SAN
#                                    makes a CA (DIR/ca.crt) and a server certificate it signs
#                                    (DIR/server.crt, .key) for SAN (e.g.
#                                    IP:127.0.0.1,DNS:localhost), with the openssl CLI; a later
#                                    `start DIR` then turns ssl on with them. Also a client
#                                    certificate (DIR/client.crt, .key) for user `unkai_cert`,
#                                    whom the server lets in by that certificate alone
# As root, the cluster belongs to the `postgres` system user (PostgreSQL refuses to run as
# root). fsync is off: a test server, not a place for data. The tests start their own servers
# this way (tests/common/postgres.rs) when UNKAI_TEST_POSTGRES=local.
# With PG_DURABLE=1, `start` keeps PostgreSQL's own settings instead (fsync,
# synchronous_commit and full_page_writes on, as a real server runs): for benchmarks and for
# the tests of what a crash of the server may lose.
# PG_MAX_CONNECTIONS sets max_connections (300 unless given; PostgreSQL's own default is 100).
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
    if [ -f "$dir/ca.crt" ]; then
      # User unkai_cert logs in with a client certificate of the CA (and nothing else).
      { echo "hostssl all unkai_cert 127.0.0.1/32 cert"; cat "$dir/data/pg_hba.conf"; } \
        > "$dir/hba.tmp" && as_owner cp "$dir/hba.tmp" "$dir/data/pg_hba.conf" && rm "$dir/hba.tmp"
    fi
  fi
  local ssl=""
  if [ -f "$dir/server.crt" ]; then
    ssl="-c ssl=on -c ssl_cert_file=$dir/server.crt -c ssl_key_file=$dir/server.key"
    ssl="$ssl -c ssl_ca_file=$dir/ca.crt"
  fi
  local speed="-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
  [ "${PG_DURABLE:-}" = 1 ] && speed=""
  local tries=0
  while :; do
    if [ -z "$port" ]; then
      port=$(( 20000 + RANDOM % 40000 ))
      port_free "$port" || { port=""; continue; }
    fi
    if as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir $speed -c max_connections=${PG_MAX_CONNECTIONS:-300} $ssl" \
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

# psql on the server of DIR (through its socket), as `unkai`.
psql_in() {
  local dir="$1" bin port
  shift
  bin=$(pg_bin)
  port=$(sed -e 's/.*@127.0.0.1:\([0-9]*\)\/.*/\1/' "$dir/url")
  as_owner env PGPASSWORD="$(head -1 "$dir/password")" "$bin/psql" -X -q -At \
    -h "$dir" -p "$port" -U unkai -d postgres -v ON_ERROR_STOP=1 "$@"
}

standby() {
  local primary="${1:?usage: $0 standby PRIMARY_DIR DIR [PORT]}"
  local dir="${2:?usage: $0 standby PRIMARY_DIR DIR [PORT]}" bin pport
  bin=$(pg_bin)
  primary=$(cd "$primary" && pwd)
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  [ "$(id -u)" = 0 ] && chown postgres: "$dir"
  pport=$(sed -e 's/.*@127.0.0.1:\([0-9]*\)\/.*/\1/' "$primary/url")
  cp "$primary/password" "$dir/password"
  [ "$(id -u)" = 0 ] && chown postgres: "$dir/password"
  # -R: standby.signal and primary_conninfo (with the password given here) in the copy.
  as_owner env PGPASSWORD="$(head -1 "$primary/password")" "$bin/pg_basebackup" \
    -h 127.0.0.1 -p "$pport" -U unkai -D "$dir/data" -R -X stream -c fast --no-sync \
    -d "application_name=unkai_standby" > "$dir/basebackup.log" 2>&1 \
    || { cat "$dir/basebackup.log" >&2; exit 1; }
  start "$dir" "${3:-}" >/dev/null
  psql_in "$primary" -c "ALTER SYSTEM SET synchronous_standby_names = '*'" \
    -c "SELECT pg_reload_conf()" >/dev/null
  local i
  for i in $(seq 1 600); do
    [ "$(psql_in "$primary" -c "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")" = 1 ] \
      && { cat "$dir/url"; return 0; }
    sleep 0.1
  done
  echo "error: the standby in $dir did not start streaming synchronously in 60 s" >&2
  tail -20 "$dir/server.log" >&2
  exit 1
}

promote() {
  local dir="${1:?usage: $0 promote DIR}" bin
  bin=$(pg_bin)
  as_owner "$bin/pg_ctl" -D "$dir/data" -w -t 60 promote >/dev/null
}

stop() {
  local dir="${1:?usage: $0 stop DIR}" bin
  bin=$(pg_bin)
  if [ -f "$dir/data/postmaster.pid" ]; then
    as_owner "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null
  fi
}

certs() {
  local dir="${1:?usage: $0 certs DIR SAN}" san="${2:?usage: $0 certs DIR SAN}"
  mkdir -p "$dir"
  (
    cd "$dir"
    umask 077
    local ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
    openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.crt -days 7 \
      -subj "/CN=unkai test CA" 2>/dev/null
    openssl req "${ec[@]}" -keyout server.key -out server.csr -subj "/CN=unkai test server" \
      2>/dev/null
    printf 'subjectAltName=%s\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n' \
      "$san" > server.ext
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 7 \
      -extfile server.ext -out server.crt 2>/dev/null
    openssl req "${ec[@]}" -keyout client.key -out client.csr -subj "/CN=unkai_cert" 2>/dev/null
    printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n' \
      > client.ext
    openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 7 \
      -extfile client.ext -out client.crt 2>/dev/null
    chmod 644 ca.crt server.crt client.crt
    rm -f server.csr server.ext client.csr client.ext ca.srl
  )
  if [ "$(id -u)" = 0 ]; then
    chown postgres: "$dir" "$dir/server.key" "$dir/server.crt"
  fi
}

case "${1:-}" in
  install) install ;;
  start) shift; start "$@" ;;
  stop) shift; stop "$@" ;;
  standby) shift; standby "$@" ;;
  promote) shift; promote "$@" ;;
  certs) shift; certs "$@" ;;
  *) echo "usage: $0 install | start DIR [PORT] | stop DIR | standby PRIMARY_DIR DIR [PORT] | promote DIR | certs DIR SAN" >&2; exit 2 ;;
esac
