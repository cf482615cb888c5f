"""Push rules: ``/pushrules/`` and ``/pushrules/global/{kind}/{ruleId}[/enabled|/actions]``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.http.server import (
    JsonResource,
    parse_json_object_from_request,
    query_string,
)
from synapse_lite.push.rules import check_kind, check_scope
from synapse_lite.replication.http.writes import PushRuleEdit
from synapse_lite.rest.client._base import client_path

if TYPE_CHECKING:
    from synapse_lite.rest.client import ClientHandlers


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

    register = resource.register_paths
    scope = "/pushrules/(?P<scope>[^/]+)"
    rule = client_path(scope + "/(?P<kind>[^/]+)/(?P<rule_id>[^/]+)")
    register("GET", client_path("/pushrules/?"), get_all, "push_rules")
    register("GET", client_path(scope + "/?"), get_scope, "push_rules")
    register("GET", client_path(scope + "/(?P<kind>[^/]+)/?"), get_kind, "push_rules")
    register("GET", rule, get_rule, "push_rules")
    register("PUT", rule, put_rule, "push_rules")
    register("DELETE", rule, delete_rule, "push_rules")
    for field in ("enabled", "actions"):
        get_attribute, put_attribute = attribute_servlets(field)
        register("GET", rule + "/" + field, get_attribute, "push_rules")
        register("PUT", rule + "/" + field, put_attribute, "push_rules")
