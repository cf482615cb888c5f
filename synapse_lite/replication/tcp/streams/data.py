"""Streams stored in the database with one writer each (or any writer, for
caches): caches, receipts, account_data, to_device, presence, device_lists."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attr

from synapse_lite.replication.tcp.streams._base import StreamFromIdGen, Updates

if TYPE_CHECKING:
    from synapse_lite.storage.databases.main import GenericWorkerStore

_str = attr.validators.instance_of(str)
_opt_str = attr.validators.optional(attr.validators.instance_of(str))
_int = attr.validators.instance_of(int)
_bool = attr.validators.instance_of(bool)
_dict = attr.validators.instance_of(dict)


def _opt_str_list(instance: object, attribute: attr.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, list):
        raise TypeError(f"{attribute.name} must be a list or null")


@attr.s(slots=True, frozen=True, auto_attribs=True)
class CachesStreamRow:
    """Invalidate ``keys`` (all of it when null) of the cache ``cache_func``."""

    cache_func: str = attr.ib(validator=_str)
    keys: list[Any] | None = attr.ib(validator=_opt_str_list)
    invalidation_ts: int = attr.ib(validator=_int)


class CachesStream(StreamFromIdGen):
    """Cache invalidations; every process may write."""

    NAME = "caches"
    ROW_TYPE = CachesStreamRow

    def __init__(self, local_instance_name: str, store: GenericWorkerStore) -> None:
        super().__init__(local_instance_name, store.get_all_updated_caches, store._cache_id_gen)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ReceiptsStreamRow:
    room_id: str = attr.ib(validator=_str)
    receipt_type: str = attr.ib(validator=_str)
    user_id: str = attr.ib(validator=_str)
    event_id: str = attr.ib(validator=_str)
    thread_id: str | None = attr.ib(validator=_opt_str)
    data: dict[str, Any] = attr.ib(validator=_dict)


class ReceiptsStream(StreamFromIdGen):
    NAME = "receipts"
    ROW_TYPE = ReceiptsStreamRow

    def __init__(self, local_instance_name: str, store: GenericWorkerStore) -> None:
        super().__init__(
            local_instance_name, store.get_all_updated_receipts, store._receipts_id_gen
        )


@attr.s(slots=True, frozen=True, auto_attribs=True)
class AccountDataStreamRow:
    """Account data changed: global when ``room_id`` is null; tags are ``m.tag``."""

    user_id: str = attr.ib(validator=_str)
    room_id: str | None = attr.ib(validator=_opt_str)
    data_type: str = attr.ib(validator=_str)


class AccountDataStream(StreamFromIdGen):
    NAME = "account_data"
    ROW_TYPE = AccountDataStreamRow

    def __init__(self, local_instance_name: str, store: GenericWorkerStore) -> None:
        self._store = store
        super().__init__(local_instance_name, self._update_function, store._account_data_id_gen)

    async def _update_function(
        self, instance_name: str, from_token: int, upto_token: int, limit: int
    ) -> tuple[Updates, int, bool]:
        updates, upto, limited = await self._store.get_updated_account_data(
            from_token, upto_token, limit
        )
        return [(token, list(row)) for token, row in updates], upto, limited


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ToDeviceStreamRow:
    """Messages were queued for a local user, or for a remote server."""

    entity: str = attr.ib(validator=_str)


class ToDeviceStream(StreamFromIdGen):
    NAME = "to_device"
    ROW_TYPE = ToDeviceStreamRow

    def __init__(self, local_instance_name: str, store: GenericWorkerStore) -> None:
        super().__init__(
            local_instance_name, store.get_all_new_device_messages, store._device_inbox_id_gen
        )


@attr.s(slots=True, frozen=True, auto_attribs=True)
class PresenceStreamRow:
    user_id: str = attr.ib(validator=_str)
    state: str = attr.ib(validator=_str)
    last_active_ts: int = attr.ib(validator=_int)
    last_federation_update_ts: int = attr.ib(validator=_int)
    last_user_sync_ts: int = attr.ib(validator=_int)
    status_msg: str | None = attr.ib(validator=_opt_str)
    currently_active: bool = attr.ib(validator=_bool)


class PresenceStream(StreamFromIdGen):
    NAME = "presence"
    ROW_TYPE = PresenceStreamRow

    def __init__(self, local_instance_name: str, store: GenericWorkerStore) -> None:
        super().__init__(
            local_instance_name, store.get_all_presence_updates, store._presence_id_gen
        )


@attr.s(slots=True, frozen=True, auto_attribs=True)
class DeviceListsStreamRow:
    user_id: str = attr.ib(validator=_str)
    device_id: str = attr.ib(validator=_str)


class DeviceListsStream(StreamFromIdGen):
    NAME = "device_lists"
    ROW_TYPE = DeviceListsStreamRow

    def __init__(self, local_instance_name: str, store: GenericWorkerStore) -> None:
        super().__init__(
            local_instance_name, store.get_all_device_list_changes, store._device_list_id_gen
        )
