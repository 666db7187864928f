"""Fixtures of the Python package's tests: volumes formatted with the `unkai` binary in
temporary directories, real FUSE mounts of them (unmounted in every path), and a private
PostgreSQL server (scripts/postgres.sh) when UNKAI_TEST_POSTGRES asks for one.

The binary is $UNKAI_BIN, else target/release/unkai of this repository.

Not for: the tests themselves (test_*.py).
"""

import contextlib
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNKAI = os.environ.get("UNKAI_BIN") or str(REPO / "target" / "release" / "unkai")


def run(*args, check=True, **kw):
    p = subprocess.run([UNKAI, *args], capture_output=True, text=True, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"unkai {' '.join(args)} failed ({p.returncode}):\n{p.stdout}{p.stderr}")
    return p


def format_volume(meta_url, bucket, name="pyvol"):
    run("format", "--storage", f"file://{bucket}", meta_url, name)
    return meta_url


@pytest.fixture
def sqlite_volume(tmp_path):
    """A fresh volume: SQLite metadata and a local directory as its bucket."""
    return format_volume(f"sqlite://{tmp_path}/meta.db", tmp_path / "bucket")


def mounted(path):
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == str(path) for line in f)


@contextlib.contextmanager
def fuse_mount(meta_url, mnt, cache_dir):
    """`unkai mount -d` of `meta_url` at `mnt`; unmounted however the block ends."""
    mnt.mkdir(parents=True, exist_ok=True)
    try:
        run("mount", "-d", "--cache-dir", str(cache_dir), meta_url, str(mnt))
        deadline = time.monotonic() + 60
        while not mounted(mnt):
            assert time.monotonic() < deadline, f"{mnt} not mounted after 60 s"
            time.sleep(0.05)
        yield mnt
    finally:
        if mounted(mnt):
            p = run("umount", str(mnt), check=False)
            if p.returncode != 0 and mounted(mnt):
                subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
                raise AssertionError(f"unkai umount {mnt} failed: {p.stdout}{p.stderr}")


def _psql():
    for cand in sorted(Path("/usr/lib/postgresql").glob("*/bin/psql"), reverse=True):
        return str(cand)
    return shutil.which("psql")


@pytest.fixture(scope="session")
def postgres_admin():
    """A PostgreSQL admin URL: a private server (UNKAI_TEST_POSTGRES=local) started with
    scripts/postgres.sh and stopped at the end, or the server UNKAI_TEST_POSTGRES names."""
    want = os.environ.get("UNKAI_TEST_POSTGRES", "")
    if not want:
        pytest.skip("UNKAI_TEST_POSTGRES is unset (set it to `local` or a postgres:// admin URL)")
    if want != "local":
        yield want
        return
    # Directly under /tmp: pytest's own temporary directories are root's alone, and the
    # server runs as the `postgres` user.
    d = Path(tempfile.mkdtemp(prefix="unkai-py-pg-"))
    script = str(REPO / "scripts" / "postgres.sh")
    p = subprocess.run([script, "start", str(d)], capture_output=True, text=True)
    if p.returncode != 0:
        raise AssertionError(f"scripts/postgres.sh start failed: {p.stderr}")
    try:
        yield p.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run([script, "stop", str(d)], capture_output=True)
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def postgres_volume(postgres_admin, tmp_path):
    """A fresh volume on a database of its own (dropped at the end) and a local bucket."""
    db = "unkai_py_" + secrets.token_hex(4)
    psql = _psql()
    assert psql, "psql not found (scripts/postgres.sh install)"

    def sql(stmt):
        p = subprocess.run([psql, "-X", "-q", "-d", postgres_admin, "-c", stmt],
                           capture_output=True, text=True)
        assert p.returncode == 0, f"psql {stmt}: {p.stderr}"

    sql(f"CREATE DATABASE {db}")
    head, _, query = postgres_admin.partition("?")
    url = head.rsplit("/", 1)[0] + "/" + db + ("?" + query if query else "")
    try:
        yield format_volume(url, tmp_path / "bucket")
    finally:
        sql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
