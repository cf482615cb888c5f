"""Prometheus metrics of every process, declared in one place.

Label values are bounded: transaction and endpoint names come from code, stream
and writer names from config.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

TRANSACTION_DURATION = Histogram(
    "synapse_lite_db_transaction_seconds",
    "Time taken by database transactions, by transaction name",
    ["desc"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
TRANSACTION_IN_DOUBT = Counter(
    "synapse_lite_db_transactions_in_doubt_total",
    "Transactions whose connection broke during COMMIT and that were not retried (answered"
    " 503), by name",
    ["desc"],
)
TRANSACTION_RETRIES = Counter(
    "synapse_lite_db_transaction_retries_total",
    "Transactions retried after a serialization failure, deadlock or busy database",
    ["desc"],
)
GROUP_COMMIT_SIZE = Histogram(
    "synapse_lite_db_group_commit_size",
    "Writes committed in one transaction by a group commit (storage/group_commit.py)",
    ["desc"],
    buckets=(1, 2, 3, 4, 6, 8, 16, 32),
)
GROUP_COMMIT_FALLBACKS = Counter(
    "synapse_lite_db_group_commit_fallbacks_total",
    "Group commits that failed and were run again one write per transaction",
    ["desc"],
)
STREAM_POSITION = Gauge(
    "synapse_lite_stream_position",
    "Position of a writer of a stream, as this process knows it",
    ["stream", "writer"],
)
STREAM_PERSISTED_UPTO = Gauge(
    "synapse_lite_stream_persisted_upto",
    "Largest id of a stream below which every id has finished, as this process knows it",
    ["stream"],
)
REPLICATION_LAG = Gauge(
    "synapse_lite_replication_lag_ids",
    "How far this process's view of a writer trails the newest position the writer announced",
    ["stream", "writer"],
)
REPLICATION_LAG_SECONDS = Gauge(
    "synapse_lite_replication_lag_seconds",
    "How long this process's view of a writer has trailed the newest position the writer"
    " announced (0 when caught up)",
    ["stream", "writer"],
)
STREAM_ANNOUNCED_POSITION = Gauge(
    "synapse_lite_stream_announced_position",
    "The newest position this process has heard a writer announce (RDATA or POSITION)",
    ["stream", "writer"],
)
STREAM_STALLED_SECONDS = Gauge(
    "synapse_lite_stream_stalled_seconds",
    "How long a stream's persisted-up-to has stood still with work above it, held by a writer"
    " (0: not stalled)",
    ["stream", "writer"],
)
REVOCATIONS_UNCONFIRMED = Counter(
    "synapse_lite_revocations_unconfirmed_total",
    "Revocations answered before a process confirmed it had applied them",
    ["instance"],
)
REPLICATION_COMMANDS_IN = Counter(
    "synapse_lite_replication_commands_received_total",
    "Replication commands received, by command name",
    ["command"],
)
REPLICATION_COMMANDS_OUT = Counter(
    "synapse_lite_replication_commands_sent_total",
    "Replication commands sent, by command name",
    ["command"],
)
REPLICATION_BAD_LINES = Counter(
    "synapse_lite_replication_bad_lines_total",
    "Replication lines that could not be parsed, by transport",
    ["transport"],
)
_COMMAND_COUNTERS: dict[tuple[int, str], Counter] = {}


def count_command(counter: Counter, name: str, amount: int = 1) -> None:
    """``counter.labels(name).inc(amount)`` for :data:`REPLICATION_COMMANDS_IN`
    or ``_OUT``, the child looked up once per command name: every process
    does this for every line (a label lookup per line was a measurable share
    of a follower's CPU, issue 18). Command names are a fixed set."""
    key = (id(counter), name)
    child = _COMMAND_COUNTERS.get(key)
    if child is None:
        child = _COMMAND_COUNTERS[key] = counter.labels(name)
    child.inc(amount)


REPLICATION_COMMANDS_DROPPED = Counter(
    "synapse_lite_replication_commands_dropped_total",
    "Replication commands not sent, by transport and reason (overflow, unencodable, ...)",
    ["transport", "reason"],
)
REPLICATION_CLAIMS_REFUSED = Counter(
    "synapse_lite_replication_claims_refused_total",
    "POSITION and RDATA claims from peers that were not believed, by stream and reason"
    " (unknown_stream, unknown_writer, out_of_range, not_allocated, wrong_sender,"
    " went_backwards, duplicate_name, bad_mac)",
    ["stream", "reason"],
)
HTTP_REQUESTS = Counter(
    "synapse_lite_http_requests_total",
    "HTTP requests served, by servlet and response code",
    ["servlet", "method", "code"],
)
HTTP_REQUEST_DURATION = Histogram(
    "synapse_lite_http_request_seconds",
    "Time taken to answer HTTP requests, by servlet",
    ["servlet", "method"],
)
INTERNAL_CALLS = Counter(
    "synapse_lite_internal_calls_total",
    "Internal calls made to another process, by call, target and outcome (ok, refused: the"
    " other side said no; unreachable)",
    ["call", "target", "outcome"],
)
INTERNAL_CALL_SECONDS = Histogram(
    "synapse_lite_internal_call_seconds",
    "Time taken by internal calls to another process (replication waits excluded), by call",
    ["call"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
OPEN_SYNC_REQUESTS = Gauge(
    "synapse_lite_open_sync_requests",
    "/sync requests currently waiting or being answered",
)
FEDERATION_TRANSACTIONS_SENT = Counter(
    "synapse_lite_federation_transactions_sent_total",
    "Transactions sent to other servers, by outcome (accepted, failed, refused)",
    ["outcome"],
)
FEDERATION_EDUS_SENT = Counter(
    "synapse_lite_federation_edus_sent_total",
    "EDUs other servers accepted from us",
)
FEDERATION_PDUS_SENT = Counter(
    "synapse_lite_federation_pdus_sent_total",
    "PDUs (room events) other servers accepted from us in transactions",
)
FEDERATION_TRANSACTIONS_RECEIVED = Counter(
    "synapse_lite_federation_transactions_received_total",
    "Transactions received from other servers, by outcome (new, replayed)",
    ["outcome"],
)
FEDERATION_REQUESTS_REFUSED = Counter(
    "synapse_lite_federation_requests_refused_total",
    "Federation requests refused for a missing or bad X-Matrix signature",
)
FEDERATION_DESTINATIONS_DOWN = Gauge(
    "synapse_lite_federation_destinations_down",
    "Destinations this federation sender counts as down",
)

# Per destination (federation/sender/destination.py). Destinations are other
# servers' names: the sender only keeps series for destinations it has sent
# to or has work for.
FEDERATION_DESTINATION_PENDING_PDUS = Gauge(
    "synapse_lite_federation_destination_pending_pdus",
    "Room events waiting for a destination (in memory; while catching up, the rooms behind"
    " seen by the last read, at most 50)",
    ["destination"],
)
FEDERATION_DESTINATION_PENDING_EDUS = Gauge(
    "synapse_lite_federation_destination_pending_edus",
    "EDUs waiting for a destination, as the last read of its outbox saw them (at most 100)",
    ["destination"],
)
FEDERATION_DESTINATION_BACKOFF_SECONDS = Gauge(
    "synapse_lite_federation_destination_backoff_seconds",
    "The current retry interval towards a destination (0: it is up)",
    ["destination"],
)
FEDERATION_DESTINATION_CATCHING_UP = Gauge(
    "synapse_lite_federation_destination_catching_up",
    "1 while a destination is sent the newest event of each room it is behind in",
    ["destination"],
)
FEDERATION_DESTINATION_LAST_SUCCESS = Gauge(
    "synapse_lite_federation_destination_last_success_timestamp_seconds",
    "When a destination last accepted a transaction (Unix time)",
    ["destination"],
)
FEDERATION_DESTINATION_TRANSACTION_SECONDS = Gauge(
    "synapse_lite_federation_destination_last_transaction_seconds",
    "How long a destination took to answer its last transaction",
    ["destination"],
)
FEDERATION_TRANSACTION_SECONDS = Histogram(
    "synapse_lite_federation_transaction_seconds",
    "How long other servers took to answer our transactions (all destinations)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)

# The router (synapse_lite/routing/)

ROUTER_REQUESTS = Counter(
    "synapse_lite_router_requests_total",
    "Requests the router answered, by route (the role serving it) and status code",
    ["route", "code"],
)
ROUTER_RESPONSE_SECONDS = Histogram(
    "synapse_lite_router_response_seconds",
    "Time from a request's head reaching the router to the response's head leaving it",
    ["route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
ROUTER_BACKEND_UP = Gauge(
    "synapse_lite_router_backend_up",
    "Whether the router counts a process as up (1) or down (0)",
    ["backend"],
)
ROUTER_RETRIES = Counter(
    "synapse_lite_router_retries_total",
    "Requests the router sent again to another process, by reason",
    ["reason"],
)
ROUTER_OPEN_REQUESTS = Gauge(
    "synapse_lite_router_open_requests",
    "Requests the router is relaying now (long-polls included)",
)
