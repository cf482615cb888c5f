"""Third-party identifiers a local user bound at identity servers through
this server (``user_threepid_id_server``): plain rows any process writes."""

from __future__ import annotations

from synapse_lite.storage._base import SQLBaseStore


class ThreepidBindingsWorkerStore(SQLBaseStore):
    async def add_threepid_binding(
        self, user_id: str, medium: str, address: str, id_server: str
    ) -> None:
        await self.db_pool.execute(
            "add_threepid_binding",
            "INSERT INTO user_threepid_id_server (user_id, medium, address, id_server)"
            " VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
            user_id,
            medium,
            address,
            id_server,
        )

    async def remove_threepid_binding(
        self, user_id: str, medium: str, address: str, id_server: str
    ) -> None:
        await self.db_pool.execute(
            "remove_threepid_binding",
            "DELETE FROM user_threepid_id_server WHERE user_id = ? AND medium = ?"
            " AND address = ? AND id_server = ?",
            user_id,
            medium,
            address,
            id_server,
        )

    async def get_threepid_bindings(self, user_id: str) -> list[tuple[str, str, str]]:
        """``(medium, address, id_server)`` of every binding of the user."""
        rows = await self.db_pool.select(
            "get_threepid_bindings",
            "SELECT medium, address, id_server FROM user_threepid_id_server WHERE user_id = ?"
            " ORDER BY medium, address, id_server",
            user_id,
        )
        return [(r[0], r[1], r[2]) for r in rows]
