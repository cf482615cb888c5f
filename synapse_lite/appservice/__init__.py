"""Application services (bridges and bots): their registrations, their
requests to the client API, and what the homeserver sends them.
docs/appservices.md describes the whole."""
