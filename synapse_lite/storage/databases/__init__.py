"""The database a homeserver uses, and the stores composed over it."""
