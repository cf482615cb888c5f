"""The ``stream_runs`` table: which run of its writer a stream kept in memory
is on (see ``handlers/typing.py`` for why the typing stream needs one)."""

from __future__ import annotations

from synapse_lite.storage.database import LoggingTransaction


def take_next_stream_run_txn(txn: LoggingTransaction, stream_name: str) -> int:
    """Count one more start of ``stream_name``'s writer and return its run
    number: 1 the first time, then one more than any run taken before (on the
    startup connection, before the writer hands out a position)."""
    txn.execute(
        "INSERT INTO stream_runs (stream_name, run) VALUES (?, 1)"
        " ON CONFLICT (stream_name) DO UPDATE SET run = stream_runs.run + 1",
        (stream_name,),
    )
    txn.execute("SELECT run FROM stream_runs WHERE stream_name = ?", (stream_name,))
    row = txn.fetchone()
    assert row is not None
    return int(row[0])
