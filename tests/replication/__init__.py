"""Tests of replication: commands, transports and the handler."""
