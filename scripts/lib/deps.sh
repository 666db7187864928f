# Shared by the scripts: install what is missing (Debian/Ubuntu, as root).

apt_install() {
  local missing=()
  for pkg in "$@"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "==> installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

ensure_build_deps() {
  apt_install ca-certificates curl build-essential pkg-config fuse3
  if ! command -v cargo >/dev/null 2>&1; then
    [ -x "$HOME/.cargo/bin/cargo" ] || {
      echo "==> installing Rust (rustup)"
      curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
    }
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
  if [ ! -e /dev/fuse ]; then
    modprobe fuse 2>/dev/null || true
  fi
  [ -e /dev/fuse ] || { echo "error: /dev/fuse is missing: this machine cannot mount FUSE file systems" >&2; exit 1; }
}

# The peer suites' tools (crates `pjdfstest` and `fsx`) into $UNKAI_TOOLS/bin, unless there.
# Needs libacl's headers (apt_install libacl1-dev first: apt is not run here, so that this may
# run in the background beside other installs).
ensure_peer_tools() {
  local tools="${UNKAI_TOOLS:-$HOME/.cache/unkai-tools}"
  if [ -x "$tools/bin/pjdfstest" ] && [ -x "$tools/bin/fsx" ]; then
    return 0
  fi
  echo "==> installing pjdfstest and fsx into $tools"
  cargo install --locked --quiet --root "$tools" pjdfstest fsx
}
