"""Push rules (read anywhere, edited by the push_rules writer), a user's
notifications, and pushers (written by the pushers writer)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from twisted.internet import defer

from synapse_lite.push.pushers import PusherSet
from synapse_lite.push.rules import UserPushRules, check_kind, check_rule_id
from synapse_lite.replication.http.devices import DevicesLogout
from synapse_lite.replication.http.writes import (
    EDIT_PUSH_RULES,
    SET_PUSHER,
    PushRuleEdit,
    StreamWritten,
)

if TYPE_CHECKING:
    from synapse_lite.events import Event
    from synapse_lite.notifier import Notifier
    from synapse_lite.replication.http.calls import InternalCalls
    from synapse_lite.storage.databases.main.push_rules import NotificationRow


class PushRulesHandlerStore(Protocol):
    """The store reads of :class:`PushRulesHandler`."""

    async def delete_pushers_of_devices(
        self, user_id: str, device_ids: list[str] | None
    ) -> int: ...

    async def get_events(self, event_ids: Iterable[str]) -> dict[str, Event]: ...

    async def get_notifications(
        self,
        user_id: str,
        before: int | None,
        limit: int,
        only_highlight: bool,
        after: int | None = None,
    ) -> list[NotificationRow]: ...

    async def get_push_rules_doc(self, user_id: str) -> UserPushRules: ...

    async def get_pushers_for_user(self, user_id: str) -> list[dict[str, Any]]: ...

    async def get_read_positions(self, user_id: str, room_ids: list[str]) -> dict[str, int]: ...

    async def set_pusher(self, pusher: PusherSet) -> int: ...

    async def update_push_rules(
        self, user_id: str, edit: Callable[[UserPushRules], None]
    ) -> int: ...


class PushRulesHandler:
    """``/pushrules/...``: the ruleset a user sees, and edits carried to the
    push_rules writer, which applies them one at a time per user."""

    def __init__(
        self, store: PushRulesHandlerStore, notifier: Notifier, calls: InternalCalls
    ) -> None:
        self._store = store
        self._notifier = notifier
        self._calls = calls
        #: One edit at a time per user on the writer: an edit reads the
        #: document and writes it back.
        self._locks: dict[str, defer.DeferredLock] = defaultdict(defer.DeferredLock)

    async def ruleset(self, user_id: str) -> dict[str, list[dict[str, Any]]]:
        """The user's rules by kind, in priority order (the spec's ``Ruleset``)."""
        doc = await self._store.get_push_rules_doc(user_id)
        return doc.ruleset(user_id)

    async def get_rule(self, user_id: str, kind: str, rule_id: str) -> dict[str, Any]:
        check_kind(kind)
        doc = await self._store.get_push_rules_doc(user_id)
        return doc.find(user_id, kind, rule_id)

    async def notifications(
        self, user_id: str, before: int | None, limit: int, only_highlight: bool, now_ms: int
    ) -> dict[str, Any]:
        """``GET /notifications``: newest first, ``before`` a stream ordering
        (the previous page's ``next_token``)."""
        rows = await self._store.get_notifications(user_id, before, limit, only_highlight)
        events = await self._store.get_events([r[0] for r in rows])
        read = await self._store.get_read_positions(user_id, sorted({r[1] for r in rows}))
        notifications = []
        for event_id, room_id, ordering, actions, _, ts in rows:
            event = events.get(event_id)
            if event is None or not event.served:
                continue
            notifications.append(
                {
                    "actions": actions,
                    "event": event.to_client_dict(now_ms, include_room_id=True),
                    # Rules are global since profiles went from the spec: no
                    # rule has a tag. Present (SyTest, and clients of the
                    # reference server, expect the key), and a string as the
                    # spec's schema says.
                    "profile_tag": "",
                    "read": ordering <= read.get(room_id, 0),
                    "room_id": room_id,
                    "ts": ts,
                }
            )
        answer: dict[str, Any] = {"notifications": notifications}
        if len(rows) >= limit and rows:
            answer["next_token"] = str(rows[-1][2])
        return answer

    async def edit(self, edit: PushRuleEdit) -> None:
        """Check what can be checked here, then have the writer apply it."""
        check_kind(edit.kind)
        check_rule_id(edit.kind, edit.rule_id)
        await self._calls.call(EDIT_PUSH_RULES, edit)

    async def write_edit(self, edit: PushRuleEdit) -> StreamWritten:
        """Serves :data:`EDIT_PUSH_RULES`: apply the edit (refused edits store
        nothing) and wake the user's syncs."""
        check_kind(edit.kind)
        check_rule_id(edit.kind, edit.rule_id)
        user_id = edit.user_id

        def apply(rules: UserPushRules) -> None:
            if edit.op == "put":
                rules.put_rule(edit.kind, edit.rule_id, edit.body, edit.before, edit.after)
            elif edit.op == "delete":
                rules.delete_rule(user_id, edit.kind, edit.rule_id)
            elif edit.op == "enabled":
                rules.set_enabled(user_id, edit.kind, edit.rule_id, edit.body.get("value"))
            else:
                rules.set_actions(user_id, edit.kind, edit.rule_id, edit.body.get("value"))

        async with self._locks[user_id]:
            stream_id = await self._store.update_push_rules(user_id, apply)
        if not self._locks[user_id].locked:
            del self._locks[user_id]
        self._notifier.notify(users=[user_id])
        return StreamWritten(stream_id)

    # Pushers (on the pushers stream; delivered by ``pusher_delivery``)

    async def get_pushers(self, user_id: str) -> list[dict[str, Any]]:
        return await self._store.get_pushers_for_user(user_id)

    async def set_pusher(self, pusher: PusherSet) -> None:
        await self._calls.call(SET_PUSHER, pusher)

    async def write_pusher(self, pusher: PusherSet) -> StreamWritten:
        """Serves :data:`SET_PUSHER` on the pushers writer."""
        return StreamWritten(await self._store.set_pusher(pusher))

    async def remove_device_pushers(self, logout: DevicesLogout) -> StreamWritten:
        """Serves :data:`REMOVE_DEVICE_PUSHERS` on the pushers writer."""
        return StreamWritten(
            await self._store.delete_pushers_of_devices(logout.user_id, logout.device_ids)
        )
