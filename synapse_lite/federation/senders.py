"""Which federation sender sends to a destination.

``federation_sender_instances`` names any number of sender processes (the
main process alone by default). Each destination (another server's name) is
owned by exactly one of them: the rendezvous hash of the name over the
instances (:data:`FEDERATION_SENDER_SHARD`, the writers directory's rule
type with ``ShardKey.DESTINATION``). It is the same in every process and
across restarts, ignores the order the instances are listed in, and moves
as few destinations as possible when a sender is added (only those the new
one now wins) or removed (only its own). So two senders never send to one
destination, and one destination's transactions keep their order.
"""

from __future__ import annotations

from collections.abc import Sequence

from synapse_lite.streams.definition import ShardKey, StableHash

FEDERATION_SENDER_SHARD = StableHash(ShardKey.DESTINATION, rendezvous=True)


def sender_of(destination: str, instances: Sequence[str]) -> str:
    """The instance of ``instances`` sending to ``destination``."""
    return FEDERATION_SENDER_SHARD.pick(destination, instances)
