"""``app_service_config_files``: registrations read, and every mistake in
them reported with its file and key."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import yaml
from twisted.trial import unittest

from synapse_lite.config.homeserver import HomeServerConfig, load_config
from synapse_lite.config.validation import ConfigError
from tests.config.test_homeserver import write_config


def registration(**changes: Any) -> dict[str, Any]:
    """A valid registration, as mautrix bridges write them."""
    data: dict[str, Any] = {
        "id": "irc",
        "url": "http://127.0.0.1:9999",
        "as_token": "as-secret",
        "hs_token": "hs-secret",
        "sender_localpart": "_irc_bot",
        "namespaces": {
            "users": [{"exclusive": True, "regex": "@_irc_.*:test"}],
            "aliases": [{"exclusive": False, "regex": "#_irc_.*:test"}],
            "rooms": [],
        },
        "rate_limited": False,
        "protocols": ["irc"],
        "receive_ephemeral": True,
        "de.sorunome.msc2409.push_ephemeral": True,
    }
    data.update(changes)
    return data


def load_with(*registrations: dict[str, Any], directory: str | None = None) -> HomeServerConfig:
    """A config naming ``registrations`` (written in ``directory``, a new
    one by default)."""
    directory = directory or tempfile.mkdtemp()
    names = []
    for i, data in enumerate(registrations):
        name = f"as{i}.yaml"
        with open(os.path.join(directory, name), "w") as f:
            yaml.safe_dump(data, f)
        names.append(name)
    return load_config(
        write_config(directory, {"server_name": "test", "app_service_config_files": names})
    )


class RegistrationFilesTestCase(unittest.TestCase):
    def assert_refused(self, reason: str, *registrations: dict[str, Any]) -> str:
        with self.assertRaises(ConfigError) as raised:
            load_with(*registrations)
        self.assertIn(reason, str(raised.exception))
        return str(raised.exception)

    def test_a_registration_is_read(self) -> None:
        [service] = load_with(registration()).app_services
        self.assertEqual(service.id, "irc")
        self.assertEqual(service.sender, "@_irc_bot:test")
        self.assertFalse(service.rate_limited)
        self.assertTrue(service.receive_ephemeral)
        self.assertEqual(service.protocols, ("irc",))
        self.assertTrue(service.is_exclusive_user("@_irc_alice:test"))
        self.assertFalse(service.is_user_in_namespace("@alice:test"))
        # The regex matches the whole id.
        self.assertFalse(service.is_user_in_namespace("@x@_irc_a:test"))
        self.assertTrue(service.is_alias_in_namespace("#_irc_room:test"))
        self.assertFalse(service.is_exclusive_alias("#_irc_room:test"))

    def test_defaults(self) -> None:
        data = registration()
        for key in ("rate_limited", "protocols", "receive_ephemeral"):
            del data[key]
        del data["de.sorunome.msc2409.push_ephemeral"]
        [service] = load_with(data).app_services
        self.assertTrue(service.rate_limited)
        self.assertFalse(service.receive_ephemeral)
        self.assertFalse(service.msc3202)
        self.assertEqual(service.protocols, ())

    def test_msc3202_opt_in(self) -> None:
        [service] = load_with(registration(**{"org.matrix.msc3202": True})).app_services
        self.assertTrue(service.msc3202)
        with self.assertRaises(ConfigError) as raised:
            load_with(registration(**{"org.matrix.msc3202": "yes"}))
        self.assertIn("org.matrix.msc3202", str(raised.exception))

    def test_null_url_means_no_traffic(self) -> None:
        [service] = load_with(registration(url=None)).app_services
        self.assertIsNone(service.url)

    def test_missing_and_mistyped_keys(self) -> None:
        data = registration(url="ftp://x", sender_localpart="Bad Name")
        del data["as_token"]
        message = self.assert_refused("as_token: is required", data)
        self.assertIn("as0.yaml: url: must be an http:// or https:// URL", message)
        self.assertIn("sender_localpart: must be a user id's localpart", message)
        data = registration()
        del data["url"]
        self.assert_refused("url: is required (null if the service wants no traffic)", data)

    def test_bad_regex(self) -> None:
        data = registration(namespaces={"users": [{"exclusive": True, "regex": "@_irc_(.*"}]})
        self.assert_refused("namespaces.users[0].regex: is not a valid regular expression", data)

    def test_unknown_key_in_a_namespace(self) -> None:
        data = registration(namespaces={"users": [{"exclusive": True, "regx": "@a"}]})
        self.assert_refused("namespaces.users[0].regx: is not a known setting here", data)

    def test_duplicate_ids_and_tokens(self) -> None:
        first = registration()
        self.assert_refused(
            "id: is already used by application service 'irc'",
            first,
            registration(as_token="a2", hs_token="h2", sender_localpart="b2"),
        )
        self.assert_refused(
            "as_token: is already used by application service 'irc'",
            first,
            registration(id="two", hs_token="h2", sender_localpart="b2"),
        )
        # One service's hs_token as another's as_token.
        self.assert_refused(
            "as_token: is already used",
            first,
            registration(id="two", as_token="hs-secret", hs_token="h2", sender_localpart="b2"),
        )
        two = load_with(
            first, registration(id="two", as_token="a2", hs_token="h2", sender_localpart="b2")
        ).app_services
        self.assertEqual([s.id for s in two], ["irc", "two"])
        self.assertEqual(two.by_as_token("a2").id, "two")  # type: ignore[union-attr]

    def test_missing_file(self) -> None:
        with self.assertRaises(ConfigError) as raised:
            load_config(
                write_config(
                    tempfile.mkdtemp(),
                    {"server_name": "test", "app_service_config_files": ["nope.yaml"]},
                )
            )
        self.assertIn("nope.yaml: file not found", str(raised.exception))


class ExclusivityTestCase(unittest.TestCase):
    def test_claims(self) -> None:
        services = load_with(
            registration(),
            registration(
                id="slack",
                as_token="a2",
                hs_token="h2",
                sender_localpart="_slack_bot",
                namespaces={
                    "users": [{"exclusive": False, "regex": "@_slack_.*:test"}],
                    "aliases": [{"exclusive": True, "regex": "#_slack_.*:test"}],
                },
            ),
        ).app_services
        irc, slack = services
        self.assertFalse(services.may_claim_user("@_irc_x:test", None))
        self.assertTrue(services.may_claim_user("@_irc_x:test", irc))
        self.assertFalse(services.may_claim_user("@_irc_x:test", slack))
        # Non-exclusive: anyone may, the service too; outside: not the service.
        self.assertTrue(services.may_claim_user("@_slack_x:test", None))
        self.assertTrue(services.may_claim_user("@_slack_x:test", slack))
        self.assertFalse(services.may_claim_user("@alice:test", slack))
        self.assertFalse(services.may_claim_user("@_irc_bot:test", None))
        self.assertFalse(services.may_claim_alias("#_slack_r:test", None))
        self.assertTrue(services.may_claim_alias("#_slack_r:test", slack))
        self.assertFalse(services.may_claim_alias("#_slack_r:test", irc))
        self.assertTrue(services.may_claim_alias("#_irc_r:test", None))
        self.assertEqual(services.exclusive_owner_of_user("@_irc_q:test"), irc)
        self.assertIsNone(services.exclusive_owner_of_user("@_slack_q:test"))


class AppServiceInstancesTestCase(unittest.TestCase):
    def test_default_and_bad_names(self) -> None:
        self.assertEqual(load_with(registration()).appservice_instances, ("main",))
        for value, reason in [
            (["nobody"], "'nobody' is not the main process or a declared worker"),
            (["main", "main"], "must name one or more processes, each once"),
        ]:
            with self.assertRaises(ConfigError) as raised:
                load_config(
                    write_config(
                        tempfile.mkdtemp(),
                        {"server_name": "test", "appservice_instances": value},
                    )
                )
            self.assertIn(f"appservice_instances: {reason}", str(raised.exception))

    def test_a_changed_regex_is_a_changed_registration(self) -> None:
        first = load_with(registration()).app_services
        same = load_with(registration()).app_services
        changed = load_with(
            registration(namespaces={"users": [{"exclusive": True, "regex": "@_other_.*"}]})
        ).app_services
        self.assertEqual(first, same)
        self.assertNotEqual(first, changed)


class ReloadTestCase(unittest.TestCase):
    def test_a_changed_registration_or_instances_restart_every_process(self) -> None:
        from synapse_lite.app.launch_plan import settings_shared_by_all

        directory = tempfile.mkdtemp()
        before = load_with(registration(), directory=directory)
        again = load_with(registration(), directory=directory)
        self.assertEqual(settings_shared_by_all(before), settings_shared_by_all(again))
        changed = load_with(registration(url="http://127.0.0.1:7777"), directory=directory)
        self.assertNotEqual(settings_shared_by_all(before), settings_shared_by_all(changed))
