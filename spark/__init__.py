"""The Spark audit: reproduce every stream's positions offline and report what
the rows on disk do not support. ``spark/audit.py`` is the entry point;
``docs/audit.md`` describes the checks and the report.
"""
