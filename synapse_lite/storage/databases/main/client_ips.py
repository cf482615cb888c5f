"""Where users connect from: written by the main process from USER_IP commands."""

from __future__ import annotations

from synapse_lite.storage._base import SQLBaseStore


class ClientIpStore(SQLBaseStore):
    """Records (user, device, ip, user agent) with the last time seen. Main
    process only: other processes send USER_IP instead of writing."""

    async def insert_client_ip(
        self, user_id: str, device_id: str, ip: str, user_agent: str, last_seen: int
    ) -> None:
        await self.db_pool.execute(
            "insert_client_ip",
            "INSERT INTO user_ips (user_id, device_id, ip, user_agent, last_seen)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (user_id, device_id, ip, user_agent)"
            " DO UPDATE SET last_seen = EXCLUDED.last_seen",
            user_id,
            device_id,
            ip,
            user_agent,
            last_seen,
        )
