"""The routing table of each layout, checked against golden files; how a
declaration becomes instances; what cannot be routed.

Regenerate the golden files after an intended change with
``SYNAPSE_LITE_UPDATE_GOLDEN=1 python -m twisted.trial tests.routing.test_table``
and review the diff.
"""

from __future__ import annotations

import os
import re
import tempfile
from typing import Any
from unittest import mock

from twisted.trial import unittest

from synapse_lite.config.generate import LAYOUTS, GenerateOptions, generate_config
from synapse_lite.config.homeserver import HomeServerConfig, load_config
from synapse_lite.config.validation import ConfigError
from synapse_lite.rest.client import served_by
from synapse_lite.routing.formats import FORMATS, render
from synapse_lite.routing.table import (
    BALANCE_ROOM,
    BALANCE_SINGLE,
    BALANCE_USER,
    RoutingError,
    RoutingTable,
    client_servlets,
)

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")
SECRET = "golden-secret"


def layout_config(layout: str, edit: Any = None) -> HomeServerConfig:
    """The generated config of a layout on ports from 30008, with fixed secrets."""
    directory = tempfile.mkdtemp()
    text = generate_config(GenerateOptions(layout=layout, base_port=30008), ".")["homeserver.yaml"]
    text = re.sub(
        r"(worker_replication_secret|registration_shared_secret): .*", r"\1: " + SECRET, text
    )
    if edit is not None:
        text = edit(text)
    path = os.path.join(directory, "homeserver.yaml")
    with open(path, "w") as f:
        f.write(text)
    return load_config(path)


def rendered(config: HomeServerConfig, form: str) -> str:
    return render(RoutingTable.build(config), form).replace(config.config_files[0], "<config>")


class GoldenTestCase(unittest.TestCase):
    def test_every_layout_and_format(self) -> None:
        update = os.environ.get("SYNAPSE_LITE_UPDATE_GOLDEN") == "1"
        for layout in LAYOUTS:
            config = layout_config(layout)
            for form in FORMATS:
                with self.subTest(layout=layout, form=form):
                    text = rendered(config, form)
                    extension = {"json": "json", "nginx": "nginx.conf", "haproxy": "haproxy.cfg"}
                    path = os.path.join(GOLDEN, f"{layout}.{extension[form]}")
                    if update:
                        with open(path, "w") as f:
                            f.write(text)
                    with open(path) as f:
                        self.assertEqual(
                            text, f.read(), f"{path} differs: see the module docstring"
                        )


class TableTestCase(unittest.TestCase):
    def test_default_layout_roles(self) -> None:
        table = RoutingTable.build(layout_config("default"))

        def route(method: str, path: str) -> tuple[str, tuple[str, ...], str]:
            found, _ = table.match(method, path)
            return found.served_by.name, found.instances, found.balance

        self.assertEqual(
            route("GET", "/_matrix/client/v3/sync"), ("readers", ("synchrotron1",), BALANCE_USER)
        )
        self.assertEqual(
            route("PUT", "/_matrix/client/v3/rooms/!r:hs/send/m.room.message/1"),
            ("room_events_writer", ("persister1", "persister2"), BALANCE_ROOM),
        )
        # One servlet, two methods, two roles.
        state = "/_matrix/client/r0/rooms/!r:hs/state/m.room.name/"
        self.assertEqual(route("PUT", state)[0], "room_events_writer")
        self.assertEqual(route("GET", state)[0], "readers")
        # A stream's writer, from stream_writers (main here).
        self.assertEqual(
            route("PUT", "/_matrix/client/v3/rooms/!r:hs/typing/@a:hs"),
            ("stream_writer:typing", ("main",), BALANCE_SINGLE),
        )
        self.assertEqual(route("POST", "/_matrix/client/v3/login")[0], "main")
        self.assertEqual(route("GET", "/_matrix/media/v3/download/hs/abc")[0], "media")
        self.assertEqual(route("GET", "/anything/else")[0], "main")

    def test_admin_api_goes_to_main(self) -> None:
        # docs/admin-api.md: every admin call is the main process's, reads too.
        admin = {
            servlet for _, pattern, servlet in client_servlets() if "_synapse/admin" in pattern
        }
        self.assertIn("admin_users", admin)
        self.assertFalse(admin & set(served_by.SERVED_BY), "admin servlets are main's")
        for layout in ("default", "sharded"):
            table = RoutingTable.build(layout_config(layout))
            for method, path in [
                ("GET", "/_synapse/admin/v2/users"),
                ("PUT", "/_synapse/admin/v2/users/@a:hs"),
                ("GET", "/_synapse/admin/v1/server_version"),
                ("DELETE", "/_synapse/admin/v2/rooms/!r:hs"),
                ("GET", "/_synapse/admin/v2/rooms/delete_status/abc"),
            ]:
                found, _ = table.match(method, path)
                self.assertEqual(found.instances, ("main",), (layout, path))

    def test_sharded_layout_sends_streams_to_their_writer(self) -> None:
        table = RoutingTable.build(layout_config("sharded"))
        found, _ = table.match("PUT", "/_matrix/client/v3/sendToDevice/m.x/1")
        self.assertEqual(found.instances, ("stream_writer1",))
        found, _ = table.match("GET", "/_matrix/client/v3/sync")
        self.assertEqual(found.instances, ("synchrotron1", "synchrotron2"))

    def test_monolith_sends_everything_to_main(self) -> None:
        table = RoutingTable.build(layout_config("monolith"))
        self.assertEqual(table.instances(), ["main"])

    def test_a_writer_without_a_client_listener_is_reached_through_main(self) -> None:
        def writers_without_client(text: str) -> str:
            return text.replace("[client, replication, health, metrics]", "[replication, health]")

        table = RoutingTable.build(layout_config("sharded", writers_without_client))
        found, _ = table.match("PUT", "/_matrix/client/v3/rooms/!r:hs/typing/@a:hs")
        self.assertEqual(found.instances, ("main",))
        found, _ = table.match("PUT", "/_matrix/client/v3/rooms/!r:hs/send/m.x/1")
        self.assertEqual((found.instances, found.balance), (("main",), BALANCE_SINGLE))

    def test_undeclared_servlets_go_to_main(self) -> None:
        declared = {name for name in served_by.SERVED_BY}
        registered = {servlet for _, _, servlet in client_servlets()}
        self.assertTrue(declared <= registered, declared - registered)
        with mock.patch.dict(served_by.SERVED_BY, clear=True):
            table = RoutingTable.build(layout_config("default"))
        # The media (federation media included) and federation prefixes.
        self.assertEqual([r.servlet for r in table.routes], [None] * 5)
        found, _ = table.match("GET", "/_matrix/client/v3/sync")
        self.assertEqual(found.instances, ("main",))

    def test_media_goes_to_the_media_instance(self) -> None:
        for layout, expected in (("default", "media1"), ("sharded", "media1")):
            table = RoutingTable.build(layout_config(layout))
            for method, path in (
                ("POST", "/_matrix/media/v3/upload"),
                ("GET", "/_matrix/client/v1/media/download/test.local/abc"),
            ):
                found, _ = table.match(method, path)
                self.assertEqual(found.instances, (expected,), (layout, path))
        no_media_worker = RoutingTable.build(
            layout_config("default", lambda text: text.replace("media_instance: media1", ""))
        )
        found, _ = no_media_worker.match("POST", "/_matrix/media/v3/upload")
        self.assertEqual(found.instances, ("main",))

    def test_unknown_stream_is_refused(self) -> None:
        with mock.patch.dict(served_by.SERVED_BY, {"sync": served_by.writer_of("nonsense")}):
            with self.assertRaises(RoutingError) as raised:
                RoutingTable.build(layout_config("default"))
        self.assertIn("'nonsense'", str(raised.exception))

    def test_main_without_client_listener_is_refused(self) -> None:
        def main_without_client(text: str) -> str:
            return text.replace("[client, federation, keys, health, metrics]", "[health, metrics]")

        # No router in the config (the monolith): refused, by the config
        # already (main is also the media instance, which needs the client API).
        with self.assertRaises((RoutingError, ConfigError)) as refused:
            RoutingTable.build(layout_config("monolith", main_without_client))
        self.assertIn("'client'", str(refused.exception))
        # With a router, the config itself is refused (tests/config).


def _sample_path(pattern: str) -> str:
    """A path a servlet's pattern matches: each named parameter a room id, a
    choice of versions its first."""
    path = re.sub(r"\(\?P<[a-z_]+>[^)]*\)", "!r:hs", pattern)
    path = re.sub(r"\(\?:([^|)]*)[^)]*\)", r"\1", path)
    return path.replace("\\", "").rstrip("$")


class CombinedMatchTestCase(unittest.TestCase):
    """The table matches a request once, with every route of its method in
    one regex: it must pick what trying route after route would."""

    def _one_by_one(self, table: RoutingTable, method: str, path: str) -> Any:
        for route in table.routes:
            found = route.matches(method, path)
            if found is not None:
                return route, found.groupdict().get("room_id")
        return table.default, None

    def test_same_route_as_one_by_one(self) -> None:
        table = RoutingTable.build(layout_config("sharded"))
        paths = {(method, _sample_path(pattern)) for method, pattern, _ in client_servlets()} | {
            ("GET", "/_matrix/media/v3/download/hs/abc"),
            ("POST", "/_matrix/federation/v1/send/1"),
            ("GET", "/_matrix/key/v2/server"),
            ("GET", "/nothing/here"),
            ("PUT", "/_matrix/client/v3/rooms/!r:hs/send/m.room.message/1/extra"),
            ("PATCH", "/_matrix/client/v3/rooms/!r:hs/send/m.room.message/1"),
        }
        with_room = 0
        for method, path in sorted(paths):
            route, room_id = self._one_by_one(table, method, path)
            for _ in range(2):  # the second time from the remembered fixed paths
                found, match = table.match(method, path)
                self.assertIs(found, route, (method, path))
                if room_id is not None:
                    assert match is not None
                    self.assertEqual(match.group("room_id"), room_id)
            with_room += room_id is not None
        self.assertGreater(with_room, 10)  # the samples reach the parameterised routes

    def test_a_prefix_route_matches_as_a_prefix_and_others_whole(self) -> None:
        table = RoutingTable.build(layout_config("default"))
        found, _ = table.match("GET", "/_matrix/media/v3/anything/below")
        self.assertEqual(found.served_by.name, "media")
        # A send path with more after it is no send: main says what it is.
        found, _ = table.match("PUT", "/_matrix/client/v3/rooms/!r:hs/send/m.x/1/more")
        self.assertIs(found, table.default)
