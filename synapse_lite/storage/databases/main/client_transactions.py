"""Client transaction ids kept with the writes they name (``client_transactions``).

A client that never saw the answer to ``PUT .../{txnId}`` sends it again with
the same id. A writer that remembered ids only in memory would write a second
time after a restart; here the id is recorded by the writer in the same
database transaction as the write, so a retry is recognised whatever happened
in between (a restart of any process, or a COMMIT whose outcome the writer
never learnt and that the database layer ran again). The list of client
writes and how each retry is made safe is in docs/reliability.md.

The two helpers run inside the writer's transaction: first
:func:`claim_client_transaction_txn` (which answers a repeat), then the write,
then :func:`record_client_transaction_txn` with its stream id.

Ids are not kept forever: the main process deletes those older than
:data:`CLIENT_TXN_LIFETIME_MS` (``handlers/client_transactions.py``), and a
device's ids go with the device. A retry later than that, or from a device
deleted meanwhile (its access token is gone too), is a new write.
"""

from __future__ import annotations

from synapse_lite.storage.database import LoggingTransaction

#: ``(user_id, device_id or None, txn_id)`` as the client sent it.
TxnKey = tuple[str, str | None, str]

#: How long a transaction id is remembered (a day: clients retry within
#: seconds or minutes of the first attempt).
CLIENT_TXN_LIFETIME_MS = 24 * 60 * 60 * 1000


def claim_client_transaction_txn(
    txn: LoggingTransaction, key: TxnKey, kind: str, now_ms: int
) -> int | None:
    """Record ``key`` for ``kind`` unless it is there already.

    Returns None when it is new (the caller writes, then records its stream id
    with :func:`record_client_transaction_txn`), or the stream id the first
    write answered with when it is a repeat (the caller writes nothing). Two
    concurrent first attempts serialise on the primary key: the second waits
    for the first to commit and then sees it as a repeat.
    """
    user_id, device_id, txn_id = key
    txn.execute(
        "INSERT INTO client_transactions (user_id, device_id, kind, txn_id, stream_id,"
        " inserted_ts) VALUES (?, ?, ?, ?, NULL, ?)"
        " ON CONFLICT (user_id, device_id, kind, txn_id) DO NOTHING",
        (user_id, device_id or "", kind, txn_id, now_ms),
    )
    if txn.rowcount:
        return None
    txn.execute(
        "SELECT stream_id FROM client_transactions"
        " WHERE user_id = ? AND device_id = ? AND kind = ? AND txn_id = ?",
        (user_id, device_id or "", kind, txn_id),
    )
    row = txn.fetchone()
    # A row without a stream id was recorded by a write that had nothing to
    # store; answering with 0 is what that write answered with too.
    return int(row[0]) if row and row[0] is not None else 0


def record_client_transaction_txn(
    txn: LoggingTransaction, key: TxnKey, kind: str, stream_id: int
) -> None:
    """The write claimed with :func:`claim_client_transaction_txn` has
    ``stream_id``."""
    user_id, device_id, txn_id = key
    txn.execute(
        "UPDATE client_transactions SET stream_id = ?"
        " WHERE user_id = ? AND device_id = ? AND kind = ? AND txn_id = ?",
        (stream_id, user_id, device_id or "", kind, txn_id),
    )


def prune_client_transactions_txn(txn: LoggingTransaction, before_ms: int, limit: int) -> int:
    """Delete up to ``limit`` ids recorded before ``before_ms`` (oldest
    first); how many were."""
    txn.execute(
        "DELETE FROM client_transactions WHERE (user_id, device_id, kind, txn_id) IN ("
        " SELECT user_id, device_id, kind, txn_id FROM client_transactions"
        " WHERE inserted_ts < ? ORDER BY inserted_ts LIMIT ?)",
        (before_ms, limit),
    )
    return txn.rowcount


def delete_device_client_transactions_txn(
    txn: LoggingTransaction, user_id: str, device_id: str
) -> None:
    """Forget the ids of a device being deleted (in the transaction deleting it)."""
    txn.execute(
        "DELETE FROM client_transactions WHERE user_id = ? AND device_id = ?",
        (user_id, device_id),
    )
