"""Push rules (``/pushrules/``, ``/pushrules/global/{kind}/{ruleId}[/enabled|/actions]``)
``/notifications`` and ``/pushers``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.http.server import (
    JsonResource,
    parse_json_object_from_request,
    query_int,
    query_string,
)
from synapse_lite.push.pushers import PusherSet
from synapse_lite.push.rules import check_kind, check_scope
from synapse_lite.replication.http.writes import PushRuleEdit
from synapse_lite.rest.client._base import client_path

if TYPE_CHECKING:
    from synapse_lite.rest.client import ClientHandlers

#: Notifications per page of ``GET /notifications`` unless asked, and at most.
DEFAULT_NOTIFICATIONS = 20
MAX_NOTIFICATIONS = 100


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    auth = handlers.auth
    push_rules = handlers.push_rules

    async def get_all(request: Request) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        return 200, {"global": await push_rules.ruleset(requester.user_id)}

    async def get_scope(request: Request, scope: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        check_scope(scope)
        return 200, await push_rules.ruleset(requester.user_id)

    async def get_kind(request: Request, scope: str, kind: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        check_scope(scope)
        check_kind(kind)
        return 200, (await push_rules.ruleset(requester.user_id))[kind]

    async def get_rule(request: Request, scope: str, kind: str, rule_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        check_scope(scope)
        return 200, await push_rules.get_rule(requester.user_id, kind, rule_id)

    async def put_rule(request: Request, scope: str, kind: str, rule_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        check_scope(scope)
        body = parse_json_object_from_request(request)
        before, after = query_string(request, "before"), query_string(request, "after")
        await push_rules.edit(
            PushRuleEdit(requester.user_id, "put", kind, rule_id, body, before, after)
        )
        return 200, {}

    async def delete_rule(request: Request, scope: str, kind: str, rule_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        check_scope(scope)
        await push_rules.edit(PushRuleEdit(requester.user_id, "delete", kind, rule_id, {}))
        return 200, {}

    def attribute_servlets(field: str) -> tuple[Any, Any]:
        async def get_attribute(
            request: Request, scope: str, kind: str, rule_id: str
        ) -> tuple[int, Any]:
            requester = await auth.get_user_by_req(request)
            check_scope(scope)
            rule = await push_rules.get_rule(requester.user_id, kind, rule_id)
            return 200, {field: rule[field]}

        async def put_attribute(
            request: Request, scope: str, kind: str, rule_id: str
        ) -> tuple[int, Any]:
            requester = await auth.get_user_by_req(request)
            check_scope(scope)
            body = parse_json_object_from_request(request)
            if field not in body:
                raise SynapseError(400, f"Missing '{field}'", Codes.MISSING_PARAM)
            await push_rules.edit(
                PushRuleEdit(requester.user_id, field, kind, rule_id, {"value": body[field]})
            )
            return 200, {}

        return get_attribute, put_attribute

    async def get_notifications(request: Request) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        token = query_string(request, "from")
        before = None
        if token is not None:
            if not token.isascii() or not token.isdigit() or len(token) > 18:
                raise SynapseError(400, "'from' is not a token we gave", Codes.INVALID_PARAM)
            before = int(token)
        limit = query_int(request, "limit", DEFAULT_NOTIFICATIONS, minimum=1)
        assert limit is not None
        only = query_string(request, "only")
        if only not in (None, "highlight"):
            raise SynapseError(400, "'only' may only be 'highlight'", Codes.INVALID_PARAM)
        return 200, await push_rules.notifications(
            requester.user_id,
            before,
            min(limit, MAX_NOTIFICATIONS),
            only == "highlight",
            handlers.clock.time_msec(),
        )

    async def get_pushers(request: Request) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        return 200, {"pushers": await push_rules.get_pushers(requester.user_id)}

    async def set_pusher(request: Request) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        body = parse_json_object_from_request(request)
        await push_rules.set_pusher(
            PusherSet.from_client(requester.user_id, body, requester.device_id)
        )
        return 200, {}

    async def incomplete_path(request: Request, **parts: str) -> tuple[int, Any]:
        """A /pushrules path missing a part (or naming an attribute that is
        not ``enabled`` or ``actions``): 400, saying what the path lacks.
        Only ``GET /pushrules/`` (with its slash) is the whole ruleset."""
        await auth.get_user_by_req(request)
        if "scope" in parts:
            check_scope(parts["scope"])
        if "kind" in parts:
            check_kind(parts["kind"])
        if "attribute" in parts:
            raise SynapseError(
                400,
                f"Unknown push rule attribute {parts['attribute']!r}: 'enabled' or 'actions'",
                Codes.INVALID_PARAM,
            )
        if request.method == b"GET":
            raise SynapseError(
                400,
                "Paths to a push rule scope or kind end with '/': /pushrules/global/{kind}/",
                Codes.INVALID_PARAM,
            )
        raise SynapseError(
            400, "Push rules are at /pushrules/global/{kind}/{ruleId}", Codes.INVALID_PARAM
        )

    register = resource.register_paths
    register("GET", client_path("/notifications"), get_notifications, "notifications")
    register("GET", client_path("/pushers"), get_pushers, "pushers")
    register("POST", client_path("/pushers/set"), set_pusher, "pushers")
    scope = "/pushrules/(?P<scope>[^/]+)"
    kind = scope + "/(?P<kind>[^/]+)"
    rule = client_path(kind + "/(?P<rule_id>[^/]+)")
    # The spec's paths to the whole ruleset, a scope and a kind end in a
    # slash; without it they are not these reads (SyTest checks so too).
    register("GET", client_path("/pushrules/"), get_all, "push_rules")
    register("GET", client_path(scope + "/"), get_scope, "push_rules")
    register("GET", client_path(kind + "/"), get_kind, "push_rules")
    register("GET", rule, get_rule, "push_rules")
    register("PUT", rule, put_rule, "push_rules")
    register("DELETE", rule, delete_rule, "push_rules")
    for field in ("enabled", "actions"):
        get_attribute, put_attribute = attribute_servlets(field)
        register("GET", rule + "/" + field, get_attribute, "push_rules")
        register("PUT", rule + "/" + field, put_attribute, "push_rules")
    # Paths short of a rule, or past one: 400 naming what is wrong (matched
    # after the paths above, so only what they leave).
    for method in ("GET", "PUT", "DELETE"):
        if method != "GET":
            register(method, client_path("/pushrules/"), incomplete_path, "push_rules")
            register(method, client_path(scope + "/"), incomplete_path, "push_rules")
            register(method, client_path(kind + "/"), incomplete_path, "push_rules")
        register(method, client_path(scope), incomplete_path, "push_rules")
        register(method, client_path(kind), incomplete_path, "push_rules")
        if method != "DELETE":
            register(method, rule + "/(?P<attribute>[^/]+)", incomplete_path, "push_rules")
