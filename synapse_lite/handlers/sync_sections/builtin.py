"""The built-in /sync sections, in the order they run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import attr

from synapse_lite.handlers.sync_sections.account_data import AccountDataSection, AccountDataStore
from synapse_lite.handlers.sync_sections.device_lists import DeviceListsSection, DeviceListsStore
from synapse_lite.handlers.sync_sections.e2e_keys import DeviceKeysStore, E2EKeysSection
from synapse_lite.handlers.sync_sections.ephemeral import EphemeralSection, ReceiptsStore
from synapse_lite.handlers.sync_sections.presence import PresenceSection, PresenceStore
from synapse_lite.handlers.sync_sections.request import SyncSection
from synapse_lite.handlers.sync_sections.rooms import RoomsSection, RoomsStore
from synapse_lite.handlers.sync_sections.to_device import ToDeviceSection, ToDeviceStore

if TYPE_CHECKING:
    from synapse_lite.handlers.client_events import ClientEventFormatter
    from synapse_lite.handlers.relations import RelationsHandler
    from synapse_lite.handlers.typing import TypingHandlerBase


class BuiltInSectionsStore(
    AccountDataStore,
    DeviceListsStore,
    DeviceKeysStore,
    ReceiptsStore,
    PresenceStore,
    RoomsStore,
    ToDeviceStore,
    Protocol,
):
    """Every store read of the built-in sections."""


@attr.s(slots=True, frozen=True, auto_attribs=True)
class BuiltInSections:
    """The sections of the spec's /sync response."""

    e2e_keys: E2EKeysSection
    #: Before rooms: typing and receipts for the joined rooms' entries.
    ephemeral: EphemeralSection
    #: Before rooms: the rooms' account data for their entries.
    account_data: AccountDataSection
    rooms: RoomsSection
    to_device: ToDeviceSection
    #: After rooms: the users who join in the response are newly seen.
    presence: PresenceSection
    device_lists: DeviceListsSection

    @classmethod
    def build(
        cls,
        store: BuiltInSectionsStore,
        typing: TypingHandlerBase,
        formatter: ClientEventFormatter,
        relations: RelationsHandler | None,
    ) -> BuiltInSections:
        return cls(
            e2e_keys=E2EKeysSection(store),
            ephemeral=EphemeralSection(store, typing),
            account_data=AccountDataSection(store),
            rooms=RoomsSection(store, formatter, relations),
            to_device=ToDeviceSection(store),
            presence=PresenceSection(store),
            device_lists=DeviceListsSection(store),
        )

    def in_order(self) -> list[SyncSection]:
        """The sections in the order they run (the order of the fields)."""
        return [getattr(self, a.name) for a in attr.fields(type(self))]
