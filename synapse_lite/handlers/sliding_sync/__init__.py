"""Simplified sliding sync (MSC4186): the room list a client asks for by
lists and room subscriptions, each room sent once and then only what
changed, per connection. See docs/sliding-sync.md.

``body`` parses and checks the request (pure); ``required_state`` matches
state against a room config (pure); ``connection`` is what a connection has
been sent, kept in the database per ``pos`` (``storage/.../sliding_sync.py``)
so that any /sync worker continues it; ``handler`` computes the responses.
"""
