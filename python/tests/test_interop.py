"""The Python client and a real FUSE mount of the same volume, both ways: a Parquet file
written with pyarrow through unkai:// reads back equal through the mount and the other way
round (SQLite volume); a file one side writes and closes is read whole by the other on a
PostgreSQL volume. Identity and errors as a mount's caller sees them.
"""

import errno
import hashlib
import os

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import unkai
from conftest import fuse_mount, run


def table(n, seed):
    return pa.table({
        "id": pa.array(range(seed, seed + n), pa.int64()),
        "name": pa.array([f"row-{i}-{seed}" for i in range(n)]),
        "value": pa.array([i * 0.5 + seed for i in range(n)], pa.float64()),
    })


def test_parquet_both_ways_with_a_fuse_mount(sqlite_volume, tmp_path):
    opts = {"meta_url": sqlite_volume, "cache_dir": str(tmp_path / "pycache")}
    fs = fsspec.filesystem("unkai", skip_instance_cache=True, **opts)
    try:
        with fuse_mount(sqlite_volume, tmp_path / "mnt", tmp_path / "fusecache") as mnt:
            # The Python client is a live session of the volume: the mount, which ends dead
            # sessions as it starts, left it (its process is `python`, not an unkai).
            status = run("status", sqlite_volume).stdout
            assert f"at (python, pid {os.getpid()})" in status, status
            assert f"at {mnt} " in status, status
            # Python -> FUSE.
            t1 = table(50_000, 1)
            with fsspec.open("unkai://data/one.parquet", "wb", **opts) as f:
                pq.write_table(t1, f)
            assert pq.read_table(mnt / "data" / "one.parquet").equals(t1)
            # pandas through the URL too.
            import pandas as pd
            df = pd.read_parquet("unkai://data/one.parquet", storage_options=opts)
            assert df["id"].tolist() == t1.column("id").to_pylist()
            # FUSE -> Python.
            t2 = table(70_000, 7)
            (mnt / "data" / "sub").mkdir()
            pq.write_table(t2, mnt / "data" / "sub" / "two.parquet")
            assert pq.read_table("unkai://data/sub/two.parquet", filesystem=fs).equals(t2)
            # pyarrow.dataset over the directory.
            import pyarrow.dataset as ds
            got = ds.dataset("/data/sub", filesystem=fs, format="parquet").to_table()
            assert got.equals(t2)
    finally:
        fs.volume.close()


def test_whole_file_both_ways_on_postgres(postgres_volume, tmp_path):
    vol = unkai.open_volume(postgres_volume, cache_dir=str(tmp_path / "pycache"))
    try:
        with fuse_mount(postgres_volume, tmp_path / "mnt", tmp_path / "fusecache") as mnt:
            data = os.urandom(9 << 20) + b"tail"
            with vol.open("/from-python.bin", "wb") as f:
                for i in range(0, len(data), 300_001):
                    f.write(data[i:i + 300_001])
            got = (mnt / "from-python.bin").read_bytes()
            assert len(got) == len(data)
            assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
            data2 = os.urandom(5 << 20) + b"end"
            with open(mnt / "from-fuse.bin", "wb") as f:
                f.write(data2)
            assert vol.read_bytes("/from-fuse.bin") == data2
            assert vol.stat("/from-fuse.bin").st_size == len(data2)
            # Rewritten in place by the mount: the Python client sees the new bytes whole.
            data3 = os.urandom(3 << 20)
            with open(mnt / "from-fuse.bin", "wb") as f:
                f.write(data3)
            assert vol.read_bytes("/from-fuse.bin") == data3
    finally:
        vol.close()


def test_errors_and_identity(sqlite_volume, tmp_path):
    vol = unkai.open_volume(sqlite_volume, cache_dir=str(tmp_path / "pycache"))
    try:
        with pytest.raises(FileNotFoundError) as e:
            vol.open("/missing/file", "rb")
        assert e.value.errno == errno.ENOENT and e.value.filename == "/missing/file"
        vol.makedirs("/d/e")
        with pytest.raises(FileExistsError):
            vol.mkdir("/d")
        with pytest.raises(OSError) as e:
            vol.rmdir("/d")
        assert e.value.errno == errno.ENOTEMPTY
        with pytest.raises(IsADirectoryError):
            vol.open("/d", "wb")
        vol.write_bytes("/d/secret", b"root only")
        vol.chmod("/d/secret", 0o600)
        vol.write_bytes("/d/open", b"everyone")
        vol.chmod("/d/open", 0o644)
        vol.chmod("/d", 0o755)
        st = vol.stat("/d/secret")
        assert (st.st_uid, st.st_gid) == (os.geteuid(), os.getegid())
        if os.geteuid() != 0:
            pytest.skip("the identity half needs root (to act as another uid)")
        # As nobody, as a mount's caller would be: the volume's permissions apply. (Only
        # the volume's rules are tried: the process's own files, its cache and this local
        # bucket, are root's, as a mount daemon's are.)
        os.setegid(65534)
        os.seteuid(65534)
        try:
            with pytest.raises(PermissionError) as e:
                vol.open("/d/secret", "rb")
            assert e.value.errno == errno.EACCES
            vol.open("/d/open", "rb").close()
            assert sorted(vol.listdir("/d")) == ["e", "open", "secret"]
            with pytest.raises(PermissionError):
                vol.open("/d/open", "r+b")
            with pytest.raises(PermissionError):
                vol.open("/d/new", "wb")
            with pytest.raises(PermissionError):
                vol.remove("/d/open")
            with pytest.raises(PermissionError) as e:
                vol.chmod("/d/open", 0o666)
            assert e.value.errno == errno.EPERM
        finally:
            os.seteuid(0)
            os.setegid(0)
        vol.write_bytes("/d/new", b"root may")
        with pytest.raises(ValueError, match="META-URL"):
            unkai.open_volume("/var/lib/unkai/vol.db")
        with pytest.raises(ValueError, match="cache_dir"):
            unkai.open_volume(sqlite_volume, no_such_option=1)
    finally:
        vol.close()


def test_created_files_are_the_processes(sqlite_volume, tmp_path):
    """Files the client makes belong to the process's uid and gid, mode minus umask."""
    old = os.umask(0o027)
    try:
        vol = unkai.open_volume(sqlite_volume, cache_dir=str(tmp_path / "pycache"))
    finally:
        os.umask(old)
    try:
        vol.write_bytes("/f", b"x")
        vol.mkdir("/dir")
        assert vol.stat("/f").st_mode & 0o777 == 0o640
        assert vol.stat("/dir").st_mode & 0o777 == 0o750
    finally:
        vol.close()
