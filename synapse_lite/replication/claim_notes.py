"""Signed notes that give Redis the TCP layout's single sequence read (issue 35).

A claimed position beyond what a process has read of the stream's sequence
makes it read the sequence (``claims.py``). Over TCP only the main process
reads: it checks every claim before relaying it, so the connection to it
vouches. Over Redis every process hears the writer directly, so every
process used to read the sequence for every new position: at one event per
wake-up, one read per event per process.

Now the main process, which checks every claim over Redis anyway, publishes
what each of its sequence reads returned: ``CHECKED <stream> <allocated>
<key id> <signature>`` on the stream's channel. The others wait a moment for a
note covering a claim instead of reading themselves:

* **Only the main process can sign one.** Every process holds the Redis
  secret, so a note under that MAC alone could come from any of them. The
  main process makes an ed25519 key as it starts, keeps the private half in
  memory and records the public half in the database (``claim_note_key``);
  the others read it from there when a note names a key they do not have.
  Whoever could change that row could as well move the sequences the notes
  speak of: the check is as strong as reading the sequence oneself.
* **A note is true for ever.** A sequence only grows, so "it had handed out
  N" stays true; the signature covers the deployment, the stream and N, so a
  note is never taken on another deployment.
* **Waiting is bounded.** A claim not covered within ``claims.NOTE_WAIT_SECONDS``
  (the main process is down, slow, or believed the claim without a read
  this process missed) is checked by reading the sequence, as before, and
  the stream's later claims are read for at once until the next note
  arrives. The main process's own claims come with a note too, published
  right after them (``ReplicationStreamer``'s ``vouch``): every position it
  claims it allocated itself or believed after a check.
* A note that does not verify (unknown key after a reload, bad signature) is
  refused, counted (``synapse_lite_replication_claims_refused_total``,
  ``reason="bad_note"``) and logged at most once per 10 s.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey
from twisted.internet import defer

from synapse_lite.clock import Clock
from synapse_lite.federation.crypto import decode_base64, encode_base64
from synapse_lite.replication.claims import RefusalLog, shorten
from synapse_lite.replication.tcp.commands import CheckedCommand, checked_message

logger = logging.getLogger(__name__)

#: A note naming a key this process does not have makes it read the
#: recorded key again, at most this often: soon after the main process
#: restarts with a new key, and one small read a second at worst for a
#: flood of made-up key ids.
KEY_RELOAD_INTERVAL_SECONDS = 1.0

#: The refusal reason of a note that does not verify.
BAD_NOTE = "bad_note"

#: Reads the recorded key: ``(signer's instance name, verify key)`` or None.
LoadKey = Callable[[], Awaitable[tuple[str, str] | None]]


def key_id(verify_key: bytes) -> str:
    """A short name for a verify key (notes carry it, not the key)."""
    return encode_base64(hashlib.sha256(verify_key).digest()[:6])


class ClaimNoteSigner:
    """The main process's half: a key made afresh at every start."""

    def __init__(self, deployment_id: str, signing_key: SigningKey | None = None) -> None:
        self._deployment_id = deployment_id
        self._key = signing_key or SigningKey.generate()
        raw = bytes(self._key.verify_key)
        #: What the database records (unpadded base64).
        self.verify_key = encode_base64(raw)
        self.key_id = key_id(raw)

    def note(self, stream_name: str, allocated: int) -> CheckedCommand:
        """The note that ``stream_name``'s sequence had handed out
        ``allocated`` (a value just read from it, or a position this process
        claims: it allocated it, or believed it after a check)."""
        message = checked_message(self._deployment_id, stream_name, allocated)
        signature = encode_base64(self._key.sign(message).signature)
        return CheckedCommand(stream_name, allocated, self.key_id, signature)


class ClaimNoteVerifier:
    """A follower's half: which notes the main process really signed."""

    def __init__(self, deployment_id: str, load_key: LoadKey, clock: Clock) -> None:
        """``load_key``: reads the recorded key."""
        self._deployment_id = deployment_id
        self._load_key = load_key
        self._clock = clock
        self._key: VerifyKey | None = None
        self._key_id: str | None = None
        #: A read of the recorded key is under way; who waits for it.
        self._loading = False
        self._waiters: list[Callable[[], None]] = []
        self._last_load: float | None = None
        self.refusals = RefusalLog(clock.time)

    def verify(self, cmd: CheckedCommand, sender: str) -> bool | defer.Deferred[bool]:
        """Whether the main process signed ``cmd``: at once when its key is
        the one this process has, else after reading the recorded key (at
        most once per :data:`KEY_RELOAD_INTERVAL_SECONDS`). Refusals are
        logged and counted here."""
        if cmd.key_id == self._key_id:
            return self._verified(cmd, sender)
        start = not self._loading
        if start:
            now = self._clock.time()
            if self._last_load is not None and now - self._last_load < KEY_RELOAD_INTERVAL_SECONDS:
                return self._refuse(cmd, sender, "signed with a key the database does not record")
            self._last_load = now
            self._loading = True
        result: defer.Deferred[bool] = defer.Deferred()

        def loaded() -> None:
            if cmd.key_id != self._key_id:
                why = "signed with a key the database does not record"
                result.callback(self._refuse(cmd, sender, why))
            else:
                result.callback(self._verified(cmd, sender))

        self._waiters.append(loaded)
        if start:
            defer.ensureDeferred(self._reload())
        return result

    async def _reload(self) -> None:
        try:
            recorded = await self._load_key()
        except Exception as e:
            logger.warning("Reading the main process's note key failed: %s", e)
            recorded = None
        if recorded is not None:
            _, text = recorded
            try:
                raw = decode_base64(text)
                self._key, self._key_id = VerifyKey(raw), key_id(raw)
            except Exception as e:
                logger.warning("The recorded note key is not an ed25519 key: %s", e)
        self._loading = False
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter()

    def _verified(self, cmd: CheckedCommand, sender: str) -> bool:
        assert self._key is not None
        try:
            self._key.verify(
                checked_message(self._deployment_id, cmd.stream_name, cmd.allocated),
                decode_base64(cmd.signature),
            )
        except (BadSignatureError, ValueError):
            return self._refuse(cmd, sender, "its signature does not verify")
        return True

    def _refuse(self, cmd: CheckedCommand, sender: str, why: str) -> bool:
        self.refusals.refuse(
            BAD_NOTE,
            cmd.stream_name,
            sender,
            f"CHECKED {shorten(cmd.stream_name)} {cmd.allocated} {shorten(cmd.key_id)}: {why}",
        )
        return False
