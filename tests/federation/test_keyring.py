"""The keyring against scripted servers and notaries, on a fake clock: keys
from the origin, a notary when the origin fails, notary signatures checked,
old keys valid for the past only, and the notary answers we give."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer, task
from twisted.trial import unittest

from synapse_lite.api.errors import SynapseError
from synapse_lite.clock import Clock
from synapse_lite.config.federation import FederationConfig, TrustedKeyServer
from synapse_lite.federation.client import FederationRequestError
from synapse_lite.federation.crypto import SigningKey, sign_json, verify_signed_json
from synapse_lite.federation.keyring import KEY_PATH, QUERY_PATH, KeyLookupError, Keyring
from synapse_lite.federation.server import parse_notary_query

NOW_MS = 1_700_000_000_000


def key_document(
    name: str, key: SigningKey, valid_until: int, old: dict[str, Any] | None = None
) -> dict[str, Any]:
    document = {
        "server_name": name,
        "verify_keys": {key.key_id: {"key": key.verify_key_base64}},
        "old_verify_keys": old or {},
        "valid_until_ts": valid_until,
    }
    return sign_json(document, name, key)


class MemoryStore:
    def __init__(self) -> None:
        self.keys: dict[str, dict[str, tuple[str, int]]] = {}
        self.documents: dict[str, tuple[dict[str, Any], int]] = {}

    async def get_server_keys(self, server_name: str) -> dict[str, tuple[str, int]]:
        return dict(self.keys.get(server_name, {}))

    async def store_server_keys(
        self,
        server_name: str,
        keys: dict[str, tuple[str, int]],
        document: dict[str, Any] | None = None,
        document_valid_until_ts: int = 0,
    ) -> None:
        self.keys.setdefault(server_name, {}).update(keys)
        kept = self.documents.get(server_name)
        if document is not None and (kept is None or kept[1] <= document_valid_until_ts):
            self.documents[server_name] = (document, document_valid_until_ts)

    async def get_server_key_json(self, server_name: str) -> dict[str, Any] | None:
        kept = self.documents.get(server_name)
        return kept[0] if kept else None


class ScriptedServers:
    """Answers ``get_json``/``post_json`` per (server, path); an Exception
    answer is raised as the server being unreachable."""

    def __init__(self) -> None:
        self.answers: dict[tuple[str, str], Any] = {}
        self.asked: list[tuple[str, str, Any]] = []

    def _answer(self, destination: str, path: str, body: Any) -> Any:
        self.asked.append((destination, path, body))
        answer = self.answers.get((destination, path))
        if answer is None or isinstance(answer, Exception):
            raise FederationRequestError(destination, "not reached")
        return answer

    async def get_json(self, destination: str, path: str, signed: bool = True) -> Any:
        return self._answer(destination, path, None)

    async def post_json(
        self, destination: str, path: str, content: Any, signed: bool = True
    ) -> Any:
        return self._answer(destination, path, content)


class KeyringTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.reactor = task.Clock()
        self.reactor.advance(NOW_MS / 1000)
        self.store = MemoryStore()
        self.servers = ScriptedServers()
        self.ours = SigningKey.generate()
        self.origin_key = SigningKey.generate()
        self.notary_key = SigningKey.generate()

    def keyring(self, config: FederationConfig) -> Keyring:
        return Keyring(
            store=self.store,  # type: ignore[arg-type]
            clock=Clock(self.reactor),
            config=config,
            client=self.servers,  # type: ignore[arg-type]
            signing_key=self.ours,
            server_name="us.test",
        )

    def result(self, coroutine: Any) -> Any:
        return self.successResultOf(defer.ensureDeferred(coroutine))

    def fails(self, coroutine: Any, error: type[Exception]) -> Exception:
        return self.failureResultOf(defer.ensureDeferred(coroutine), error).value

    def notary_answer(self, *documents: dict[str, Any]) -> dict[str, Any]:
        return {"server_keys": [sign_json(d, "notary.test", self.notary_key) for d in documents]}

    def test_origin_first_then_no_notary_by_default(self) -> None:
        keyring = self.keyring(FederationConfig())
        document = key_document("o.test", self.origin_key, NOW_MS + 60_000)
        self.servers.answers[("o.test", KEY_PATH)] = document
        key = self.result(keyring.get_verify_key("o.test", self.origin_key.key_id))
        self.assertEqual(key, self.origin_key.verify_key_base64)
        self.assertEqual(self.store.documents["o.test"][0], document)
        # An unreachable origin with no notary configured: no key, nobody else asked.
        self.servers.answers.clear()
        self.fails(keyring.get_verify_key("gone.test", "ed25519:x"), KeyLookupError)
        self.assertEqual([a[0] for a in self.servers.asked], ["o.test", "gone.test"])

    def test_notary_used_when_the_origin_fails(self) -> None:
        notary = TrustedKeyServer(
            "notary.test", {self.notary_key.key_id: self.notary_key.verify_key_base64}
        )
        keyring = self.keyring(FederationConfig(trusted_key_servers=(notary,)))
        document = key_document("o.test", self.origin_key, NOW_MS + 60_000)
        self.servers.answers[("notary.test", QUERY_PATH)] = self.notary_answer(document)
        with self.assertLogs("synapse_lite.federation.keyring", "INFO") as logs:
            key = self.result(keyring.get_verify_key("o.test", self.origin_key.key_id))
        self.assertEqual(key, self.origin_key.verify_key_base64)
        self.assertEqual(
            self.servers.asked[-1],
            (
                "notary.test",
                QUERY_PATH,
                {
                    "server_keys": {
                        "o.test": {self.origin_key.key_id: {"minimum_valid_until_ts": NOW_MS}}
                    }
                },
            ),
        )
        self.assertIn("from notary.test", logs.output[-1])
        # Kept as the origin signed it (the notary's signature stripped).
        self.assertEqual(list(self.store.documents["o.test"][0]["signatures"]), ["o.test"])

    def test_notary_answers_must_carry_its_signature_and_the_origins(self) -> None:
        notary = TrustedKeyServer("notary.test", {"ed25519:other": self.ours.verify_key_base64})
        keyring = self.keyring(FederationConfig(trusted_key_servers=(notary,)))
        document = key_document("o.test", self.origin_key, NOW_MS + 60_000)
        self.servers.answers[("notary.test", QUERY_PATH)] = self.notary_answer(document)
        with self.assertLogs("synapse_lite.federation.keyring", "WARNING") as logs:
            self.fails(keyring.get_verify_key("o.test", self.origin_key.key_id), KeyLookupError)
        self.assertIn("none of the keys configured for it", logs.output[-1])

        # A document the origin did not sign (a lying notary) is refused too.
        self.reactor.advance(10)
        forged = key_document("o.test", SigningKey.generate(), NOW_MS + 60_000)
        forged["verify_keys"] = {self.origin_key.key_id: {"key": self.origin_key.verify_key_base64}}
        trusted = TrustedKeyServer(
            "notary.test", {self.notary_key.key_id: self.notary_key.verify_key_base64}
        )
        keyring = self.keyring(FederationConfig(trusted_key_servers=(trusted,)))
        self.servers.answers[("notary.test", QUERY_PATH)] = self.notary_answer(forged)
        self.fails(keyring.get_verify_key("o.test", self.origin_key.key_id), KeyLookupError)

    def test_notary_without_configured_keys_is_checked_with_its_published_key(self) -> None:
        keyring = self.keyring(
            FederationConfig(trusted_key_servers=(TrustedKeyServer("notary.test"),))
        )
        self.servers.answers[("notary.test", KEY_PATH)] = key_document(
            "notary.test", self.notary_key, NOW_MS + 60_000
        )
        document = key_document("o.test", self.origin_key, NOW_MS + 60_000)
        self.servers.answers[("notary.test", QUERY_PATH)] = self.notary_answer(document)
        key = self.result(keyring.get_verify_key("o.test", self.origin_key.key_id))
        self.assertEqual(key, self.origin_key.verify_key_base64)

    def test_old_keys_verify_the_past_only(self) -> None:
        old_key = SigningKey.generate()
        expired = NOW_MS - 1000
        document = key_document(
            "o.test",
            self.origin_key,
            NOW_MS + 60_000,
            {old_key.key_id: {"key": old_key.verify_key_base64, "expired_ts": expired}},
        )
        self.servers.answers[("o.test", KEY_PATH)] = document
        keyring = self.keyring(FederationConfig())
        self.assertEqual(
            self.result(keyring.get_verify_key("o.test", old_key.key_id, valid_at_ms=expired - 1)),
            old_key.verify_key_base64,
        )
        self.assertEqual(
            self.store.keys["o.test"][old_key.key_id], (old_key.verify_key_base64, expired)
        )
        self.fails(keyring.get_verify_key("o.test", old_key.key_id), KeyLookupError)

    def test_our_old_keys_are_published_and_verify_the_past(self) -> None:
        old_key = SigningKey.generate()
        config = FederationConfig(
            old_verify_keys={old_key.key_id: (old_key.verify_key_base64, NOW_MS)}
        )
        keyring = self.keyring(config)
        document = keyring.local_key_document()
        self.assertEqual(
            document["old_verify_keys"],
            {old_key.key_id: {"key": old_key.verify_key_base64, "expired_ts": NOW_MS}},
        )
        self.assertEqual(
            self.result(keyring.get_verify_key("us.test", old_key.key_id, valid_at_ms=NOW_MS - 1)),
            old_key.verify_key_base64,
        )
        self.fails(keyring.get_verify_key("us.test", old_key.key_id), KeyLookupError)

    def test_notary_documents(self) -> None:
        keyring = self.keyring(FederationConfig())
        self.servers.answers[("o.test", KEY_PATH)] = key_document(
            "o.test", self.origin_key, NOW_MS + 1000
        )
        [answer] = self.result(keyring.notary_documents("o.test"))
        verify_signed_json(
            answer, "o.test", self.origin_key.key_id, self.origin_key.verify_key_base64
        )
        verify_signed_json(answer, "us.test", self.ours.key_id, self.ours.verify_key_base64)
        # Still valid: answered from the store.
        self.result(keyring.notary_documents("o.test"))
        self.assertEqual(len(self.servers.asked), 1)
        # Asked for a longer validity than held: fetched again.
        self.reactor.advance(6)
        self.servers.answers[("o.test", KEY_PATH)] = key_document(
            "o.test", self.origin_key, NOW_MS + 90_000
        )
        [answer] = self.result(keyring.notary_documents("o.test", NOW_MS + 50_000))
        self.assertEqual(answer["valid_until_ts"], NOW_MS + 90_000)
        self.assertEqual(self.result(keyring.notary_documents("unknown.test")), [])
        [own] = self.result(keyring.notary_documents("us.test"))
        self.assertEqual(own["server_name"], "us.test")


class NotaryQueryTestCase(unittest.TestCase):
    def test_parse(self) -> None:
        self.assertEqual(
            parse_notary_query(
                {
                    "server_keys": {
                        "a.test": {},
                        "b.test": {
                            "ed25519:x": {"minimum_valid_until_ts": 5},
                            "ed25519:y": {"minimum_valid_until_ts": 9},
                            "ed25519:z": {},
                        },
                    }
                }
            ),
            {"a.test": 0, "b.test": 9},
        )

    def test_bad_queries(self) -> None:
        bodies: list[dict[str, Any]] = [
            {},
            {"server_keys": []},
            {"server_keys": {"a.test": []}},
            {"server_keys": {"a.test": {"k": {"minimum_valid_until_ts": "soon"}}}},
            {"server_keys": {"a.test": {"k": 5}}},
            {"server_keys": {f"s{i}.test": {} for i in range(101)}},
        ]
        for body in bodies:
            with self.assertRaises(SynapseError, msg=str(body)[:80]) as raised:
                parse_notary_query(body)
            self.assertEqual(raised.exception.code, 400)
