"""Binding third-party identifiers at the identity server a client names:
``/account/3pid/bind`` (the client's session and token passed on),
``/unbind`` and ``/delete`` (at the server named, else where it was bound,
signed with the server's key), deactivation; an identity server's refusal
passed on; private addresses refused unless allowed; bad input. Against an
identity server served in the test over HTTPS with its own CA, on the main
process and through a reader worker (which forwards nothing: the rows are
plain, the key is read from the shared data directory)."""

from __future__ import annotations

import json
import os
from typing import Any, cast

from twisted.internet import reactor
from twisted.web.resource import Resource
from twisted.web.server import Site

from synapse_lite.federation.auth import parse_auth_header, request_json
from synapse_lite.federation.crypto import (
    canonical_json,
    load_or_create_signing_key,
    verify_signature,
)
from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.server import DatabaseTestCase
from tests.harness.spec import assert_spec_response
from tests.harness.tls import TestCA

_reactor = cast(Any, reactor)
ADMIN_CONTACT = "administrative_contact.yaml"


class IdentityServer(Resource):
    """Binds what a validated session says, keeps bindings, unbinds; says
    404 for a binding it does not have. ``refuse`` makes binds fail."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.sessions = {"sid1": ("email", "alice@example.org")}
        self.bindings: dict[tuple[str, str], str] = {}
        self.requests: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        self.refuse = False

    def render_POST(self, request: Any) -> bytes:
        body = json.loads(request.content.read())
        headers = {
            k.decode().lower(): v[0].decode() for k, v in request.requestHeaders.getAllRawHeaders()
        }
        path = request.path.decode()
        self.requests.append((path, headers, body))
        request.setHeader(b"Content-Type", b"application/json")
        if path == "/_matrix/identity/v2/3pid/bind":
            if self.refuse or body.get("sid") not in self.sessions:
                request.setResponseCode(400)
                return b'{"errcode": "M_SESSION_NOT_VALIDATED", "error": "not validated"}'
            medium, address = self.sessions[body["sid"]]
            self.bindings[(medium, address)] = body["mxid"]
            return json.dumps({"medium": medium, "address": address, "mxid": body["mxid"]}).encode()
        if path == "/_matrix/identity/v2/3pid/unbind":
            key = (body["threepid"]["medium"], body["threepid"]["address"])
            if self.bindings.get(key) != body["mxid"]:
                request.setResponseCode(404)
                return b'{"errcode": "M_NOT_FOUND", "error": "no such binding"}'
            del self.bindings[key]
            return b"{}"
        request.setResponseCode(404)
        return b"{}"


class IdentityTestCase(DatabaseTestCase):
    workers: list[str] = []
    entry = "main"

    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        ca = TestCA(directory)
        options = ca.server_options("identity", ["localhost"])
        self.identity = IdentityServer()
        port = _reactor.listenSSL(0, Site(self.identity), options, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        self.id_server = f"localhost:{port.getHost().port}"
        self.servers, clients, _ = start_cluster(
            self,
            self.test_db,
            workers=self.workers,
            outbound_requests={
                "extra_ca_paths": [ca.ca_path],
                "ip_range_allowlist": ["127.0.0.1/32", "::1/128"],
            },
        )
        base = clients[self.entry].base_url
        self.alice = await ClientApi(self, base).register("alice")

    async def bind(self, sid: str = "sid1") -> tuple[int, Any]:
        return await self.alice.request(
            "POST",
            "/account/3pid/bind",
            {
                "id_server": self.id_server,
                "id_access_token": "ist-token",
                "sid": sid,
                "client_secret": "secret",
            },
        )

    def check_signed(self, headers: dict[str, str], body: dict[str, Any], path: str) -> None:
        """The unbind request carries the server's valid X-Matrix signature."""
        auth = parse_auth_header(headers["authorization"])
        self.assertEqual((auth.origin, auth.destination), ("test.local", self.id_server))
        key = load_or_create_signing_key(self.servers["main"].config.data_dir, create=False)
        signed = request_json("POST", path, auth.origin, self.id_server, body)
        verify_signature(canonical_json(signed), auth.signature, key.verify_key_base64)

    async def test_bind_then_unbind_where_it_was_bound(self) -> None:
        code, answer = await self.bind()
        self.assertEqual((code, answer), (200, {}))
        path, headers, body = self.identity.requests[-1]
        self.assertEqual(headers["authorization"], "Bearer ist-token")
        self.assertEqual(
            body, {"sid": "sid1", "client_secret": "secret", "mxid": self.alice.user_id}
        )
        self.assertEqual(
            self.identity.bindings, {("email", "alice@example.org"): self.alice.user_id}
        )
        # No id_server: the one it was bound at.
        unbound = await self.alice.ok(
            "POST", "/account/3pid/unbind", {"medium": "email", "address": "alice@example.org"}
        )
        assert_spec_response(self, ADMIN_CONTACT, "/account/3pid/unbind", "POST", 200, unbound)
        self.assertEqual(unbound, {"id_server_unbind_result": "success"})
        self.assertEqual(self.identity.bindings, {})
        path, headers, body = self.identity.requests[-1]
        self.assertEqual(
            body,
            {
                "mxid": self.alice.user_id,
                "threepid": {"medium": "email", "address": "alice@example.org"},
            },
        )
        self.check_signed(headers, body, path)
        # Forgotten: nothing left to unbind.
        again = await self.alice.ok(
            "POST", "/account/3pid/delete", {"medium": "email", "address": "alice@example.org"}
        )
        self.assertEqual(again, {"id_server_unbind_result": "no-support"})

    async def test_unbind_at_a_named_server_and_on_deactivation(self) -> None:
        # Bound out of band: only the server named can unbind it.
        self.identity.bindings[("email", "other@example.org")] = self.alice.user_id or ""
        deleted = await self.alice.ok(
            "POST",
            "/account/3pid/delete",
            {"medium": "email", "address": "other@example.org", "id_server": self.id_server},
        )
        self.assertEqual(deleted, {"id_server_unbind_result": "success"})
        self.assertEqual(self.identity.bindings, {})
        # A binding the server does not have: it refuses, no-support.
        refused = await self.alice.ok(
            "POST",
            "/account/3pid/unbind",
            {"medium": "email", "address": "none@example.org", "id_server": self.id_server},
        )
        self.assertEqual(refused, {"id_server_unbind_result": "no-support"})
        # Deactivation unbinds what was bound through this server.
        self.assertEqual((await self.bind())[0], 200)
        answer = await self.alice.ok(
            "POST",
            "/account/deactivate",
            {
                "auth": {
                    "type": "m.login.password",
                    "identifier": {"type": "m.id.user", "user": "alice"},
                    "password": "secret-pw",
                }
            },
        )
        self.assertEqual(answer, {"id_server_unbind_result": "success"})
        self.assertEqual(self.identity.bindings, {})

    async def test_refusals(self) -> None:
        self.identity.refuse = True
        code, answer = await self.bind()
        self.assertEqual((code, answer["errcode"]), (400, "M_SESSION_NOT_VALIDATED"))
        self.assertIn(self.id_server, answer["error"])
        self.assertEqual(await self.alice.ok("GET", "/account/3pid"), {"threepids": []})
        for id_server, errcode in [
            ("https://localhost/x", "M_INVALID_PARAM"),
            ("local host", "M_INVALID_PARAM"),
            # Allowed here is 127.0.0.1 only.
            ("127.0.0.2:1", "M_SERVER_NOT_TRUSTED"),
            ("10.0.0.1", "M_SERVER_NOT_TRUSTED"),
        ]:
            code, answer = await self.alice.request(
                "POST",
                "/account/3pid/bind",
                {"id_server": id_server, "id_access_token": "t", "sid": "s", "client_secret": "c"},
            )
            self.assertEqual((code, answer["errcode"]), (400, errcode), id_server)
        code, answer = await self.alice.request(
            "POST", "/account/3pid/bind", {"id_server": self.id_server, "sid": "s"}
        )
        self.assertEqual((code, answer["errcode"]), (400, "M_MISSING_PARAM"))

    async def test_unstable_paths(self) -> None:
        code, _ = await self.alice.request(
            "POST",
            "/_matrix/client/unstable/account/3pid/bind",
            {
                "id_server": self.id_server,
                "id_access_token": "ist-token",
                "sid": "sid1",
                "client_secret": "secret",
            },
        )
        self.assertEqual(code, 200)
        unbound = await self.alice.ok(
            "POST",
            "/_matrix/client/unstable/account/3pid/unbind",
            {"medium": "email", "address": "alice@example.org", "id_server": self.id_server},
        )
        self.assertEqual(unbound, {"id_server_unbind_result": "success"})


class IdentityThroughAWorkerTestCase(IdentityTestCase):
    workers = ["reader"]
    entry = "reader"
