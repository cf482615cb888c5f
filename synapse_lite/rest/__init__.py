"""HTTP resources: the client API, health and metrics."""
