"""Pushers over the client API: set, list, replace, remove, ``append``, bad
input, and the pushers stream written by a worker."""

from __future__ import annotations

from typing import Any

from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase
from tests.harness.spec import assert_spec_response

URL = "https://push.example/_matrix/push/v1/notify"


def pusher(pushkey: str = "key1", **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "http",
        "app_id": "org.example.app.android",
        "pushkey": pushkey,
        "app_display_name": "Example",
        "device_display_name": "Phone",
        "lang": "en",
        "data": {"url": URL, "format": "event_id_only", "custom": 1},
    }
    body.update(changes)
    return body


class PushersApiTestCase(DatabaseTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        _, clients, _ = start_cluster(self, self.test_db)
        self.alice = await ClientApi(self, clients["main"].base_url).register("alice")
        self.bob = await ClientApi(self, clients["main"].base_url).register("bob")

    async def test_set_list_replace_and_remove(self) -> None:
        self.assertEqual(await self.alice.ok("GET", "/pushers"), {"pushers": []})
        await self.alice.ok("POST", "/pushers/set", pusher(profile_tag="tag"))
        listed = await self.alice.ok("GET", "/pushers")
        assert_spec_response(self, "pusher.yaml", "/pushers", "GET", 200, listed)
        [only] = listed["pushers"]
        self.assertEqual((only["pushkey"], only["profile_tag"]), ("key1", "tag"))
        self.assertEqual(only["data"], {"url": URL, "format": "event_id_only", "custom": 1})
        # The same (app_id, pushkey) replaces; another pushkey adds.
        await self.alice.ok("POST", "/pushers/set", pusher(lang="fr"))
        await self.alice.ok("POST", "/pushers/set", pusher("key2"))
        listed = (await self.alice.ok("GET", "/pushers"))["pushers"]
        self.assertEqual(
            [(p["pushkey"], p["lang"]) for p in listed], [("key1", "fr"), ("key2", "en")]
        )
        await self.alice.ok(
            "POST",
            "/pushers/set",
            {"kind": None, "app_id": "org.example.app.android", "pushkey": "key1"},
        )
        listed = (await self.alice.ok("GET", "/pushers"))["pushers"]
        self.assertEqual([p["pushkey"] for p in listed], ["key2"])
        self.assertEqual(await self.bob.ok("GET", "/pushers"), {"pushers": []})

    async def test_append(self) -> None:
        await self.alice.ok("POST", "/pushers/set", pusher("shared"))
        # Without append, bob taking the same pushkey removes alice's.
        await self.bob.ok("POST", "/pushers/set", pusher("shared"))
        self.assertEqual(await self.alice.ok("GET", "/pushers"), {"pushers": []})
        await self.alice.ok("POST", "/pushers/set", pusher("shared", append=True))
        self.assertEqual(len((await self.alice.ok("GET", "/pushers"))["pushers"]), 1)
        self.assertEqual(len((await self.bob.ok("GET", "/pushers"))["pushers"]), 1)

    async def test_bad_input_is_refused_and_nothing_is_stored(self) -> None:
        cases: list[tuple[dict[str, Any], str]] = [
            ({k: v for k, v in pusher().items() if k != "kind"}, "M_MISSING_PARAM"),
            ({k: v for k, v in pusher().items() if k != "pushkey"}, "M_MISSING_PARAM"),
            ({k: v for k, v in pusher().items() if k != "lang"}, "M_MISSING_PARAM"),
            ({k: v for k, v in pusher().items() if k != "data"}, "M_MISSING_PARAM"),
            (pusher(kind="email"), "M_INVALID_PARAM"),
            (pusher(kind=7), "M_INVALID_PARAM"),
            (pusher(app_id="a" * 65), "M_INVALID_PARAM"),
            (pusher(pushkey="é" * 300), "M_INVALID_PARAM"),
            (pusher(data={"url": "ftp://push.example/_matrix/push/v1/notify"}), "M_INVALID_PARAM"),
            (pusher(data={"url": "https://push.example/notify"}), "M_INVALID_PARAM"),
            (
                pusher(data={"url": "https://push.example/_matrix/push/v1/notify?" + "x" * 3000}),
                "M_INVALID_PARAM",
            ),
            (pusher(data={"url": "not a url"}), "M_INVALID_PARAM"),
            (pusher(data={}), "M_INVALID_PARAM"),
            (pusher(data={"url": URL, "format": "full"}), "M_INVALID_PARAM"),
            (pusher(data="x"), "M_INVALID_PARAM"),
            (pusher(append="yes"), "M_INVALID_PARAM"),
            (pusher(profile_tag=5), "M_INVALID_PARAM"),
        ]
        for body, errcode in cases:
            code, answer = await self.alice.request("POST", "/pushers/set", body)
            self.assertEqual((code, answer["errcode"]), (400, errcode), body)
        self.assertEqual(await self.alice.ok("GET", "/pushers"), {"pushers": []})
        code, _ = await self.alice.request("GET", "/pushers", token=None)
        self.assertEqual(code, 401)


class PushersWorkersTestCase(DatabaseTestCase):
    async def test_written_by_its_worker_and_followed_by_the_others(self) -> None:
        servers, clients, _ = start_cluster(
            self, self.test_db, workers=["writer1"], stream_writers={"pushers": "writer1"}
        )
        self.assertIn("pushers", servers["writer1"].streamer.sourced_stream_names)
        alice = await ClientApi(self, clients["main"].base_url).register("alice")
        # Through main, which forwards to the writer.
        await alice.ok("POST", "/pushers/set", pusher())
        writer_stream = servers["writer1"].streams["pushers"].positions
        position = writer_stream.sync_position()
        self.assertGreater(position, 0)
        main_stream = servers["main"].streams["pushers"].positions

        def main_followed() -> bool:
            return main_stream.received_position("writer1") >= position

        await eventually(main_followed, what="main to follow the pushers stream")
        listed = (await alice.ok("GET", "/pushers"))["pushers"]
        self.assertEqual([p["pushkey"] for p in listed], ["key1"])
