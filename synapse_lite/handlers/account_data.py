"""Account data (global and per room), written by the account_data writer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import NotFoundError
from synapse_lite.handlers.writer_routing import write_on_stream_writer

if TYPE_CHECKING:
    from synapse_lite.server import HomeServer

ADD_ACCOUNT_DATA_ENDPOINT = "add_account_data"


class AccountDataHandler:
    """``GET/PUT /user/{userId}[/rooms/{roomId}]/account_data/{type}``."""

    def __init__(self, hs: HomeServer) -> None:
        self._hs = hs
        self._store = hs.datastore

    async def set_account_data(
        self, user_id: str, room_id: str | None, data_type: str, content: dict[str, Any]
    ) -> None:
        body = {"user_id": user_id, "room_id": room_id, "type": data_type, "content": content}
        await write_on_stream_writer(
            self._hs,
            "account_data",
            lambda: self.write_account_data(user_id, room_id, data_type, content),
            ADD_ACCOUNT_DATA_ENDPOINT,
            body,
        )

    async def write_account_data(
        self, user_id: str, room_id: str | None, data_type: str, content: dict[str, Any]
    ) -> int:
        """On the account_data writer: store it and wake the user's syncs."""
        if room_id is None:
            stream_id = await self._store.add_account_data_for_user(user_id, data_type, content)
        else:
            stream_id = await self._store.add_account_data_to_room(
                user_id, room_id, data_type, content
            )
        self._hs.notifier.notify(users=[user_id])
        return stream_id

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
