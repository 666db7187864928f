"""unkai volumes from Python, without FUSE.

The volume is opened in this process through unkai's vfs (the same caches, write-back, locks,
quotas, trash and scanning as a mount; a client session of its own), and every call acts as
the process's effective uid, gid and groups, under the volume's permissions, as through a
mount.

    import unkai
    vol = unkai.open_volume("sqlite:///var/lib/unkai/vol.db", cache_dir="/var/cache/unkai")
    with vol.open("/data/hello.txt", "wb") as f:
        f.write(b"hello")
    print(vol.listdir("/data"))
    vol.close()

fsspec finds the file system as the protocol ``unkai`` (see ``unkai.spec``).

Not for: the fsspec file system (``unkai.spec``); the native calls (``unkai._unkai``).
"""

import atexit
import io
import os
import stat as _stat
import threading
import weakref

from . import _unkai

__all__ = ["open_volume", "Volume", "File", "META_URL_ENV"]

#: The environment variable naming the volume when no META-URL is given.
META_URL_ENV = "UNKAI_META_URL"

_KIND_BITS = {
    "file": _stat.S_IFREG,
    "directory": _stat.S_IFDIR,
    "link": _stat.S_IFLNK,
    "other": 0,
}

_open_volumes = weakref.WeakSet()
_lock = threading.Lock()


def _flags(options):
    """``open_volume``'s options as the flags of ``unkai webdav``'s volume part."""
    args = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            args.append(flag)
        elif isinstance(value, (list, tuple)):
            args.extend(f"{flag}={v}" for v in value)
        else:
            args.append(f"{flag}={value}")
    return args


def open_volume(meta_url=None, **options):
    """Opens the volume ``meta_url`` (a META-URL such as ``sqlite:///var/lib/unkai/vol.db``
    or ``postgres://user@host/db``; default: ``$UNKAI_META_URL``, else the embedded default
    volume). ``options`` are the flags of ``unkai webdav --help``'s volume part with ``_``
    for ``-``: ``cache_dir``, ``cache_size``, ``writeback``, ``subdir``, ``read_only`` ...
    A bad META-URL or option raises one line naming the fix."""
    meta_url = meta_url or os.environ.get(META_URL_ENV) or None
    if meta_url is not None and "://" not in meta_url:
        raise ValueError(
            f"invalid META-URL '{meta_url}': give a URL such as "
            "sqlite:///var/lib/unkai/vol.db or postgres://user@host/db "
            "(or none, for the embedded default volume)"
        )
    args = ([meta_url] if meta_url else []) + _flags(options)
    vol = Volume(_unkai.open(args), meta_url)
    with _lock:
        _open_volumes.add(vol)
    return vol


@atexit.register
def _close_all():
    """Everything written is flushed and every session closed when Python exits."""
    with _lock:
        vols = list(_open_volumes)
    for v in vols:
        try:
            v.close()
        except OSError as e:  # pragma: no cover - reported, nothing else to do at exit
            print(f"unkai: closing {v.meta_url}: {e}", file=os.sys.stderr)


class StatResult:
    """A file's attributes, named as ``os.stat_result``'s."""

    __slots__ = (
        "kind", "st_mode", "st_uid", "st_gid", "st_nlink", "st_size",
        "st_atime_ns", "st_mtime_ns", "st_ctime_ns", "st_ino",
    )

    def __init__(self, t):
        (self.kind, mode, self.st_uid, self.st_gid, self.st_nlink, self.st_size,
         self.st_atime_ns, self.st_mtime_ns, self.st_ctime_ns, self.st_ino) = t
        self.st_mode = _KIND_BITS[self.kind] | mode

    st_atime = property(lambda s: s.st_atime_ns / 1e9)
    st_mtime = property(lambda s: s.st_mtime_ns / 1e9)
    st_ctime = property(lambda s: s.st_ctime_ns / 1e9)

    def __repr__(self):
        return (f"StatResult(kind={self.kind!r}, st_mode={oct(self.st_mode)}, "
                f"st_uid={self.st_uid}, st_gid={self.st_gid}, st_size={self.st_size})")


class Volume:
    """A volume opened in this process (``open_volume``); paths are from its root (or
    ``subdir``), ``/``-separated, absolute or not. Failures raise ``OSError`` and its
    subclasses by errno (``FileNotFoundError``, ``PermissionError``, ...)."""

    def __init__(self, native, meta_url):
        self._v = native
        self.meta_url = meta_url
        self.name = native.name

    def __repr__(self):
        return f"<unkai.Volume {self.name!r} {'open' if self._v.is_open else 'closed'}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Flushes what is written and closes the session."""
        self._v.close()

    def open(self, path, mode="rb", buffering=-1, encoding=None, errors=None, newline=None):
        """Opens ``path`` as built-in ``open`` does (text modes wrap it in a TextIOWrapper)."""
        raw = File(self._v.open(path, mode.replace("t", "")), mode)
        if "b" in mode:
            return raw
        return io.TextIOWrapper(raw, encoding=encoding or "utf-8", errors=errors,
                                newline=newline, write_through=True)

    def stat(self, path):
        return StatResult(self._v.stat(path))

    def exists(self, path):
        try:
            self._v.stat(path)
            return True
        except FileNotFoundError:
            return False

    def isdir(self, path):
        try:
            return self._v.stat(path)[0] == "directory"
        except FileNotFoundError:
            return False

    def isfile(self, path):
        try:
            return self._v.stat(path)[0] == "file"
        except FileNotFoundError:
            return False

    def listdir(self, path="/"):
        return [name for name, _ in self._v.listdir(path)]

    def scandir(self, path="/"):
        """(name, StatResult) of each entry of directory ``path``."""
        return [(name, StatResult(t)) for name, t in self._v.listdir(path)]

    def mkdir(self, path, mode=0o777):
        self._v.mkdir(path, mode)

    def makedirs(self, path, mode=0o777, exist_ok=False):
        self._v.makedirs(path, mode, exist_ok)

    def rmdir(self, path):
        self._v.rmdir(path)

    def remove(self, path):
        self._v.unlink(path)

    unlink = remove

    def rename(self, src, dst):
        self._v.rename(src, dst)

    replace = rename

    def copy(self, src, dst):
        """Copies file ``src`` to ``dst``; the copy shares the source's blocks."""
        self._v.copy(src, dst)

    def truncate(self, path, length):
        self._v.truncate(path, length)

    def chmod(self, path, mode):
        self._v.chmod(path, mode)

    def utime(self, path, ns=None):
        """Sets (atime_ns, mtime_ns), or both to now."""
        if ns is None:
            self._v.utime(path)
        else:
            self._v.utime(path, ns[0], ns[1])

    def read_bytes(self, path):
        with self.open(path, "rb") as f:
            return f.read()

    def write_bytes(self, path, data):
        with self.open(path, "wb") as f:
            f.write(data)


class File(io.RawIOBase):
    """An open file of a volume: read, write, seek, tell, flush, truncate, fsync, close.
    ``read(n)`` returns ``n`` bytes unless the file ends first; writes are gathered and
    committed at ``flush`` or ``close``, after which other clients see them."""

    def __init__(self, native, mode):
        super().__init__()
        self._f = native
        self.mode = mode
        self.name = native.path

    def readable(self):
        return self._f.readable

    def writable(self):
        return self._f.writable

    def seekable(self):
        return True

    def read(self, size=-1):
        if size is None:
            size = -1
        return self._f.read(size)

    def readall(self):
        return self._f.read(-1)

    def readinto(self, b):
        m = memoryview(b).cast("B")
        data = self._f.read(len(m))
        m[: len(data)] = data
        return len(data)

    def write(self, b):
        return self._f.write(b)

    def seek(self, offset, whence=os.SEEK_SET):
        return self._f.seek(offset, whence)

    def tell(self):
        return self._f.tell()

    def truncate(self, size=None):
        return self._f.truncate(size)

    def flush(self):
        if not self.closed:
            self._f.flush()

    def fsync(self):
        self._f.fsync()

    @property
    def size(self):
        return self._f.size()

    def close(self):
        if not self.closed:
            try:
                self._f.close()
            finally:
                super().close()

    @property
    def closed(self):
        return self._f.closed

    def __repr__(self):
        return f"<unkai.File {self.name!r} mode={self.mode!r}>"
