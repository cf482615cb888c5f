"""Tests of the replication line protocol and its TCP and Redis transports."""
