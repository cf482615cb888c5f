"""The admin UI itself in a real browser: Ketesa (formerly synapse-admin),
its built files (``tests/e2e/admin_ui/``) served on another origin, driven
in headless Chromium (Debian's ``chromium``, through ``playwright-core``) by
``tests/e2e/js/admin_ui.mjs``: it logs in, lists and searches the users,
opens one and each of its tabs, sends a server notice through its dialog,
lists the rooms, opens one, lists the event reports and creates a
registration token through its form. A page whose calls answer >= 400 fails
even when it renders.

Skipped, with the reason, without Chromium, Node or playwright-core, except
under ``CI=true`` (``.ci/run`` installs Chromium)."""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import tempfile
from typing import Any, cast

from twisted.internet import reactor
from twisted.trial.unittest import SkipTest
from twisted.web.resource import Resource
from twisted.web.server import Site
from twisted.web.static import Data, File

from tests.harness.client_api import ClientApi, q, start_cluster
from tests.harness.databases import END_TO_END, one_engine_only
from tests.harness.node import JS_DIR, run_script
from tests.harness.server import DatabaseTestCase
from tests.harness.services import ServiceMissing, in_ci

UI_ARCHIVE = os.path.join(os.path.dirname(__file__), "admin_ui", "ketesa-dist.tar.gz")
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def require_browser() -> None:
    """Skip (fail under CI) without Chromium, Node or playwright-core."""
    if not os.path.exists(CHROMIUM):
        message = f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    elif shutil.which("node") is None:
        message = "node is not installed"
    elif not os.path.isdir(os.path.join(JS_DIR, "node_modules", "playwright-core")):
        message = f"playwright-core is not installed: cd {JS_DIR} && npm ci"
    else:
        return
    if in_ci():
        raise ServiceMissing(message + " (CI=true: a missing dependency is a failure)")
    raise SkipTest(message)


def serve_ui(testcase: DatabaseTestCase, homeserver_url: str) -> str:
    """Serve the built UI on 127.0.0.1 (another origin than the server's),
    its ``config.json`` pinning the homeserver; its URL."""
    directory = tempfile.mkdtemp(prefix="admin_ui_")
    testcase.addCleanup(shutil.rmtree, directory, True)
    with tarfile.open(UI_ARCHIVE) as archive:
        archive.extractall(directory, filter="data")
    root = File(directory)
    config = json.dumps({"restrictBaseUrl": homeserver_url}).encode()
    root.putChild(b"config.json", Data(config, "application/json"))
    port = cast(Any, reactor).listenTCP(0, Site(cast(Resource, root)), interface="127.0.0.1")
    testcase.addCleanup(port.stopListening)
    return f"http://127.0.0.1:{port.getHost().port}/"


class AdminUiBrowserTestCase(DatabaseTestCase):
    async def test_login_users_rooms_reports(self) -> None:
        one_engine_only("sqlite", END_TO_END)
        require_browser()
        servers, clients, _ = start_cluster(
            self, self.test_db, server_notices={"system_mxid_localpart": "notices"}
        )
        base = clients["main"].base_url
        admin = await ClientApi(self, base).register("admin", "admin-pw")
        await servers["main"].store.db_pool.execute(
            "t", "UPDATE users SET admin = TRUE WHERE name = ?", admin.user_id
        )
        bob = await ClientApi(self, base).register("bob", "bob-pw")
        room = await bob.create_room(preset="public_chat", name="Browser test room")
        event_id = await bob.send(room, "spam")
        await admin.ok("POST", f"/join/{q(room)}", {})
        await admin.ok("POST", f"/rooms/{q(room)}/report/{q(event_id)}", {"reason": "spam"})
        ui = serve_ui(self, base)
        assert bob.user_id is not None
        result = await run_script(
            "admin_ui.mjs",
            ui,
            base,
            "admin",
            "admin-pw",
            bob.user_id,
            "Browser test room",
            env={"CHROMIUM": CHROMIUM, "SCREENSHOT": os.path.join(self.mktemp() + ".png")},
        )
        self.assertNotIn("error", result, json.dumps(result, indent=1))
        self.assertEqual(result["failed_calls"], [], json.dumps(result, indent=1))
        pages = result["pages"]
        self.assertGreaterEqual(pages["users"], 2)
        self.assertGreaterEqual(pages["users_search"], 1)
        self.assertTrue(pages["user"])
        self.assertGreaterEqual(pages["rooms"], 1)
        self.assertTrue(pages["room"])
        self.assertGreaterEqual(pages["reports"], 1)
        self.assertEqual(len(pages["user_tabs"]), 9)
        # What the forms and dialogs did, seen through the API.
        self.assertTrue(pages["server_notice"])
        invites = (await bob.ok("GET", "/sync?timeout=0"))["rooms"]["invite"]
        self.assertEqual(len(invites), 1)
        self.assertTrue(pages["registration_token"])
        token = await admin.ok("GET", "/_synapse/admin/v1/registration_tokens/browser-token")
        self.assertEqual(token["token"], "browser-token")
