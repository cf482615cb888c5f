"""A throwaway certificate authority and certificates for the addresses
processes listen on, for tests of TLS between processes (``http/tls.py``)."""

from __future__ import annotations

import datetime
import ipaddress
import os
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from twisted.internet import ssl


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: str) -> None:
    with open(path, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )


class TestCA:
    """A CA in ``directory`` (``ca.pem``) that signs certificates for hosts."""

    def __init__(self, directory: str, name: str = "synapse_lite test CA") -> None:
        self.directory = directory
        self._key = _key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self._certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.ca_path = os.path.join(directory, "ca.pem")
        with open(self.ca_path, "wb") as f:
            f.write(self._certificate.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, hosts: list[str], alt_names: bool = True) -> tuple[str, str]:
        """``(certificate path, key path)`` for ``hosts`` (names or IP
        addresses); without ``alt_names``, a legacy certificate naming its
        one host in its subject CN only."""
        key = _key()
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(
                x509.Name(
                    [x509.NameAttribute(NameOID.COMMON_NAME, name if alt_names else hosts[0])]
                )
            )
            .issuer_name(self._certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
        )
        if alt_names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        certificate = builder.sign(self._key, hashes.SHA256())
        certificate_path = os.path.join(self.directory, f"{name}.pem")
        key_path = os.path.join(self.directory, f"{name}.key")
        with open(certificate_path, "wb") as f:
            f.write(certificate.public_bytes(serialization.Encoding.PEM))
        _write_key(key, key_path)
        return certificate_path, key_path

    def server_options(self, name: str, hosts: list[str], alt_names: bool = True) -> Any:
        """What ``reactor.listenSSL`` serves a certificate for ``hosts`` with
        (see :meth:`issue`)."""
        certificate, key = self.issue(name, hosts, alt_names)
        with open(certificate, "rb") as c, open(key, "rb") as k:
            return ssl.PrivateCertificate.loadPEM(k.read() + c.read()).options()
