"""synapse_lite: a Twisted homeserver that scales out across worker processes."""

__version__ = "0.1.0"
