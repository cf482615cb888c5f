"""Who writes each stream, answered in one place; and how a request or an
internal call declares which process serves it.

A :class:`WritersDirectory` is built once from the config's
``stream_writers`` and the stream catalog (``HomeServerConfig.writers``).
Every layer asks it, by stream name: the config checks, the ID generators,
the composition root (which role a process has), the internal calls
(``served_by``), the routing table (``rest/client/served_by.py``), the
replication claims and the Spark audit. A stream's writers are

* fixed: the instances ``stream_writers`` names for its entry (the main
  process when it names none), or the main process for a stream without an
  entry, or any process (``caches``);
* or, for a stream with several writers, one per key by the stream's
  :class:`~synapse_lite.streams.definition.StableHash` rule (per room for
  events, per user for device lists; per destination and per service are
  declared for the federation senders and application services to come).

The events writers also change while processes run (a writer added, or
retired, through the ``instances`` table): the catalog entry says so
(``WriterRule.follows_instances``) and the running process's view is the
instance directory's (``replication/instance_directory.py``); what this
directory answers for them is the configured set, which a process starts
from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attr

from synapse_lite.streams.definition import StreamCatalog, WriterRule

#: Roles a request or an internal call can be served by.
MAIN_ROLE = "main"
READERS_ROLE = "readers"
ROOM_EVENTS_WRITER_ROLE = "room_events_writer"
STREAM_WRITER_ROLE = "stream_writer"
MEDIA_ROLE = "media"
FEDERATION_READERS_ROLE = "federation_readers"


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ServedBy:
    """Who serves a client servlet or an internal call.

    * ``main``: the main process;
    * ``readers``: the workers that write no stream (the main process when
      there are none), each user always on the same one (a hash of the user
      id), so one user's long-polls and caches stay together;
    * ``room_events_writer``: the events writer of the room in the path;
    * ``stream_writer``: the writer of ``stream`` (a stream of the catalog);
    * ``media``: the media instance (``media_instance``; main by default);
    * ``federation_readers``: the workers serving the federation API (a
      listener with ``federation``; the main process when there are none),
      each origin server always on the same one.
    """

    role: str
    stream: str | None = None

    @property
    def name(self) -> str:
        """The role as one word (``stream_writer:typing``)."""
        return self.role if self.stream is None else f"{self.role}:{self.stream}"


MAIN = ServedBy(MAIN_ROLE)


def writer_of(stream: str) -> ServedBy:
    """Served by the writer of ``stream`` (a stream name of the catalog)."""
    return ServedBy(STREAM_WRITER_ROLE, stream)


class WritersDirectory:
    """Who writes each stream of a deployment (see the module docstring)."""

    def __init__(
        self, catalog: StreamCatalog, configured: Mapping[str, Sequence[str]], main: str
    ) -> None:
        """``configured``: ``stream_writers`` key -> the instances it names
        (a key left out is the main process, ``main``)."""
        self._catalog = catalog
        self._main = main
        self._writers: dict[str, tuple[str, ...]] = {}
        for definition in catalog:
            rule = definition.writers
            if rule.any_process:
                writers: tuple[str, ...] = ()
            elif rule.config_key is None:
                writers = (main,)
            else:
                writers = tuple(configured.get(rule.config_key, (main,)))
            self._writers[definition.name] = writers

    def rule(self, stream: str) -> WriterRule:
        return self._catalog[stream].writers

    def writers(self, stream: str) -> tuple[str, ...]:
        """The configured writers of ``stream``; empty when every process may
        write it. ``KeyError`` for a stream not in the catalog."""
        return self._writers[stream]

    def single(self, stream: str) -> str:
        """The writer of a stream with one (``ValueError`` otherwise)."""
        writers = self._writers[stream]
        if len(writers) != 1:
            raise ValueError(f"stream {stream!r} has {len(writers) or 'any'} writers, not one")
        return writers[0]

    def writer_for(self, stream: str, key: str, among: Sequence[str] | None = None) -> str:
        """The writer of ``key``'s writes to ``stream``: by the stream's
        shard rule over its writers (``among``: the writers known now, for a
        stream whose writers follow the ``instances`` table; the configured
        ones otherwise); the one writer of a stream with one."""
        shard = self.rule(stream).shard
        writers = self._writers[stream] if among is None else among
        if shard is None:
            return self.single(stream)
        return shard.pick(key, writers)

    def writes(self, instance: str, stream: str) -> bool:
        """Whether ``instance`` is (one of) ``stream``'s configured writers."""
        writers = self._writers[stream]
        return not writers or instance in writers

    def streams_written_by(self, instance: str) -> list[str]:
        """The streams ``instance`` writes (and so announces over replication),
        in catalog order."""
        return [name for name in self._writers if self.writes(instance, name)]

    def server_of(self, served_by: ServedBy) -> str:
        """The one process serving a declaration of the main process or of a
        single-writer stream's writer."""
        if served_by.role == MAIN_ROLE:
            return self._main
        if served_by.role == STREAM_WRITER_ROLE and served_by.stream is not None:
            return self.single(served_by.stream)
        raise ValueError(f"{served_by.name} does not name one process")
