"""The fsspec file system of unkai volumes, protocol ``unkai`` (entry point ``fsspec.specs``).

What follows ``unkai://`` is a path in the volume, from its root: ``unkai://data/x.parquet``
and ``unkai:///data/x.parquet`` name the same file. The volume is chosen by the storage
options: ``meta_url`` (a META-URL: ``sqlite:///var/lib/unkai/vol.db``,
``postgres://user@host/db``), else the environment variable ``UNKAI_META_URL``, else the
embedded default volume. ``auto_mkdir`` (default True) makes the missing directories of a
file opened for writing, as object stores need none; every other storage option is an option of ``unkai.open_volume``
(``cache_dir``, ``subdir``, ``read_only`` ...).

    fsspec.open("unkai://data/x.csv", meta_url="sqlite:///var/lib/unkai/vol.db")
    pandas.read_parquet("unkai://data/x.parquet",
                        storage_options={"meta_url": "postgres://unkai@db/unkai"})

One volume client per distinct set of storage options in a process (fsspec caches the
instances); it is closed, everything written flushed, when Python exits.

Not for: the volume's calls and files (``unkai``).
"""

import errno as _errno
import posixpath

from fsspec.spec import AbstractFileSystem

import unkai


class UnkaiFileSystem(AbstractFileSystem):
    """An unkai volume as an fsspec file system (paths from the volume's root)."""

    protocol = "unkai"
    root_marker = "/"

    def __init__(self, meta_url=None, auto_mkdir=True, **options):
        self.auto_mkdir = auto_mkdir
        vol_options = {
            k: v for k, v in options.items()
            if k not in ("skip_instance_cache", "use_listings_cache", "listings_expiry_time",
                         "max_paths", "asynchronous", "loop")
        }
        super().__init__(meta_url=meta_url, auto_mkdir=auto_mkdir, **options)
        self.volume = unkai.open_volume(meta_url, **vol_options)

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = str(path)
        if path.startswith("unkai://"):
            path = path[len("unkai://"):]
        path = posixpath.normpath("/" + path.lstrip("/")) if path not in ("", "/") else "/"
        return path.rstrip("/") or "/"

    def unstrip_protocol(self, name):
        return "unkai://" + name.lstrip("/")

    @staticmethod
    def _get_kwargs_from_urls(path):
        return {}

    def _info(self, path, name, st):
        return {
            "name": name,
            "size": st.st_size,
            "type": st.kind if st.kind in ("file", "directory") else "other",
            "mode": st.st_mode,
            "uid": st.st_uid,
            "gid": st.st_gid,
            "nlink": st.st_nlink,
            "ino": st.st_ino,
            "mtime": st.st_mtime,
            "created": st.st_ctime,
            "islink": st.kind == "link",
        }

    def info(self, path, **kwargs):
        path = self._strip_protocol(path)
        return self._info(path, path, self.volume.stat(path))

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        st = self.volume.stat(path)
        if st.kind != "directory":
            entries = [self._info(path, path, st)]
        else:
            entries = [
                self._info(path, posixpath.join(path, name), st)
                for name, st in sorted(self.volume.scandir(path))
            ]
        return entries if detail else [e["name"] for e in entries]

    def mkdir(self, path, create_parents=True, **kwargs):
        path = self._strip_protocol(path)
        if self.exists(path):
            raise FileExistsError(_errno.EEXIST, "File exists", path)
        if create_parents:
            self.volume.makedirs(path, exist_ok=True)
        else:
            self.volume.mkdir(path)

    def makedirs(self, path, exist_ok=False):
        self.volume.makedirs(self._strip_protocol(path), exist_ok=exist_ok)

    def rmdir(self, path):
        self.volume.rmdir(self._strip_protocol(path))

    def rm_file(self, path):
        self.volume.remove(self._strip_protocol(path))

    def _rm(self, path):
        path = self._strip_protocol(path)
        if self.volume.isdir(path):
            self.volume.rmdir(path)
        else:
            self.volume.remove(path)

    def rm(self, path, recursive=False, maxdepth=None):
        paths = self.expand_path(path, recursive=recursive, maxdepth=maxdepth)
        # Deepest first: a directory's entries go before it.
        for p in sorted(paths, key=lambda p: (p.count("/"), p), reverse=True):
            self._rm(p)
        self.invalidate_cache()

    def cp_file(self, path1, path2, **kwargs):
        path1, path2 = self._strip_protocol(path1), self._strip_protocol(path2)
        if self.volume.isdir(path1):
            self.volume.makedirs(path2, exist_ok=True)
        else:
            self._parent_for_write(path2)
            self.volume.copy(path1, path2)

    def _parent_for_write(self, path):
        """Makes the missing directories above ``path`` (if ``auto_mkdir``)."""
        parent = posixpath.dirname(path)
        if self.auto_mkdir and parent != "/" and not self.volume.isdir(parent):
            self.volume.makedirs(parent, exist_ok=True)

    def mv(self, path1, path2, recursive=False, maxdepth=None, **kwargs):
        if isinstance(path1, str) and isinstance(path2, str) and not self._glob(path1):
            # One name: one rename (into path2 if it is a directory), never a copy.
            p1, p2 = self._strip_protocol(path1), self._strip_protocol(path2)
            if self.volume.isdir(p1) and not recursive:
                pass
            else:
                if self.volume.isdir(p2):
                    p2 = posixpath.join(p2, posixpath.basename(p1))
                self.volume.rename(p1, p2)
                return
        super().mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)

    @staticmethod
    def _glob(path):
        return any(c in path for c in "*?[")

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None,
              **kwargs):
        path = self._strip_protocol(path)
        if not autocommit:
            raise NotImplementedError("unkai files are committed at close (autocommit)")
        if any(c in mode for c in "wax"):
            self._parent_for_write(path)
        return self.volume.open(path, mode)

    def touch(self, path, truncate=True, **kwargs):
        path = self._strip_protocol(path)
        if truncate or not self.exists(path):
            self._parent_for_write(path)
            with self.volume.open(path, "wb"):
                pass
        else:
            self.volume.utime(path)

    def created(self, path):
        import datetime
        return datetime.datetime.fromtimestamp(self.info(path)["created"], datetime.timezone.utc)

    def modified(self, path):
        import datetime
        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], datetime.timezone.utc)

    def chmod(self, path, mode):
        self.volume.chmod(self._strip_protocol(path), mode)
