"""Replication: how the main process and its workers keep each other current."""
