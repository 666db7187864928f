"""The Python client against Python through a FUSE mount of the same volume (issue 39's
targets): one 1 GiB file read sequentially in 4 MiB reads, and 10,000 files of 4 KiB each
opened, read whole and closed. Each side runs alone on the volume, as a process uses one or
the other (a mount's client and the in-process one together are two clients of the volume,
whose metadata then cannot be answered from memory): the best and the median of five passes,
the kernel's page cache dropped before each, the side's own caches kept (warm, as a process
reading a volume it already uses). Prints figures; asserts nothing.

    python -P bench.py setup  META-URL WORKDIR          # writes the files (Python client)
    python -P bench.py fuse   META-URL WORKDIR MOUNTPOINT
    python -P bench.py python META-URL WORKDIR
    python -P bench.py report META-URL WORKDIR

Not for: the tests (tests/); the volume and the mount (scripts/bench-python.sh).
"""

import json
import os
import sys
import time

import unkai

side, meta_url, work = sys.argv[1], sys.argv[2], sys.argv[3]
BIG = 1 << 30
PIECE = 4 << 20
SMALL = 10_000
ROUNDS = 5


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass


def timed(f):
    drop_caches()
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def read_big(open_):
    got = 0
    with open_("big") as f:
        while True:
            b = f.read(PIECE)
            if not b:
                break
            got += len(b)
    assert got == BIG


def read_small(open_):
    for i in range(SMALL):
        with open_(f"small/f{i:05}") as f:
            assert len(f.read()) == 4096


def run(open_):
    big = [timed(lambda: read_big(open_)) for _ in range(ROUNDS)]
    small = [timed(lambda: read_small(open_)) for _ in range(ROUNDS)]
    return {"big": big, "small": small}


def vol():
    return unkai.open_volume(meta_url, cache_dir=os.path.join(work, "pycache"))


if side == "setup":
    v = vol()
    block = os.urandom(PIECE)
    with v.open("/big", "wb") as f:
        for _ in range(BIG // PIECE):
            f.write(block)
    v.makedirs("/small", exist_ok=True)
    blob = os.urandom(4096)
    for i in range(SMALL):
        with v.open(f"/small/f{i:05}", "wb") as f:
            f.write(blob)
    v.close()
elif side == "fuse":
    mnt = sys.argv[4]
    res = run(lambda p: open(os.path.join(mnt, p), "rb", buffering=0))
    json.dump(res, open(os.path.join(work, "fuse.json"), "w"))
elif side == "python":
    v = vol()
    res = run(lambda p: v.open("/" + p, "rb"))
    v.close()
    json.dump(res, open(os.path.join(work, "python.json"), "w"))
else:
    f = json.load(open(os.path.join(work, "fuse.json")))
    p = json.load(open(os.path.join(work, "python.json")))
    med = lambda xs: sorted(xs)[len(xs) // 2]
    for how, pick in (("best", min), ("median", med)):
        fb, pb, fs, ps = pick(f["big"]), pick(p["big"]), pick(f["small"]), pick(p["small"])
        print(f"{how} of {ROUNDS}: 1 GiB sequential read: FUSE {BIG / fb / 2**20:.0f} MiB/s, "
              f"Python {BIG / pb / 2**20:.0f} MiB/s, ratio {fb / pb:.2f} (target >= 0.8); "
              f"10,000 files of 4 KiB: FUSE {SMALL / fs:.0f} files/s, Python {SMALL / ps:.0f} "
              f"files/s, ratio {fs / ps:.2f} (target >= 2)")
