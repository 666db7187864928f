#!/usr/bin/env bash
# Runs the whole test suite: unit tests, integration tests through real FUSE mounts, and the
# peer suites (pjdfstest, fsx) against a mounted volume. Run as root on Debian/Ubuntu.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib/deps.sh
ensure_build_deps

# `unkai csi` (tests/csi.rs): csi-sanity, the CSI spec's own conformance suite, built from the
# kubernetes-csi/csi-test Go module. Installing it first also puts the CSI spec's module (its
# csi.proto, which build.rs compiles) in Go's module cache before cargo builds.
TOOLS="${UNKAI_TOOLS:-$HOME/.cache/unkai-tools}"
command -v go >/dev/null || apt_install golang-go
if [ ! -x "$TOOLS/bin/csi-sanity" ]; then
  echo "==> building csi-sanity (go install)"
  mkdir -p "$TOOLS/bin"
  GOBIN="$TOOLS/bin" go install github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@v5.6.0
fi
go mod download github.com/container-storage-interface/spec@v1.13.0

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
echo "==> lint (rustfmt, clippy: warnings are errors)"
if ! cargo clippy --version >/dev/null 2>&1 || ! cargo fmt --version >/dev/null 2>&1; then
  rustup component add clippy rustfmt >/dev/null 2>&1 || true
fi
cargo fmt --check
cargo clippy --release --locked --all-targets -- -D warnings

echo "==> building (release)"
cargo build --release --locked --all-targets

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

echo "==> unit and integration tests"
cargo test --release --locked -- --test-threads="${TEST_THREADS:-4}"

echo "==> the Python package (wheel, fsspec's abstract suite, FUSE and PostgreSQL interop)"
scripts/python.sh

echo "==> conformance suite on a PostgreSQL volume"
UNKAI_TEST_ENGINE=postgres cargo test --release --locked --test conformance -- \
  --test-threads="${TEST_THREADS:-4}"

if [ -x scripts/peer-suites.sh ]; then
  echo "==> peer suites"
  scripts/peer-suites.sh
fi

# Benchmark figures (printed, never asserted: CI machines are noisy).
scripts/bench-quick.sh

echo "==> all tests passed in $(( $(date +%s) - start ))s"
