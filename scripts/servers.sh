#!/usr/bin/env bash
# The storage servers the tests run against, all on 127.0.0.1 only:
#   versitygw (S3, Apache-2.0), fake-gcs-server (GCS), Azurite (Azure Blob).
# `scripts/servers.sh install` builds/installs them once into $UNKAI_TOOLS
# (default ~/.cache/unkai-tools); the tests start and stop their own instances
# (tests/common/servers.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/deps.sh
TOOLS="${UNKAI_TOOLS:-$HOME/.cache/unkai-tools}"
mkdir -p "$TOOLS/bin"

install_servers() {
  if [ ! -x "$TOOLS/bin/versitygw" ] || [ ! -x "$TOOLS/bin/fake-gcs-server" ]; then
    command -v go >/dev/null || apt_install golang-go
    echo "==> building versitygw and fake-gcs-server (go install, a few minutes)"
    GOBIN="$TOOLS/bin" go install github.com/versity/versitygw/cmd/versitygw@v1.8.0
    GOBIN="$TOOLS/bin" go install github.com/fsouza/fake-gcs-server@v1.56.1
  fi
  if [ ! -x "$TOOLS/node_modules/.bin/azurite-blob" ] || [ ! -d "$TOOLS/node_modules/@azure/storage-blob" ]; then
    command -v npm >/dev/null || apt_install nodejs npm
    echo "==> installing Azurite (npm)"
    (cd "$TOOLS" && npm install --silent --no-audit --no-fund azurite@3 @azure/storage-blob@12 >/dev/null)
  fi
  echo "==> test servers ready in $TOOLS"
}

case "${1:-install}" in
  install) install_servers ;;
  *) echo "usage: $0 install" >&2; exit 2 ;;
esac
