#!/usr/bin/env bash
# Runs the whole test suite: unit tests, integration tests through real FUSE mounts, and the
# peer suites (pjdfstest, fsx) against a mounted volume. Run as root on Debian/Ubuntu.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib/deps.sh
ensure_build_deps

# `unkai csi` (tests/csi.rs): csi-sanity, the CSI spec's own conformance suite, built from the
# kubernetes-csi/csi-test Go module (in the background, below). The CSI spec's module (its
# csi.proto, which build.rs compiles) goes in Go's module cache before cargo builds.
TOOLS="${UNKAI_TOOLS:-$HOME/.cache/unkai-tools}"
command -v go >/dev/null || apt_install golang-go
go mod download github.com/container-storage-interface/spec@v1.13.0
build_tools() {
  if [ ! -x "$TOOLS/bin/csi-sanity" ]; then
    echo "==> building csi-sanity (go install)"
    mkdir -p "$TOOLS/bin"
    GOBIN="$TOOLS/bin" go install github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@v5.6.0
  fi
  ensure_peer_tools
}

# The Kubernetes manifests (contrib/kubernetes) against Kubernetes' schemas, offline: the
# kubernetes-validate package bundles them (no cluster here).
apt_install python3 python3-venv
if [ ! -x "$TOOLS/venv/bin/kubernetes-validate" ]; then
  echo "==> installing kubernetes-validate (pip)"
  /usr/bin/python3 -m venv "$TOOLS/venv"
  "$TOOLS/venv/bin/pip" install -q "kubernetes-validate==1.37.0"
fi
echo "==> validating contrib/kubernetes against Kubernetes' schemas"
"$TOOLS/venv/bin/kubernetes-validate" --strict contrib/kubernetes/*.yaml

start=$(date +%s)
# The tools the tests run (csi-sanity; pjdfstest and fsx for the peer suites) build in the
# background, beside the lint and the build, which leave a core idle at times (one crate's
# front end, a link); waited for before the tests.
apt_install libacl1-dev acl
tools_log=$(mktemp /tmp/unkai-tools.XXXXXX)
build_tools > "$tools_log" 2>&1 &
tools=$!
trap 'kill "$tools" 2>/dev/null || true; rm -f "$tools_log"' EXIT

echo "==> lint (rustfmt, clippy: warnings are errors)"
if ! cargo clippy --version >/dev/null 2>&1 || ! cargo fmt --version >/dev/null 2>&1; then
  rustup component add clippy rustfmt >/dev/null 2>&1 || true
fi
cargo fmt --check
cargo clippy --release --locked --all-targets -- -D warnings

# What the tests need (`cargo bench`'s target is linted above, not built: the suite never
# runs it).
echo "==> building (release)"
cargo test --release --locked --no-run

scripts/servers.sh install
# PostgreSQL engine tests: each test binary starts its own private server (127.0.0.1, a free
# port, a temporary directory) unless UNKAI_TEST_POSTGRES names one (a postgres:// URL).
scripts/postgres.sh install
export UNKAI_TEST_POSTGRES="${UNKAI_TEST_POSTGRES:-local}"

# setfacl, getfacl (tests/acl.rs) and getfattr.
apt_install acl attr
# The real NFS client of tests/nfs.rs (nfs-cp, nfs-ls, nfs-cat); clients are never skipped here.
apt_install libnfs-utils
# boto3 for /usr/bin/python3 (tests/gateway.rs: a real S3 client besides object_store).
apt_install python3-boto3
# The WebDAV clients of tests/webdav.rs: davfs2 (mount.davfs), curl, openssl (its certificate).
apt_install davfs2 curl openssl
# clamd for the antivirus scanning tests (tests/scan.rs: a private daemon and signature
# database, nothing downloaded). The clients the tests need are required: a missing one
# fails its tests instead of skipping them.
apt_install clamav-daemon
export UNKAI_REQUIRE_CLIENTS=1

if ! wait "$tools"; then
  cat "$tools_log"
  echo "error: building the test tools failed (csi-sanity, pjdfstest, fsx: above)" >&2
  exit 1
fi
cat "$tools_log"

echo "==> unit and integration tests"
cargo test --release --locked -- --test-threads="${TEST_THREADS:-4}"

echo "==> the Python package (wheel, fsspec's abstract suite, FUSE and PostgreSQL interop)"
scripts/python.sh

echo "==> conformance suite on a PostgreSQL volume"
UNKAI_TEST_ENGINE=postgres cargo test --release --locked --test conformance -- \
  --test-threads="${TEST_THREADS:-4}"

echo "==> peer suites"
scripts/peer-suites.sh

# Benchmark figures (printed, never asserted) only when asked: `UNKAI_BENCH=1
# scripts/test.sh`, or `scripts/bench-quick.sh` alone. CI keeps no figures of a run that
# passed, and the quick run took a minute and a half of its 35.
if [ "${UNKAI_BENCH:-0}" = 1 ]; then
  scripts/bench-quick.sh
fi

echo "==> all tests passed in $(( $(date +%s) - start ))s"
