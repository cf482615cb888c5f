"""The real matrix-js-sdk with Rust crypto across two servers of ours.

Two homeservers in the test process, each with its own database, named
``localhost:<port>`` and serving federation over HTTPS on that port with a
certificate from a test CA that both trust (as a real deployment would with
its CA, but loopback allowed); their client APIs over plain HTTP. The Node
script ``tests/e2e/js/encrypted_chat_federated.mjs`` drives one client on
each; see :mod:`tests.harness.node` for when it is skipped.
"""

from __future__ import annotations

import json
import tempfile

from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.trial import unittest

from synapse_lite.storage.id_generators import generator as id_generators
from tests.harness.client_api import ClientApi
from tests.harness.databases import END_TO_END, one_engine_only
from tests.harness.node import require_js_sdk, run_script
from tests.harness.synapse_peer import start_our_server
from tests.harness.tls import TestCA


class JsSdkFederatedEncryptionTestCase(unittest.TestCase):
    timeout = 120

    async def test_encrypted_chat_and_sas_verification_across_servers(self) -> None:
        one_engine_only("postgres", END_TO_END)
        """alice (server A) and bob (server B): a remote invite and join,
        encrypted messages both ways, cross-signing for both, an interactive
        SAS verification in the room, and then each sees the other as
        verified by cross-signing, and alice sees bob's device verified."""
        require_js_sdk()
        self.patch(id_generators, "STREAM_POSITIONS_WRITE_DELAY", 0)
        ca = TestCA(tempfile.mkdtemp(prefix="js_sdk_federation_ca_"))
        logins = []
        for name in ("alice", "bob"):
            _, client_url = start_our_server(self, ca)
            password = "pw-" + name
            client = await ClientApi(self, client_url).register(name, password)
            logins.append(
                json.dumps(
                    {
                        "base_url": client_url,
                        "user_id": client.user_id,
                        "access_token": client.token,
                        "device_id": client.device_id,
                        "password": password,
                    }
                )
            )
        result = await run_script("encrypted_chat_federated.mjs", *logins)
        # Let the clients' last long-polls (2 s) end before the servers stop.
        await deferLater(reactor, 2.5, lambda: None)
        # What each step saw, in the message of the first check that fails.
        self.assertNotIn("error", result, result)
        self.assertEqual(result["steps"][-1:], ["done"], result)
        self.assertTrue(result["encrypted_room"])
        self.assertEqual(result["bob_decrypted"], "hello bob")
        self.assertEqual(result["alice_decrypted"], "hello alice")
        self.assertTrue(result["alice_cross_signing_ready"])
        self.assertTrue(result["bob_cross_signing_ready"])
        self.assertTrue(result["alice_sees_bob_identity"])
        self.assertTrue(result["bob_sees_alice_identity"])
        # Both sides showed the same SAS, and both confirmed it.
        self.assertEqual(result["alice_sas"], result["bob_sas"])
        self.assertEqual(len(result["alice_sas"]), 3)
        self.assertTrue(result["alice_verified_bob"])
        self.assertTrue(result["bob_verified_alice"])
        self.assertTrue(result["alice_verified_bob_device"])
