"""The admin API's media quarantine and protection: quarantined media is
answered as unknown by every download and thumbnail until released."""

from __future__ import annotations

from tests.harness.client_api import (
    DEFAULT_LAYOUT_STREAM_WRITERS,
    DEFAULT_LAYOUT_WORKERS,
    ClientApi,
    ThreeUsersTestCase,
    q,
)
from tests.harness.polling import eventually

ADMIN = "/_synapse/admin/v1"
DOWNLOAD = "/_matrix/client/v1/media/download/test.local/"


async def upload(client: ClientApi, data: bytes) -> str:
    """The media id of ``data`` uploaded by ``client``'s user."""
    code, body = await client.request(
        "POST",
        "/_matrix/media/v3/upload?filename=f.txt",
        raw=data,
        headers={"Content-Type": ["text/plain"]},
    )
    assert code == 200, body
    return str(body["content_uri"]).rsplit("/", 1)[1]


class AdminMediaTestCase(ThreeUsersTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        await super().setUp()
        await self.servers["main"].store.db_pool.execute(
            "t", "UPDATE users SET admin = TRUE WHERE name = ?", self.alice.user_id
        )
        self.room = await self.bob.create_room(preset="public_chat")
        # Media is served by main (alice's process) in both layouts.
        bob_media = self.alice.as_user(self.bob.token)
        self.eve_media = self.alice.as_user(self.eve.token)
        self.pictures = [await upload(bob_media, f"picture {i}".encode()) for i in range(3)]
        # Two of bob's uploads are named in the room; eve's is not.
        for media_id in self.pictures[:2]:
            await self.bob.ok(
                "PUT",
                f"/rooms/{self.room}/send/m.room.message/{media_id}",
                {"msgtype": "m.file", "body": "f", "url": f"mxc://test.local/{media_id}"},
            )
        self.evesfile = await upload(self.eve_media, b"eve's")

    async def served(self, media_id: str) -> bool:
        code, _ = await self.eve_media.request("GET", DOWNLOAD + media_id)
        return code == 200

    async def until_served(self, media_id: str, served: bool) -> None:
        """The media instance learns a change through the caches stream."""

        async def check() -> bool:
            return await self.served(media_id) is served

        await eventually(check, what=f"{media_id} served={served}")

    async def test_quarantine_one_and_release(self) -> None:
        media_id = self.pictures[2]
        self.assertTrue(await self.served(media_id))
        await self.alice.ok("POST", ADMIN + f"/media/quarantine/test.local/{media_id}", {})
        await self.until_served(media_id, False)
        listed = await self.alice.ok("GET", ADMIN + f"/users/{q(self.bob.user_id)}/media")
        by_id = {m["media_id"]: m for m in listed["media"]}
        self.assertEqual(by_id[media_id]["quarantined_by"], self.alice.user_id)
        await self.alice.ok("POST", ADMIN + f"/media/unquarantine/test.local/{media_id}", {})
        await self.until_served(media_id, True)
        # Another server's media: accepted, nothing to do.
        await self.alice.ok("POST", ADMIN + "/media/quarantine/elsewhere/abc", {})

    async def test_room_and_user(self) -> None:
        found = await self.alice.ok("GET", ADMIN + f"/room/{q(self.room)}/media")
        self.assertEqual(
            found,
            {
                "local": sorted(f"mxc://test.local/{m}" for m in self.pictures[:2]),
                "remote": [],
                "total": 2,
            },
        )
        # A protected media survives the quarantine of its room and user.
        await self.alice.ok("POST", ADMIN + f"/media/protect/{self.pictures[0]}", {})
        room = await self.alice.ok("POST", ADMIN + f"/room/{q(self.room)}/media/quarantine", {})
        self.assertEqual(room, {"num_quarantined": 1})
        await self.until_served(self.pictures[1], False)
        self.assertTrue(await self.served(self.pictures[0]))
        user = await self.alice.ok(
            "POST", ADMIN + f"/user/{q(self.bob.user_id)}/media/quarantine", {}
        )
        # The room's was quarantined already: only the third one now.
        self.assertEqual(user, {"num_quarantined": 1})
        await self.until_served(self.pictures[2], False)
        self.assertTrue(await self.served(self.pictures[0]))
        self.assertTrue(await self.served(self.evesfile))
        listed = await self.alice.ok("GET", ADMIN + f"/users/{q(self.bob.user_id)}/media")
        self.assertEqual(
            sorted((m["media_id"], m["safe_from_quarantine"]) for m in listed["media"]),
            sorted(
                [(self.pictures[0], True), (self.pictures[1], False), (self.pictures[2], False)]
            ),
        )
        await self.alice.ok("POST", ADMIN + f"/media/unprotect/{self.pictures[0]}", {})
        user = await self.alice.ok(
            "POST", ADMIN + f"/user/{q(self.bob.user_id)}/media/quarantine", {}
        )
        self.assertEqual(user, {"num_quarantined": 1})

    async def test_errors(self) -> None:
        for method, path, code, errcode in [
            ("POST", "/media/quarantine/test.local/nope", 404, "M_NOT_FOUND"),
            ("POST", "/media/protect/nope", 404, "M_NOT_FOUND"),
            ("GET", "/room/!nope:test.local/media", 404, "M_NOT_FOUND"),
            ("POST", "/room/not-a-room/media/quarantine", 400, "M_INVALID_PARAM"),
            ("POST", "/user/@nobody:test.local/media/quarantine", 404, "M_NOT_FOUND"),
            ("POST", "/user/@x:elsewhere/media/quarantine", 400, "M_INVALID_PARAM"),
            ("POST", "/purge_media_cache", 400, "M_MISSING_PARAM"),
            ("POST", "/purge_media_cache?before_ts=yesterday", 400, "M_INVALID_PARAM"),
        ]:
            got, answer = await self.alice.request(method, ADMIN + path, {})
            self.assertEqual((got, answer["errcode"]), (code, errcode), path)
        for method, path in [
            ("POST", f"/media/quarantine/test.local/{self.pictures[0]}"),
            ("POST", f"/media/unprotect/{self.pictures[0]}"),
            ("GET", f"/room/{q(self.room)}/media"),
            ("POST", f"/room/{q(self.room)}/media/quarantine"),
            ("POST", f"/user/{q(self.bob.user_id)}/media/quarantine"),
            ("POST", "/purge_media_cache?before_ts=1"),
        ]:
            got, answer = await self.eve.request(method, ADMIN + path, {})
            self.assertEqual((got, answer["errcode"]), (403, "M_FORBIDDEN"), path)
        self.assertTrue(await self.served(self.pictures[0]))
        # No remote media is ever cached: nothing to purge, local media stays.
        purged = await self.alice.ok("POST", ADMIN + "/purge_media_cache?before_ts=" + "9" * 15, {})
        self.assertEqual(purged, {"deleted": 0})
        self.assertTrue(await self.served(self.pictures[0]))

    async def test_delete(self) -> None:
        one = await self.alice.ok("DELETE", ADMIN + f"/media/test.local/{self.pictures[2]}")
        self.assertEqual(one, {"deleted_media": [self.pictures[2]], "total": 1})
        self.assertFalse(await self.served(self.pictures[2]))
        code, answer = await self.alice.request(
            "DELETE", ADMIN + f"/media/test.local/{self.pictures[2]}"
        )
        self.assertEqual((code, answer["errcode"]), (404, "M_NOT_FOUND"))
        # bob's avatar is kept by keep_profiles (the default); a protected
        # one too; eve's file is smaller than size_gt.
        await self.bob.ok(
            "PUT",
            f"/profile/{q(self.bob.user_id)}/avatar_url",
            {"avatar_url": f"mxc://test.local/{self.pictures[0]}"},
        )
        await self.alice.ok("POST", ADMIN + f"/media/protect/{self.pictures[1]}", {})
        future = 2**50
        kept = await self.alice.ok("POST", ADMIN + f"/media/delete?before_ts={future}&size_gt=6")
        self.assertEqual(kept, {"deleted_media": [], "total": 0})
        await self.alice.ok("POST", ADMIN + f"/media/unprotect/{self.pictures[1]}", {})
        old = await self.alice.ok("POST", ADMIN + f"/media/delete?before_ts={future}&size_gt=6")
        self.assertEqual(old, {"deleted_media": [self.pictures[1]], "total": 1})
        self.assertTrue(await self.served(self.pictures[0]))
        self.assertTrue(await self.served(self.evesfile))
        # A user's media, as the listing pages it.
        mine = await self.alice.ok("DELETE", ADMIN + f"/users/{q(self.eve.user_id)}/media")
        self.assertEqual(mine, {"deleted_media": [self.evesfile], "total": 1})
        self.assertFalse(await self.served(self.evesfile))
        for method, path, code, errcode in [
            ("DELETE", "/media/elsewhere/abc", 400, "M_INVALID_PARAM"),
            ("POST", "/media/delete", 400, "M_MISSING_PARAM"),
            ("POST", "/media/delete?before_ts=x", 400, None),
            ("POST", "/media/elsewhere/delete?before_ts=1", 400, "M_INVALID_PARAM"),
            ("DELETE", "/users/@nobody:test.local/media", 404, "M_NOT_FOUND"),
        ]:
            got, answer = await self.alice.request(method, ADMIN + path)
            self.assertEqual(got, code, path)
            if errcode is not None:
                self.assertEqual(answer["errcode"], errcode, path)
        for method, path in [
            ("DELETE", f"/media/test.local/{self.pictures[0]}"),
            ("POST", "/media/delete?before_ts=1"),
            ("DELETE", f"/users/{q(self.bob.user_id)}/media"),
        ]:
            got, answer = await self.eve.request(method, ADMIN + path)
            self.assertEqual((got, answer["errcode"]), (403, "M_FORBIDDEN"), path)
        self.assertTrue(await self.served(self.pictures[0]))


class AdminMediaDefaultLayoutTestCase(AdminMediaTestCase):
    workers = DEFAULT_LAYOUT_WORKERS
    stream_writers = DEFAULT_LAYOUT_STREAM_WRITERS
