"""Application services (bridges and bots): their registrations, their
requests to the client API, and what the homeserver sends them.
docs/application-services.md describes the whole."""
