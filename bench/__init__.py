"""Benchmarks: clients that measure a running homeserver and print figures."""
