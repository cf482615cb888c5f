"""Account data (global and per room), written by the account_data writer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from synapse_lite.api.errors import NotFoundError
from synapse_lite.replication.http.writes import (
    ADD_ACCOUNT_DATA,
    SET_ROOM_TAG,
    AccountDataWrite,
    StreamWritten,
    TagWrite,
)

if TYPE_CHECKING:
    from synapse_lite.notifier import Notifier
    from synapse_lite.replication.http.calls import InternalCalls


class AccountDataHandlerStore(Protocol):
    """The store reads of :class:`AccountDataHandler`."""

    async def add_account_data_for_user(
        self, user_id: str, data_type: str, content: dict[str, Any]
    ) -> int: ...

    async def add_account_data_to_room(
        self, user_id: str, room_id: str, data_type: str, content: dict[str, Any]
    ) -> int: ...

    async def get_global_account_data(self, user_id: str) -> dict[str, dict[str, Any]]: ...

    async def get_room_account_data(self, user_id: str) -> dict[str, dict[str, dict[str, Any]]]: ...

    async def get_tags_for_room(self, user_id: str, room_id: str) -> dict[str, dict[str, Any]]: ...

    async def set_room_tag(
        self, user_id: str, room_id: str, tag: str, content: dict[str, Any] | None
    ) -> int: ...


class AccountDataHandler:
    """``GET/PUT /user/{userId}[/rooms/{roomId}]/account_data/{type}`` and the
    room tags (``m.tag``) of ``/user/{userId}/rooms/{roomId}/tags``."""

    def __init__(
        self, store: AccountDataHandlerStore, notifier: Notifier, calls: InternalCalls
    ) -> None:
        self._store = store
        self._notifier = notifier
        self._calls = calls

    async def set_account_data(
        self, user_id: str, room_id: str | None, data_type: str, content: dict[str, Any]
    ) -> None:
        await self._calls.call(
            ADD_ACCOUNT_DATA, AccountDataWrite(user_id, room_id, data_type, content)
        )

    async def write_account_data(self, write: AccountDataWrite) -> StreamWritten:
        """Serves :data:`ADD_ACCOUNT_DATA`: store it and wake the user's syncs."""
        if write.room_id is None:
            stream_id = await self._store.add_account_data_for_user(
                write.user_id, write.data_type, write.content
            )
        else:
            stream_id = await self._store.add_account_data_to_room(
                write.user_id, write.room_id, write.data_type, write.content
            )
        self._notifier.notify(users=[write.user_id])
        return StreamWritten(stream_id)

    async def get_account_data(
        self, user_id: str, room_id: str | None, data_type: str
    ) -> dict[str, Any]:
        if room_id is None:
            found = (await self._store.get_global_account_data(user_id)).get(data_type)
        else:
            rooms = await self._store.get_room_account_data(user_id)
            found = rooms.get(room_id, {}).get(data_type)
        if found is None:
            raise NotFoundError("Account data not found")
        return found

    async def set_tag(
        self, user_id: str, room_id: str, tag: str, content: dict[str, Any] | None
    ) -> None:
        """Add (``content``) or remove (None) a room tag, on the account_data writer."""
        await self._calls.call(SET_ROOM_TAG, TagWrite(user_id, room_id, tag, content))

    async def write_tag(self, write: TagWrite) -> StreamWritten:
        """Serves :data:`SET_ROOM_TAG`: store it and wake the user's syncs."""
        stream_id = await self._store.set_room_tag(
            write.user_id, write.room_id, write.tag, write.content
        )
        self._notifier.notify(users=[write.user_id])
        return StreamWritten(stream_id)

    async def get_tags(self, user_id: str, room_id: str) -> dict[str, dict[str, Any]]:
        return await self._store.get_tags_for_room(user_id, room_id)
