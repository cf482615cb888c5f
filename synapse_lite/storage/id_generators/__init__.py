"""Stream ids and positions: the pure position model (``positions.py``), the
database shell that allocates and loads (``generator.py``) and the named
sequences ids come from (``sequence.py``)."""

from synapse_lite.storage.id_generators.generator import MultiWriterIdGenerator

__all__ = ["MultiWriterIdGenerator"]
