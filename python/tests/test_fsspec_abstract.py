"""fsspec's own abstract test suite (copy, get, put, open, pipe, mv) against the unkai file
system, on a fresh SQLite volume, as fsspec's own tests subclass AbstractFixtures for its
local and memory file systems.
"""

import posixpath

import fsspec
import fsspec.tests.abstract as abstract
import pytest
from fsspec.tests.abstract import AbstractFixtures

from conftest import format_volume


class UnkaiFixtures(AbstractFixtures):
    @pytest.fixture(scope="class")
    @classmethod
    def fs(cls, tmp_path_factory):
        d = tmp_path_factory.mktemp("fsspec-vol")
        url = format_volume(f"sqlite://{d}/meta.db", d / "bucket")
        # The entry point, as users reach it.
        fs = fsspec.get_filesystem_class("unkai")(meta_url=url, cache_dir=str(d / "cache"), skip_instance_cache=True)
        yield fs
        fs.volume.close()

    @pytest.fixture
    def fs_path(self):
        return "/t"

    @pytest.fixture
    def fs_join(self):
        return posixpath.join


class TestUnkaiCopy(abstract.AbstractCopyTests, UnkaiFixtures):
    pass


class TestUnkaiGet(abstract.AbstractGetTests, UnkaiFixtures):
    pass


class TestUnkaiPut(abstract.AbstractPutTests, UnkaiFixtures):
    pass


class TestUnkaiOpen(abstract.AbstractOpenTests, UnkaiFixtures):
    pass


class TestUnkaiPipe(abstract.AbstractPipeTests, UnkaiFixtures):
    pass
