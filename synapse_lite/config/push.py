"""The ``push`` section: how pusher instances reach push gateways.

Gateways are reached over HTTPS with certificate verification against the
system's trusted CAs; ``gateway_ca_paths`` adds CAs of the operator's (a
private gateway's, or a test suite's) without turning verification off for
anyone else. Each file is read and parsed when the config is loaded, so a
wrong path or a file that is not a PEM certificate stops the server at start
rather than failing every push later.
"""

from __future__ import annotations

import os

import attr
from cryptography import x509

from synapse_lite.config.validation import Section


@attr.s(slots=True, frozen=True, auto_attribs=True)
class PushConfig:
    """Settings of push delivery (``push``)."""

    #: PEM files, each holding one or more CA certificates trusted for push
    #: gateways' certificates besides the system's (absolute paths).
    gateway_ca_paths: tuple[str, ...] = ()

    @classmethod
    def read(cls, section: Section, base_dir: str) -> PushConfig:
        paths: list[str] = []
        values = section.get_str_list("gateway_ca_paths", [], allow_single=True)
        for index, value in enumerate(values):
            path = os.path.join(base_dir, value)
            problem = _pem_certificates_problem(path)
            if problem is not None:
                section.problem(problem, f"gateway_ca_paths[{index}]")
            paths.append(path)
        section.finish()
        return cls(tuple(paths))


def read_pem_certificates(path: str) -> list[x509.Certificate]:
    """Every certificate of a PEM file; raises ``OSError`` or ``ValueError``."""
    with open(path, "rb") as f:
        return x509.load_pem_x509_certificates(f.read())


def _pem_certificates_problem(path: str) -> str | None:
    try:
        read_pem_certificates(path)
    except OSError as e:
        return f"cannot read {path}: {e.strerror}"
    except ValueError:
        return f"{path} holds no PEM certificate ('-----BEGIN CERTIFICATE-----')"
    return None
