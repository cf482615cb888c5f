"""The admin API's event reports: ``GET /v1/event_reports`` and
``GET/DELETE /v1/event_reports/{reportId}``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.http.server import JsonResource, query_int, query_string
from synapse_lite.rest.admin._base import MAX_PAGE, admin_path, query_choice

if TYPE_CHECKING:
    from synapse_lite.rest.client import ClientHandlers

REPORT = "/event_reports/(?P<report_id>[^/]+)"


def _report_id(text: str) -> int:
    if not text.isascii() or not text.isdigit() or len(text) > 18:
        raise SynapseError(400, "The report id must be an integer", Codes.INVALID_PARAM)
    return int(text)


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    admin = handlers.admin
    reports = handlers.admin_reports

    async def list_reports(request: Request) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        offset = query_int(request, "from", 0)
        limit = query_int(request, "limit", 100, minimum=1, maximum=MAX_PAGE)
        assert offset is not None and limit is not None
        # Newest first unless asked otherwise (as the reference does).
        descending = query_choice(request, "dir", ("f", "b"), "b") == "b"
        return 200, await reports.list_reports(
            offset,
            limit,
            descending,
            query_string(request, "user_id"),
            query_string(request, "room_id"),
        )

    async def get_report(request: Request, report_id: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        return 200, await reports.get_report(_report_id(report_id))

    async def delete_report(request: Request, report_id: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        await reports.delete_report(requester, _report_id(report_id))
        return 200, {}

    resource.register_paths(
        "GET", admin_path("v1", "/event_reports"), list_reports, "admin_event_reports"
    )
    resource.register_paths("GET", admin_path("v1", REPORT), get_report, "admin_event_report")
    resource.register_paths("DELETE", admin_path("v1", REPORT), delete_report, "admin_event_report")
