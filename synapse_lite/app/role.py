"""What the config makes of one process: its :class:`Role`.

Kept apart from ``roles.py`` (which picks each role's classes, and imports
them) so that the launcher can ask what each process does, and which
streams it subscribes to, without importing every handler.
"""

from __future__ import annotations

import attr

from synapse_lite.config.homeserver import MAIN_PROCESS, HomeServerConfig
from synapse_lite.streams.definition import Reader, StreamCatalog


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Role:
    """What the config makes of one process: decided once, here, from the
    config's writers directory and settings; the stages read it and never
    ask the config again who does what."""

    name: str
    is_main: bool
    writes_events: bool
    writes_device_lists: bool
    writes_receipts: bool
    #: The typing writer (it keeps the typing stream in memory).
    writes_typing: bool
    #: The presence writer (it decides online and offline).
    writes_presence: bool
    #: The federation sender (``federation_sender``).
    sends_federation: bool
    #: It serves the federation or key APIs (a listener with those resources).
    serves_federation: bool
    #: It delivers notifications to push gateways (``pusher_instances``).
    delivers_pushes: bool
    #: The media instance (``media_instance``).
    serves_media: bool
    #: It sends to application services (``appservice_instances``).
    sends_to_app_services: bool = False

    #: It writes a stream other than caches (which every process writes).
    writes_a_stream: bool = False

    @property
    def readers(self) -> frozenset[Reader] | None:
        """The parts it plays that read streams (None: the main process,
        which reads every stream). Pure: from the role alone."""
        if self.is_main:
            return None
        parts = set()
        media_only = self.serves_media and not (
            self.writes_a_stream
            or self.sends_federation
            or self.serves_federation
            or self.delivers_pushes
            or self.sends_to_app_services
        )
        parts.add(Reader.MEDIA if media_only else Reader.CLIENT)
        if self.sends_federation:
            parts.add(Reader.FEDERATION_SENDER)
        if self.delivers_pushes:
            parts.add(Reader.PUSHER)
        return frozenset(parts)

    def subscription(self, catalog: StreamCatalog) -> tuple[str, ...] | None:
        """The streams it receives over replication, in catalog order (None:
        every stream). A role changed by ``synapse-lite reload`` restarts the
        process (its ``ProcessSpec`` changes), which subscribes anew."""
        readers = self.readers
        return None if readers is None else tuple(catalog.read_by(readers))

    @classmethod
    def of(cls, config: HomeServerConfig, name: str) -> Role:
        writers = config.writers
        return cls(
            name=name,
            is_main=name == MAIN_PROCESS,
            writes_events=writers.writes(name, "events"),
            writes_device_lists=writers.writes(name, "device_lists"),
            writes_receipts=writers.writes(name, "receipts"),
            writes_typing=writers.single("typing") == name,
            writes_presence=writers.single("presence") == name,
            sends_federation=config.federation_sender == name,
            serves_federation=any(
                {"federation", "keys"} & set(listener.resources)
                for listener in config.listeners_of(name)
            ),
            delivers_pushes=name in config.pusher_instances,
            serves_media=config.media_instance == name,
            sends_to_app_services=name in config.appservice_instances,
            writes_a_stream=writers.streams_written_by(name) != ["caches"],
        )

    @property
    def takes_part_in_federation(self) -> bool:
        """Whether it needs the signing key and a federation client."""
        return self.is_main or self.sends_federation or self.serves_federation
