"""TLS between the processes of one homeserver (replication and internal HTTP,
and the router relaying to them), for deployments across machines; and the
trust used towards servers users name (the system's CAs plus
``outbound_requests.extra_ca_paths``) and towards other homeservers (the
system's CAs plus ``federation.extra_ca_paths``).

A listener with ``tls_certificate_path``/``tls_private_key_path`` serves TLS
with them; whoever connects to it checks the certificate against the CA in
``internal_tls.ca_path`` and the address it connects to (a name or an IP
address in the certificate's subjectAltName). ``docs/deployment.md`` shows how
to make the files.
"""

from __future__ import annotations

import logging
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import NameOID
from OpenSSL import SSL, crypto
from service_identity import CertificateError, VerificationError
from service_identity.hazmat import DNS_ID, IPAddress_ID, verify_service_identity
from service_identity.pyopenssl import extract_patterns
from twisted.internet import ssl
from twisted.internet._sslverify import IOpenSSLTrustRoot
from twisted.internet.abstract import isIPAddress, isIPv6Address
from twisted.internet.endpoints import (
    HostnameEndpoint,
    TCP4ClientEndpoint,
    TCP6ClientEndpoint,
    wrapClientTLS,
)
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator, IStreamClientEndpoint
from twisted.python.failure import Failure
from twisted.web.client import BrowserLikePolicyForHTTPS
from twisted.web.iweb import IPolicyForHTTPS
from zope.interface import implementer

from synapse_lite.config.homeserver import TlsFiles
from synapse_lite.config.outbound import read_pem_certificates

logger = logging.getLogger(__name__)


class TlsSetupError(Exception):
    """A certificate, key or CA file could not be used."""


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise TlsSetupError(f"cannot read the {what} {path}: {e.strerror}") from e


def server_tls_options(files: TlsFiles) -> Any:
    """The context factory a TLS listener serves with."""
    certificate = _read(files.certificate_path, "certificate")
    key = _read(files.private_key_path, "private key")
    try:
        return ssl.PrivateCertificate.loadPEM(key + b"\n" + certificate).options()
    except Exception as e:
        raise TlsSetupError(
            f"{files.certificate_path} and {files.private_key_path} are not a PEM certificate"
            f" and its private key: {e}"
        ) from e


class InternalTlsClient:
    """Client TLS options for connecting to the other processes: their
    certificates must chain to ``ca_path`` and name the address connected to."""

    def __init__(self, ca_path: str | None) -> None:
        self._trust_root: Any = None
        if ca_path is not None:
            try:
                self._trust_root = ssl.Certificate.loadPEM(_read(ca_path, "CA certificate"))
            except TlsSetupError:
                raise
            except Exception as e:
                raise TlsSetupError(f"{ca_path} is not a PEM certificate: {e}") from e

    def options_for(self, host: str) -> Any:
        if self._trust_root is None:
            raise TlsSetupError(
                f"{host} answers with TLS, but internal_tls.ca_path is not set: nothing to"
                " check its certificate against"
            )
        return ssl.optionsForClientTLS(host, trustRoot=self._trust_root)

    def endpoint(
        self, reactor: Any, host: str, port: int, tls: bool, timeout: float = 30
    ) -> IStreamClientEndpoint:
        """An endpoint to ``host:port``, wrapped in TLS when ``tls``. An IP
        address is connected to directly: no resolver thread, which a loaded
        machine can keep waiting longer than a health check's timeout."""
        endpoint: IStreamClientEndpoint
        if isIPAddress(host):
            endpoint = TCP4ClientEndpoint(reactor, host, port, timeout=timeout)
        elif isIPv6Address(host):
            endpoint = TCP6ClientEndpoint(reactor, host, port, timeout=timeout)
        else:
            endpoint = HostnameEndpoint(reactor, host, port, timeout=timeout)
        if tls:
            endpoint = wrapClientTLS(self.options_for(host), endpoint)
        return endpoint


@implementer(IOpenSSLTrustRoot)
class SystemAndExtraTrustRoot:
    """The system's trusted CAs plus some of the operator's: a certificate
    chaining to either is accepted (``ssl.trustRootFromCertificates`` would
    trust only the given ones)."""

    def __init__(self, extra: list[x509.Certificate]) -> None:
        self._extra = [crypto.X509.from_cryptography(c) for c in extra]

    def _addCACertsToContext(self, context: Any) -> None:
        context.set_default_verify_paths()
        store = context.get_cert_store()
        for certificate in self._extra:
            store.add_cert(certificate)


@implementer(IPolicyForHTTPS)
class OperatorTrustPolicy:
    """How HTTPS certificates of servers users name (push gateways, identity
    servers, pages to preview) and of other homeservers are checked: chained
    to the system's CAs or the operator's (``outbound_requests.extra_ca_paths``,
    ``federation.extra_ca_paths``), and naming
    the host in their subjectAltName. One allowance: a certificate that has
    no subjectAltName at all and is one of the operator's CA certificates
    (a self-signed certificate the operator trusts directly) or is issued
    directly by one may name its host in its subject CN, as certificates did
    before RFC 6125 (SyTest's identity server has such a certificate). The
    system's CAs issue no such certificates, and this does not apply to
    them."""

    def __init__(self, extra: list[x509.Certificate]) -> None:
        self._extra = extra
        self._trust = SystemAndExtraTrustRoot(extra) if extra else ssl.platformTrust()

    def creatorForNetloc(self, hostname: bytes, port: int) -> Any:
        host = hostname.decode("ascii")
        options = ssl.optionsForClientTLS(host, trustRoot=self._trust)
        return _OperatorCnCreator(options, host, self._extra)


@implementer(IOpenSSLClientConnectionCreator)
class _OperatorCnCreator:
    """Twisted's client connection, with :class:`OperatorTrustPolicy`'s
    check of the server certificate's identity in place of Twisted's."""

    def __init__(self, options: Any, host: str, extra: list[x509.Certificate]) -> None:
        self._options = options
        self._host = host
        self._extra = extra

    def clientConnectionForTLS(self, tls_protocol: Any) -> Any:
        connection = self._options.clientConnectionForTLS(tls_protocol)
        host, extra = self._host, self._extra
        service_id: Any = (
            IPAddress_ID(host) if isIPAddress(host) or isIPv6Address(host) else DNS_ID(host)
        )

        def verify(conn: Any, certificate: Any, error: int, depth: int, ok: bool) -> bool:
            if depth != 0 or not ok:
                return bool(ok)  # the chain itself: OpenSSL's verdict
            try:
                patterns = extract_patterns(certificate)
                if patterns:
                    verify_service_identity(patterns, [service_id], [])
                elif not _operator_names(certificate.to_cryptography(), extra, host):
                    raise CertificateError(f"the certificate names no host, or not {host}")
            except (VerificationError, CertificateError):
                tls_protocol.failVerification(Failure())
                return False
            except Exception:
                logger.exception("Checking the certificate of %s failed", host)
                return False
            return True

        connection.set_verify(SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT, verify)
        return connection


def _operator_names(leaf: x509.Certificate, extra: list[x509.Certificate], host: str) -> bool:
    """Whether ``leaf`` (without subjectAltName) is, or is issued by, one of
    the operator's CA certificates and names ``host`` in its subject CN."""
    trusted = any(leaf == ca for ca in extra)
    for ca in extra:
        if trusted:
            break
        try:
            leaf.verify_directly_issued_by(ca)
            trusted = True
        except (ValueError, TypeError, InvalidSignature):
            continue
    names = leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return trusted and any(str(n.value).lower() == host.lower() for n in names)


def https_policy_trusting(ca_paths: tuple[str, ...]) -> IPolicyForHTTPS:
    """What an ``Agent`` checks HTTPS servers with (those users name, other
    homeservers): the system's CAs, and those in ``ca_paths`` (PEM files,
    checked when the config was loaded), as :class:`OperatorTrustPolicy`
    says."""
    if not ca_paths:
        return BrowserLikePolicyForHTTPS()
    extra = [c for path in ca_paths for c in read_pem_certificates(path)]
    return OperatorTrustPolicy(extra)
