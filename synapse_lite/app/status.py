"""``synapse-lite status``: each process of a config, its pid, whether it
answers /health (and why it is degraded, if it says so), and the position of
each stream it writes (read from its Prometheus /metrics:
``synapse_lite_stream_position{stream, writer}``). The federation roles:
which processes are readers and senders, and for each sender how many
destinations it owns and which are stalled (from its /health)."""

from __future__ import annotations

import json
from typing import Any, TextIO

import attr
from prometheus_client.parser import text_string_to_metric_families

from synapse_lite.app.admin_client import AdminRequestError, http_request
from synapse_lite.app.launch_plan import ProcessSpec, plan_processes
from synapse_lite.app.pid_files import LAUNCHER, pid_alive, pid_file_path, read_pid_file
from synapse_lite.config.homeserver import HomeServerConfig

#: Seconds to wait for a process to answer.
STATUS_TIMEOUT_SECONDS = 2.0


@attr.s(slots=True, auto_attribs=True)
class ProcessStatus:
    name: str
    role: str
    pid: int | None
    alive: bool
    health: str
    positions: dict[str, int] | None
    #: Why /health says "degraded", if it does.
    reasons: list[str] = attr.ib(factory=list)
    #: A federation sender's /health ``federation_sender`` part.
    federation_sender: dict[str, Any] | None = None

    @property
    def healthy(self) -> bool:
        return self.alive and self.health == "ok"


def parse_positions(metrics_text: str, writer: str) -> dict[str, int]:
    """``{stream: position}`` of ``writer`` in a /metrics page."""
    positions: dict[str, int] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != "synapse_lite_stream_position":
            continue
        for sample in family.samples:
            if sample.labels.get("writer") == writer:
                positions[sample.labels["stream"]] = int(sample.value)
    return positions


async def process_status(
    reactor: Any, config: HomeServerConfig, spec: ProcessSpec
) -> ProcessStatus:
    pid = read_pid_file(pid_file_path(config.data_dir, spec.name))
    status = ProcessStatus(spec.name, spec.role, pid, pid_alive(pid), "-", None)
    try:
        url = spec.health_url
    except KeyError:
        status.health = "no health listener"
        return status
    try:
        code, body = await http_request(reactor, "GET", url, timeout=STATUS_TIMEOUT_SECONDS)
        status.health = "ok" if code == 200 else f"HTTP {code}"
        answer = _json_object(body)
        if code == 200 and answer.get("status") == "degraded":
            status.health = "degraded"
            status.reasons = [str(r) for r in answer.get("reasons", [])]
        sender = answer.get("federation_sender")
        if isinstance(sender, dict):
            status.federation_sender = sender
    except AdminRequestError:
        status.health = "no answer"
        return status
    metrics_url = spec.metrics_url
    if metrics_url is not None:
        try:
            code, content = await http_request(
                reactor, "GET", metrics_url, timeout=STATUS_TIMEOUT_SECONDS
            )
            if code == 200:
                written = parse_positions(content.decode("utf-8", "replace"), spec.name)
                status.positions = {s: written[s] for s in spec.streams if s in written}
        except AdminRequestError:
            pass
    return status


def describe_sender(sender: dict[str, Any]) -> str:
    """One line on a sender's destinations, from its /health."""
    stalled = sender.get("stalled")
    stalled = stalled if isinstance(stalled, list) else []
    names = [str(s.get("destination")) for s in stalled if isinstance(s, dict)]
    line = (
        f"federation sender: {sender.get('destinations', '?')} destination(s),"
        f" {sender.get('active', '?')} with work this run, {len(names)} stalled"
    )
    if names:
        line += ": " + ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")
    return line


def federation_roles(statuses: list[ProcessStatus]) -> str:
    """``federation: readers ...; senders ...`` of the processes."""
    readers = [s.name for s in statuses if "federation reader" in s.role]
    senders = [
        s.name for s in statuses if "federation sender" in s.role or s.federation_sender is not None
    ]
    return (
        f"federation: readers {', '.join(readers) or '(none: the main process serves it)'};"
        f" senders {', '.join(senders) or '-'}"
    )


def format_status(config: HomeServerConfig, statuses: list[ProcessStatus]) -> list[str]:
    launcher_pid = read_pid_file(pid_file_path(config.data_dir, LAUNCHER))
    if pid_alive(launcher_pid):
        launcher = f"synapse-lite run: pid {launcher_pid}"
    else:
        launcher = "synapse-lite run: not running"
    lines = [f"{launcher} ({config.config_files[0]})"]
    lines.append(
        f"{'NAME':<16} {'PID':>7}  {'STATE':<8} {'HEALTH':<10} POSITIONS (streams written)"
    )
    for s in statuses:
        pid = str(s.pid) if s.pid is not None and s.alive else "-"
        state = "running" if s.alive else "stopped"
        if s.positions is None:
            positions = "-" if not s.healthy else "(no metrics listener)"
        else:
            positions = " ".join(f"{k}={v}" for k, v in s.positions.items())
        lines.append(f"{s.name:<16} {pid:>7}  {state:<8} {s.health:<10} {positions}")
        lines += [f"{'':<16} {'':>7}  {s.name} is degraded: {reason}" for reason in s.reasons]
        if s.federation_sender is not None:
            lines.append(f"{'':<16} {'':>7}  {describe_sender(s.federation_sender)}")
    lines.append(federation_roles(statuses))
    return lines


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


async def show_status(reactor: Any, config: HomeServerConfig, out: TextIO) -> int:
    """Print the status of every process; 0 if all are healthy, else 1."""
    from twisted.internet import defer

    specs = plan_processes(config, for_running=False)
    statuses = await defer.gatherResults(
        [defer.ensureDeferred(process_status(reactor, config, spec)) for spec in specs]
    )
    for line in format_status(config, statuses):
        out.write(line + "\n")
    return 0 if all(s.healthy for s in statuses) else 1
