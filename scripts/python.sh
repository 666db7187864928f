#!/usr/bin/env bash
# The Python package (python/): builds its wheel with maturin (in this cargo workspace, so
# it reuses what `cargo build --release` built), installs it into a venv of its own and runs
# its tests with pytest: fsspec's own abstract suite (copy, get, put, open, pipe) against the
# unkai:// file system, Parquet through pyarrow both ways with a real FUSE mount (SQLite
# volume), whole files both ways with a FUSE mount of a PostgreSQL volume, errors and identity.
#   scripts/python.sh            build, install, test (as root on Debian: CI)
#   scripts/python.sh build      only build the wheel (into target/wheels)
# Python: Debian's /usr/bin/python3 (3.11 on bookworm; the wheel is abi3 for 3.11 and later),
# with python3-venv; the venv is target/py-venv (PyPI: maturin, fsspec, pytest, pyarrow, pandas).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/deps.sh

PY=/usr/bin/python3
VENV=target/py-venv
apt_install python3 python3-venv
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --disable-pip-version-check \
  'maturin>=1.8,<2' 'fsspec>=2024.2' pytest pyarrow pandas

echo "==> building the Python wheel (maturin)"
rm -f target/wheels/unkai-*.whl
(cd python && ../"$VENV"/bin/maturin build --release --locked --strip --compatibility linux \
  --interpreter ../"$VENV"/bin/python --out ../target/wheels)
wheel=$(ls target/wheels/unkai-*.whl)
echo "built $wheel"
[ "${1:-}" = build ] && exit 0

"$VENV/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps "$wheel"

echo "==> Python package tests (pytest)"
# scripts/test.sh built it already (a build of the binary alone would resolve features
# without the dev-dependencies' and compile the library again).
[ -x target/release/unkai ] || cargo build --release --locked --bin unkai
export UNKAI_BIN="$PWD/target/release/unkai"
export UNKAI_TEST_POSTGRES="${UNKAI_TEST_POSTGRES:-local}"
# Run from the tests' directory, so that `import unkai` is the installed wheel.
(cd python/tests && ../../"$VENV"/bin/python -m pytest -q -p no:cacheprovider .)
