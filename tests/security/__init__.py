"""Security checks: shared secrets between processes and for admin
registration, and what a user with a valid token still cannot reach."""
