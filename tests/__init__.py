"""The synapse_lite test suite (trial)."""
