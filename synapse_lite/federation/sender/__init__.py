"""The federation sender: one :class:`DestinationQueue` per remote server,
woken by queued EDUs (see ``federation_sender.py``)."""
