"""A real Synapse (the reference homeserver) as a federation peer on loopback.

``synapse_install.py`` installs it (once, cached). :class:`SynapsePeer`
writes a config for one Synapse in a temporary directory (HTTPS federation
with a certificate from the test's CA, that CA trusted for other servers with
verification on, 127.0.0.0/8 allowed, no trusted key servers, SQLite),
starts it, waits until it answers, and stops it.

Tests that need it call :func:`synapse_or_skip`: without an install (and
when installing fails) they are skipped with the reason, except under
``CI=true``, where that is a failure. ``.ci/run`` installs it while the
tests run (``python3 tests/harness/synapse_install.py``); a test that needs it
meanwhile waits for that install to finish.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import tempfile
import time
from typing import Any, cast

import treq
import yaml
from twisted.internet import reactor, task, threads
from twisted.trial import unittest
from twisted.web.server import Site

from synapse_lite.config.homeserver import InstanceLocation
from synapse_lite.federation.crypto import SigningKey
from synapse_lite.http.server import make_site
from synapse_lite.server import HomeServer
from tests.harness.client_api import ClientApi
from tests.harness.databases import create_test_database
from tests.harness.polling import eventually
from tests.harness.processes import NO_KEEPALIVE, free_port
from tests.harness.server import make_config, make_homeserver
from tests.harness.synapse_install import SynapseUnavailable, install_synapse, installed_python
from tests.harness.tls import TestCA

_reactor = cast(Any, reactor)
#: What our server beside Synapse serves.
OUR_RESOURCES = ("client", "federation", "keys")
#: How long Synapse may take to create its database and answer.
START_TIMEOUT_SECONDS = 180


async def synapse_or_skip(testcase: unittest.TestCase) -> str:
    """The Synapse virtualenv's python, installing it first if needed (in a
    thread); skips the test when that fails, or fails it under CI=true."""
    python = installed_python()
    if python is not None:
        return python
    try:
        return await threads.deferToThread(install_synapse)
    except SynapseUnavailable as e:
        if os.environ.get("CI") == "true":
            testcase.fail(f"CI needs the Synapse peer: {e}")
        raise unittest.SkipTest(f"no Synapse peer: {e}") from e


async def sync_until(
    user: ClientApi, since: str, check: Any, what: str, timeout: float = 30
) -> None:
    """Poll ``user``'s /sync, each time from the last ``next_batch``
    (Synapse answers a repeated ``since`` from its cache for 2 minutes),
    until one answer passes ``check``."""
    position = [since]

    async def seen() -> bool:
        sync = await user.sync(since=position[0])
        position[0] = sync["next_batch"]
        return bool(check(sync))

    await eventually(seen, timeout=timeout, what=what)


class SynapsePeer:
    """One Synapse on 127.0.0.1: ``server_name`` is ``localhost:<port>`` with
    federation (and the client API) over HTTPS on that port, and the client
    API over plain HTTP at :attr:`client_url` for the test.

    Named ``localhost``, not ``127.0.0.1``: Synapse refuses to reach a server
    named by an IP literal in its block list even when ``ip_range_whitelist``
    allows it (docs/federation.md, "Synapse and the spec"), so peers on
    loopback must have host names."""

    def __init__(
        self,
        python: str,
        ca: TestCA,
        directory: str | None = None,
        extra_config: dict[str, Any] | None = None,
    ) -> None:
        """``extra_config``: settings added to (and overriding) the written
        config, e.g. a cheaper ``bcrypt_rounds`` for benchmarks."""
        self.python = python
        self.extra_config = extra_config or {}
        self.ca = ca
        self.directory = directory or tempfile.mkdtemp(prefix="synapse_peer_")
        self.port = free_port()
        self.client_port = free_port()
        self.server_name = f"localhost:{self.port}"
        self.client_url = f"http://127.0.0.1:{self.client_port}"
        self.federation_url = f"https://{self.server_name}"
        self.log_path = os.path.join(self.directory, "homeserver.log")
        self._process: subprocess.Popen[bytes] | None = None

    def write_config(self) -> str:
        d = self.directory
        certificate, key = self.ca.issue("synapse", ["localhost"])
        with open(os.path.join(d, "signing.key"), "w") as f:
            f.write(SigningKey.generate().to_line())
        log_config = {
            "version": 1,
            "formatters": {"plain": {"format": "%(asctime)s %(name)s %(levelname)s %(message)s"}},
            "handlers": {
                "file": {
                    "class": "logging.FileHandler",
                    "filename": self.log_path,
                    "formatter": "plain",
                }
            },
            "root": {"level": "INFO", "handlers": ["file"]},
            "disable_existing_loggers": False,
        }
        with open(os.path.join(d, "log.yaml"), "w") as f:
            yaml.safe_dump(log_config, f)
        unlimited = {"per_second": 1000, "burst_count": 1000}
        config: dict[str, Any] = {
            "server_name": self.server_name,
            "pid_file": os.path.join(d, "homeserver.pid"),
            "listeners": [
                {
                    "port": self.port,
                    "bind_addresses": ["127.0.0.1"],
                    "type": "http",
                    "tls": True,
                    "resources": [{"names": ["client", "federation"], "compress": False}],
                },
                {
                    "port": self.client_port,
                    "bind_addresses": ["127.0.0.1"],
                    "type": "http",
                    "tls": False,
                    "resources": [{"names": ["client"], "compress": False}],
                },
            ],
            "tls_certificate_path": certificate,
            "tls_private_key_path": key,
            "database": {"name": "sqlite3", "args": {"database": os.path.join(d, "hs.db")}},
            "log_config": os.path.join(d, "log.yaml"),
            "media_store_path": os.path.join(d, "media"),
            "signing_key_path": os.path.join(d, "signing.key"),
            "report_stats": False,
            "macaroon_secret_key": "peer-macaroon",
            "form_secret": "peer-form",
            "registration_shared_secret": "peer-registration",
            "enable_registration": True,
            "enable_registration_without_verification": True,
            # Its documented settings for a private federation on loopback.
            "trusted_key_servers": [],
            "suppress_key_server_warning": True,
            "federation_verify_certificates": True,
            "federation_custom_ca_list": [self.ca.ca_path],
            "ip_range_whitelist": ["127.0.0.0/8"],
            "rc_message": unlimited,
            "rc_registration": unlimited,
            "rc_login": {"address": unlimited, "account": unlimited, "failed_attempts": unlimited},
            "rc_federation": {"window_size": 1000, "sleep_limit": 1000, "reject_limit": 1000},
            "rc_joins": {"local": unlimited, "remote": unlimited},
            "rc_key_requests": unlimited,
            "presence": {"enabled": False},
            "url_preview_enabled": False,
        }
        config.update(self.extra_config)
        path = os.path.join(d, "homeserver.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(config, f)
        return path

    async def start(self, testcase: unittest.TestCase | None) -> None:
        """Start it and wait until its client API answers; stopped at the
        ``testcase``'s cleanup (with None, by :meth:`stop` or when this
        process exits)."""
        path = self.write_config()
        if testcase is not None:
            testcase.addCleanup(self.stop)
        else:
            atexit.register(self.stop)
        await self._launch(path)

    async def restart(self) -> None:
        """Start it again after :meth:`stop`, as it was: the same config,
        signing key, certificate, ports and database (a peer that went down
        and came back)."""
        await self._launch(os.path.join(self.directory, "homeserver.yaml"))

    async def _launch(self, path: str) -> None:
        log = open(os.path.join(self.directory, "stdout.log"), "ab")
        # Its own virtualenv only: trial's workers (-j) get a PYTHONPATH of
        # our environment, whose packages (txredisapi 1.6, ...) Synapse
        # refuses to start with.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self._process = subprocess.Popen(
            [self.python, "-m", "synapse.app.homeserver", "-c", path],
            cwd=self.directory,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while True:
            if self._process.poll() is not None:
                raise SynapseUnavailable(
                    f"Synapse exited with {self._process.returncode}: {self.last_words()}"
                )
            try:
                response = await treq.get(
                    self.client_url + "/_matrix/client/versions", pool=NO_KEEPALIVE, timeout=2
                )
                await treq.content(response)
                if response.code == 200:
                    return
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise SynapseUnavailable(f"Synapse did not answer: {self.last_words()}")
            await task.deferLater(reactor, 0.25, lambda: None)

    def last_words(self) -> str:
        text = ""
        for name in ("stdout.log", "homeserver.log"):
            try:
                with open(os.path.join(self.directory, name), errors="replace") as f:
                    text += f.read()[-1500:]
            except OSError:
                pass
        return text

    def log_size(self) -> int:
        """Where its log ends now (for :meth:`log_since`)."""
        try:
            return os.path.getsize(self.log_path)
        except OSError:
            return 0

    def log_since(self, offset: int) -> str:
        """Its log from byte ``offset`` (a :meth:`log_size`) on."""
        with open(self.log_path, errors="replace") as f:
            f.seek(offset)
            return f.read()

    def has_exited(self) -> bool:
        return self._process is None or self._process.poll() is not None

    def stop(self) -> None:
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_our_server(testcase: unittest.TestCase, ca: TestCA) -> tuple[HomeServer, str]:
    """:func:`start_our_server_listening` without its federation listener."""
    hs, url, _listener = start_our_server_listening(testcase, ca)
    return hs, url


def start_our_server_listening(
    testcase: unittest.TestCase, ca: TestCA
) -> tuple[HomeServer, str, ClosingTlsListener]:
    """One server of ours as Synapse's peer: named ``localhost:<port>`` (a
    host name, as Synapse needs, see :class:`SynapsePeer`), federation over
    HTTPS on that port with a certificate from ``ca`` (whose CA it trusts
    for Synapse's), loopback allowed; its client API over plain HTTP at the
    URL returned, and its federation listener (to stop and start again:
    down for Synapse, while the server itself keeps running)."""
    db = create_test_database(with_schema=True)
    testcase.addCleanup(db.drop)
    port = free_port()
    config = make_config(
        db,
        server_name=f"localhost:{port}",
        enable_registration=True,
        rate_limiting={"enabled": False},
        federation={
            "extra_ca_paths": [ca.ca_path],
            "ip_range_allowlist": ["127.0.0.0/8"],
            "retry": {"initial_seconds": 0.2, "max_seconds": 1},
        },
        resources=OUR_RESOURCES,
    )
    hs = make_homeserver(testcase, config)
    tree = hs.listeners.resources.tree(OUR_RESOURCES)
    site = make_site(tree, 1_048_576)
    listener = ClosingTlsListener(port, site, ca.server_options("ours", ["localhost"]))
    testcase.addCleanup(listener.stop)
    plain = _reactor.listenTCP(0, make_site(tree, 1_048_576), interface="127.0.0.1")
    testcase.addCleanup(plain.stopListening)
    number = plain.getHost().port
    hs.config.instance_map[hs.instance_name] = InstanceLocation("127.0.0.1", number)
    return hs, f"http://127.0.0.1:{number}", listener


def listen_tls_closing(port: int, site: Site, options: Any) -> Any:
    """Listen with TLS on loopback ``port``; return a coroutine function that
    stops listening and aborts every connection accepted, so that the shared
    Synapse, which outlives each test and keeps its connections alive, leaves
    none open behind a test (a second call does nothing)."""
    return ClosingTlsListener(port, site, options).stop


class ClosingTlsListener:
    """A TLS listener on loopback ``port`` that, stopped, also aborts every
    connection it accepted (a peer keeping connections alive sees the server
    gone, as when its process ends); it can listen again on the same port."""

    def __init__(self, port: int, site: Site, options: Any) -> None:
        self._port, self._site, self._options = port, site, options
        self._accepted: list[Any] = []
        build = site.buildProtocol

        def tracked(addr: Any) -> Any:
            protocol = build(addr)
            self._accepted.append(protocol)
            return protocol

        site.buildProtocol = tracked  # type: ignore[method-assign]
        self._listening: Any = None
        self.start()

    def start(self) -> None:
        """Listen (again); does nothing while listening."""
        if self._listening is None:
            self._listening = _reactor.listenSSL(
                self._port, self._site, self._options, interface="127.0.0.1"
            )

    async def stop(self) -> None:
        """Stop listening and abort the connections; does nothing when stopped."""
        listening, self._listening = self._listening, None
        if listening is None:
            return
        await listening.stopListening()
        accepted, self._accepted = self._accepted, []
        for protocol in accepted:
            # Site's protocol wraps the HTTP channel, which has the transport.
            transport = getattr(getattr(protocol, "_channel", None), "transport", None)
            # One already closed (by its client, or this test's other server
            # stopping first) has no TLS state left to abort.
            if transport is not None and getattr(transport, "connected", True):
                transport.abortConnection()
        await task.deferLater(_reactor, 0.05, lambda: None)
