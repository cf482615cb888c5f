"""Key backup versions created at the same time get distinct numbers, the
newest one current (SQLite and PostgreSQL)."""

from __future__ import annotations

from twisted.internet import defer, reactor
from twisted.internet.task import deferLater

from synapse_lite.storage._base import json_encoder
from tests.harness.server import DatabaseTestCase, make_config, make_homeserver

ALICE = "@alice:test.local"
ALGORITHM = "m.megolm_backup.v1.curve25519-aes-sha2"


class BackupVersionCreationTestCase(DatabaseTestCase):
    async def test_a_creation_racing_another_process_takes_the_next_number(self) -> None:
        """Another process (here a bare connection) has written version 1 but
        not committed when this creation starts: the creation must wait and
        take 2, not read the old highest number and collide on 1."""
        hs = make_homeserver(self, make_config(self.test_db))
        store = hs.store
        engine = store.db_pool.engine
        other = engine.connect()
        self.addCleanup(other.close)
        engine.begin(other)
        cursor = other.cursor()
        cursor.execute(
            engine.convert_param_style(
                "INSERT INTO e2e_room_keys_versions"
                " (user_id, version, algorithm, auth_data, deleted, etag)"
                " VALUES (?, ?, ?, ?, ?, ?)"
            ),
            (ALICE, 1, ALGORITHM, json_encoder({"public_key": "other"}), False, 0),
        )
        creating = defer.ensureDeferred(
            store.create_backup_version(ALICE, ALGORITHM, {"public_key": "mine"})
        )
        await deferLater(reactor, 0.5, lambda: None)
        # It waits for the other process's transaction.
        self.assertFalse(creating.called)
        engine.commit(other)
        self.assertEqual(await creating, 2)
        current = await store.get_backup_version(ALICE, None)
        assert current is not None
        self.assertEqual((current.version, current.auth_data), (2, {"public_key": "mine"}))

    async def test_many_concurrent_creations_all_succeed_with_distinct_numbers(self) -> None:
        """Creations at once on all the pool's connections: every one
        succeeds, the numbers are 1..n."""
        hs = make_homeserver(self, make_config(self.test_db))
        created = await defer.gatherResults(
            [
                defer.ensureDeferred(hs.store.create_backup_version(ALICE, ALGORITHM, {"n": n}))
                for n in range(10)
            ],
            consumeErrors=True,
        )
        self.assertEqual(sorted(created), list(range(1, 11)))
        current = await hs.store.get_backup_version(ALICE, None)
        assert current is not None
        self.assertEqual(current.version, 10)
        # Another user's numbers start at 1 whatever alice has.
        self.assertEqual(await hs.store.create_backup_version("@bob:test.local", ALGORITHM, {}), 1)
