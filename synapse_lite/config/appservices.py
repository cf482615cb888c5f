"""``app_service_config_files``: the registration files of the application
services, in the format the reference homeserver and every bridge write.

Each file is one YAML registration (``appservice/registration.py`` is what
it becomes). Every problem of every file is reported at once, naming the
file and key: a missing or mistyped key, a regex that does not compile, an
``id`` or ``as_token`` used twice, an ``hs_token`` used twice, a token used
both as some service's ``as_token`` and another's ``hs_token``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from synapse_lite.appservice.registration import (
    NAMESPACE_KINDS,
    ApplicationService,
    ApplicationServices,
    Namespace,
)
from synapse_lite.config.validation import (
    ConfigError,
    ConfigProblem,
    Section,
    load_yaml_file,
)

#: Keys bridges write that this homeserver reads but does not act on yet
#: (accepted so that their generated files load unchanged).
_ACCEPTED_KEYS = (
    "push_ephemeral",
    "de.sorunome.msc2409.push_ephemeral",
    "io.element.msc4190",
    "org.matrix.msc4190",
)
_LOCALPART = re.compile(r"^[a-z0-9._=\-/+]+$")


def _read_namespaces(section: Section, kind: str) -> tuple[Namespace, ...]:
    result = []
    for entry in section.get_list_of_sections(kind, []):
        exclusive = entry.get_bool("exclusive", False)
        pattern = entry.get_str("regex")
        entry.finish()
        if not isinstance(pattern, str) or not pattern:
            continue
        try:
            regex = re.compile(pattern)
        except re.error as e:
            entry.problem(f"is not a valid regular expression: {e}", "regex")
            continue
        result.append(Namespace(exclusive, regex))
    return tuple(result)


def read_registration(
    path: str, server_name: str
) -> tuple[ApplicationService | None, list[ConfigProblem]]:
    """One registration file: the service, or None and the problems found."""
    try:
        data = load_yaml_file(path)
    except ConfigError as e:
        return None, e.problems
    section = Section(data, path)
    service_id = section.get_str("id")
    if "url" not in section.data:
        section.problem("is required (null if the service wants no traffic)", "url")
    url = section.get_optional_str("url")
    if url is not None and not url.startswith(("http://", "https://")):
        section.problem(f"must be an http:// or https:// URL, or null, not {url!r}", "url")
        url = None
    as_token = section.get_str("as_token")
    hs_token = section.get_str("hs_token")
    localpart = section.get_str("sender_localpart")
    if isinstance(localpart, str) and localpart and not _LOCALPART.match(localpart):
        section.problem(
            "must be a user id's localpart (lower-case letters, digits and ._=-/+)",
            "sender_localpart",
        )
    namespaces = section.get_section("namespaces")
    found_ns = {kind: _read_namespaces(namespaces, kind) for kind in NAMESPACE_KINDS}
    namespaces.finish()
    rate_limited = section.get_bool("rate_limited", True)
    protocols = section.get_str_list("protocols", [])
    receive_ephemeral = section.get_bool("receive_ephemeral", False)
    if "receive_ephemeral" not in section.data:
        # The unstable name bridges wrote before the spec's.
        receive_ephemeral = section.get_bool("de.sorunome.msc2409.push_ephemeral", False)
    msc3202 = section.get_bool("org.matrix.msc3202", False)
    section.accept(*_ACCEPTED_KEYS)
    for key, token in (("as_token", as_token), ("hs_token", hs_token)):
        if isinstance(token, str) and not token.strip():
            section.problem("must not be empty", key)
    section.finish()
    if section.problems:
        return None, section.problems
    assert isinstance(service_id, str)
    return (
        ApplicationService(
            id=service_id,
            url=url.rstrip("/") if url else None,
            as_token=as_token,
            hs_token=hs_token,
            sender=f"@{localpart}:{server_name}",
            users=found_ns["users"],
            aliases=found_ns["aliases"],
            rooms=found_ns["rooms"],
            rate_limited=rate_limited,
            protocols=tuple(protocols or ()),
            receive_ephemeral=receive_ephemeral,
            msc3202=msc3202,
            source=path,
        ),
        [],
    )


def read_app_services(paths: Sequence[str], base_dir: str, server_name: str) -> ApplicationServices:
    """Every registration named by ``app_service_config_files`` (relative
    paths are relative to the homeserver config), or a :class:`ConfigError`
    listing every problem of every file."""
    problems: list[ConfigProblem] = []
    services: list[ApplicationService] = []
    for relative in paths:
        path = os.path.join(base_dir, relative)
        service, found = read_registration(path, server_name)
        problems += found
        if service is not None:
            services.append(service)
    problems += _clashes(services)
    if problems:
        raise ConfigError(problems)
    return ApplicationServices(tuple(services))


def _clashes(services: Sequence[ApplicationService]) -> list[ConfigProblem]:
    """Ids and tokens must each name one service (the spec: "the homeserver
    MUST enforce this"); a token used as one service's ``as_token`` and
    another's ``hs_token`` would let either impersonate the other."""
    problems = []
    seen: dict[tuple[str, str], ApplicationService] = {}
    for service in services:
        for key, value in (
            ("id", service.id),
            ("as_token", service.as_token),
            ("hs_token", service.hs_token),
            ("sender_localpart", service.sender),
        ):
            group = "token" if key.endswith("_token") else key
            other = seen.get((group, value))
            if other is not None:
                problems.append(
                    ConfigProblem(
                        service.source,
                        key,
                        f"is already used by application service {other.id!r} ({other.source}):"
                        " each service needs its own",
                    )
                )
            else:
                seen[(group, value)] = service
    return problems
