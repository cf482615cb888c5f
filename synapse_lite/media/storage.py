"""Media files on disk, and the interface for other backends.

The local store (``media.store_path``) is where files are served from. A file
is written under ``tmp/`` first, flushed to disk, then renamed into place: a
crash (even SIGKILL) never leaves a partial file at a path that is served,
only a stray file in ``tmp/``, which the media instance clears when it starts.

A :class:`StorageProvider` is another backend an operator adds (a network
share, an object store): every file is also stored there after it is
complete, and a file missing locally is fetched from the providers, in order,
back into the local store. :class:`DirectoryStorageProvider` is the one built
in. All disk work runs on the reactor's thread pool.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from typing import IO, Any, Protocol

from twisted.internet import threads

from synapse_lite.config.media import StorageProviderConfig
from synapse_lite.media.paths import MediaFilePaths

logger = logging.getLogger(__name__)

_COPY_CHUNK = 1024 * 1024


class StorageProvider(Protocol):
    """Another place media files are kept. Paths are relative to the store
    (``local_content/ab/cd/...``). Both methods may block: they run in a thread."""

    name: str

    def store_file(self, relative_path: str, source_path: str) -> None:
        """Keep a copy of the complete file at ``source_path``."""

    def fetch_file(self, relative_path: str, destination_path: str) -> bool:
        """Write the file to ``destination_path``; False if this backend has none."""


class DirectoryStorageProvider:
    """Files kept in another directory, in the store's layout (e.g. a
    mounted network share)."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.name = f"directory {self.root}"
        self._paths = MediaFilePaths(self.root)

    def store_file(self, relative_path: str, source_path: str) -> None:
        target = self._paths.absolute(relative_path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        # The same write-then-rename as the local store: never a partial file.
        fd, partial = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".partial-")
        try:
            with open(source_path, "rb") as source, os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(source, out, _COPY_CHUNK)
                out.flush()
                os.fsync(out.fileno())
            os.replace(partial, target)
        except BaseException:
            _remove(partial)
            raise

    def fetch_file(self, relative_path: str, destination_path: str) -> bool:
        source = self._paths.absolute(relative_path)
        if not os.path.exists(source):
            return False
        with open(source, "rb") as f, open(destination_path, "wb") as out:
            shutil.copyfileobj(f, out, _COPY_CHUNK)
        return True


def make_storage_provider(config: StorageProviderConfig) -> StorageProvider:
    if config.kind == "directory":
        return DirectoryStorageProvider(config.path)
    raise ValueError(f"unknown storage provider type {config.kind!r}")


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _fsync_and_rename(temporary_path: str, target: str) -> None:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    fd = os.open(temporary_path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary_path, target)


def _copy_into(source: IO[bytes], destination: IO[bytes]) -> None:
    source.seek(0)
    shutil.copyfileobj(source, destination, _COPY_CHUNK)
    destination.flush()


class MediaStorage:
    """The local store and the providers behind it."""

    def __init__(self, paths: MediaFilePaths, providers: list[StorageProvider], reactor: Any):
        self.paths = paths
        self._providers = providers
        self._reactor = reactor

    def _in_thread(self, f: Any, *args: Any) -> Any:
        return threads.deferToThreadPool(self._reactor, self._reactor.getThreadPool(), f, *args)

    def prepare(self) -> None:
        """At the media instance's start: make the directories and remove the
        partial uploads a crash left in ``tmp/`` (none of them was served)."""
        os.makedirs(self.paths.temporary_dir, exist_ok=True)
        stray = os.listdir(self.paths.temporary_dir)
        for name in stray:
            _remove(os.path.join(self.paths.temporary_dir, name))
        if stray:
            logger.info(
                "Removed %d partial upload(s) left in %s", len(stray), self.paths.temporary_dir
            )

    def temporary_file(self) -> IO[bytes]:
        """A new named file in ``tmp/`` for a body being received; the caller
        removes it (:meth:`discard`) unless :meth:`commit` moved it."""
        os.makedirs(self.paths.temporary_dir, exist_ok=True)
        return tempfile.NamedTemporaryFile(  # lives as long as the request
            dir=self.paths.temporary_dir, prefix="upload-", delete=False
        )

    @staticmethod
    def discard(f: IO[bytes]) -> None:
        """Close a temporary file and remove it if it is still in ``tmp/``."""
        f.close()
        name = getattr(f, "name", None)
        if isinstance(name, str):
            _remove(name)

    async def commit(self, body: IO[bytes], relative_path: str) -> int:
        """Make ``body`` (a received request body) the file at
        ``relative_path``: flushed to disk and renamed into place (a body not
        received into ``tmp/`` is copied there first). Then stored with every
        provider. Returns its length in bytes."""
        body.flush()
        length = body.seek(0, os.SEEK_END)
        name = getattr(body, "name", None)
        in_tmp = isinstance(name, str) and os.path.dirname(name) == self.paths.temporary_dir
        if not in_tmp:
            copy = self.temporary_file()
            try:
                await self._in_thread(_copy_into, body, copy)
            except BaseException:
                self.discard(copy)
                raise
            body = copy
        temporary_path = body.name
        body.close()
        target = self.paths.absolute(relative_path)
        try:
            await self._in_thread(_fsync_and_rename, temporary_path, target)
        except BaseException:
            _remove(temporary_path)
            raise
        await self._store_with_providers(relative_path, target)
        return length

    async def write_file(self, relative_path: str, data: bytes) -> None:
        """Write a small file (a thumbnail) the same way: complete or absent."""

        def write() -> None:
            fd, partial = tempfile.mkstemp(dir=self.paths.temporary_dir, prefix="thumb-")
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                _fsync_and_rename(partial, self.paths.absolute(relative_path))
            except BaseException:
                _remove(partial)
                raise

        await self._in_thread(write)
        await self._store_with_providers(relative_path, self.paths.absolute(relative_path))

    async def _store_with_providers(self, relative_path: str, path: str) -> None:
        for provider in self._providers:
            try:
                await self._in_thread(provider.store_file, relative_path, path)
            except Exception as e:
                # The local copy is complete and served; the provider's copy
                # is a backup. Say so and go on.
                logger.warning("Storing %s with %s failed: %s", relative_path, provider.name, e)

    async def delete_local(self, relative_path: str) -> None:
        """Remove the local file (the storage providers keep their copies:
        they are backups, and nothing names the file any more)."""
        await self._in_thread(_remove, self.paths.absolute(relative_path))

    async def local_path(self, relative_path: str) -> str | None:
        """The local file at ``relative_path``, fetched from a provider if
        it is not here; None if no backend has it."""
        path = self.paths.absolute(relative_path)
        if os.path.exists(path):
            return path
        for provider in self._providers:
            fd, partial = tempfile.mkstemp(dir=self.paths.temporary_dir, prefix="fetch-")
            os.close(fd)
            try:
                found = await self._in_thread(provider.fetch_file, relative_path, partial)
                if found:
                    await self._in_thread(_fsync_and_rename, partial, path)
                    logger.info("Fetched %s from %s", relative_path, provider.name)
                    return path
            except Exception as e:
                logger.warning("Fetching %s from %s failed: %s", relative_path, provider.name, e)
            finally:
                _remove(partial)
        return None
