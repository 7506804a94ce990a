"""Certificates for the webhook and the extender: make them, write them to files, read
them back (``fairshare.tls.secrets`` stores them through the API). Keys are ECDSA P-256;
certificates are valid from ``now - CLOCK_SKEW``, so a peer whose clock lags a little
accepts a fresh one; ``write_certs`` mints a fresh CA each run and keeps no CA key.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fairshare.errors import FairshareError

__all__ = [
    "CLIENTS",
    "CLOCK_SKEW",
    "CertPaths",
    "ClientCertPaths",
    "TLSError",
    "admission_configuration",
    "admission_kubeconfig",
    "make_ca",
    "make_client_cert",
    "make_serving_cert",
    "read_client_certs",
    "read_not_after",
    "service_dns_names",
    "write_certs",
    "write_client_certs",
]

#: How far a new certificate's ``notBefore`` lies before ``now`` (clock skew allowance).
CLOCK_SKEW = dt.timedelta(minutes=5)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class TLSError(FairshareError, ValueError):
    """Certificate material is unusable (bad arguments, mismatched key, unreadable files)."""


# --------------------------------------------------------------------------- certificates


def service_dns_names(service: str, namespace: str) -> tuple[str, ...]:
    """The four names a Service is reached by, shortest first.

    ``NAME``, ``NAME.NS``, ``NAME.NS.svc`` (what kube-apiserver dials for a webhook
    ``service`` reference) and ``NAME.NS.svc.cluster.local``.
    """
    if not service or not namespace:
        raise TLSError("service and namespace must be non-empty")
    base = f"{service}.{namespace}"
    return (service, base, f"{base}.svc", f"{base}.svc.cluster.local")


def make_ca(common_name: str, *, days: int, now: dt.datetime) -> tuple[bytes, bytes]:
    """Make a self-signed CA; return ``(cert_pem, key_pem)``.

    BasicConstraints ``ca=True, path_length=0`` (it signs leaf certificates only) and
    KeyUsage ``keyCertSign``/``cRLSign``/``digitalSignature``, both critical. Valid from
    ``now - CLOCK_SKEW`` for ``days`` days. ``now`` must be timezone-aware.
    """
    _check_validity(days, now)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        _builder(subject=name, issuer=name, public_key=key.public_key(), days=days, now=now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .sign(key, hashes.SHA256())
    )
    return _cert_pem(cert), _key_pem(key)


def make_serving_cert(
    ca_cert_pem: bytes,
    ca_key_pem: bytes,
    *,
    dns_names: Sequence[str],
    ip_addresses: Iterable[str | IPAddress] = (),
    days: int,
    now: dt.datetime,
) -> tuple[bytes, bytes]:
    """Make a server certificate signed by the CA; return ``(cert_pem, key_pem)``.

    SubjectAltName carries every DNS name and IP address (clients match the SAN, not the
    CN; the CN is the first name for humans). ExtendedKeyUsage ``serverAuth``,
    BasicConstraints ``ca=False``, Authority/Subject key identifiers so chain building
    works under strict verification. Raises ``TLSError`` if the key does not belong to the
    CA certificate, an IP address does not parse, or no name is given.
    """
    _check_validity(days, now)
    try:
        ips = [ipaddress.ip_address(str(ip)) for ip in ip_addresses]
    except ValueError as error:
        raise TLSError(str(error)) from None
    if not dns_names and not ips:
        raise TLSError("a serving certificate needs at least one DNS name or IP address")
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    sans += [x509.IPAddress(ip) for ip in ips]
    return _issue_leaf(
        ca_cert_pem,
        ca_key_pem,
        common_name=dns_names[0] if dns_names else str(ips[0]),
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        sans=sans,
        days=days,
        now=now,
    )


def make_client_cert(
    ca_cert_pem: bytes,
    ca_key_pem: bytes,
    *,
    common_name: str,
    days: int,
    now: dt.datetime,
) -> tuple[bytes, bytes]:
    """Make a TLS client certificate signed by the CA; return ``(cert_pem, key_pem)``.

    ExtendedKeyUsage ``clientAuth`` only (a server refuses it as a serving certificate),
    no SubjectAltName; the CN names the client for the servers' logs. Raises ``TLSError``
    like ``make_serving_cert``.
    """
    _check_validity(days, now)
    if not common_name:
        raise TLSError("a client certificate needs a common name")
    return _issue_leaf(
        ca_cert_pem,
        ca_key_pem,
        common_name=common_name,
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        sans=[],
        days=days,
        now=now,
    )


def _issue_leaf(
    ca_cert_pem: bytes,
    ca_key_pem: bytes,
    *,
    common_name: str,
    usage: x509.ObjectIdentifier,
    sans: list[x509.GeneralName],
    days: int,
    now: dt.datetime,
) -> tuple[bytes, bytes]:
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise TLSError(f"unsupported CA key type {type(ca_key).__name__}")
    if _public_der(ca_key.public_key()) != _public_der(ca_cert.public_key()):
        raise TLSError("the CA key does not match the CA certificate")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    try:
        ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        authority = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski)
    except x509.ExtensionNotFound:  # a CA made elsewhere, without a key identifier
        authority = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    builder = (
        _builder(
            subject=subject, issuer=ca_cert.subject, public_key=key.public_key(), days=days, now=now
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(authority, critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return _cert_pem(builder.sign(ca_key, hashes.SHA256())), _key_pem(key)


@dataclass(frozen=True, slots=True)
class CertPaths:
    """Where ``write_certs`` put its files."""

    ca_cert: Path
    cert: Path
    key: Path


def write_certs(
    out_dir: str | os.PathLike[str],
    *,
    service: str,
    namespace: str,
    ip_addresses: Iterable[str | IPAddress] = (),
    days: int = 365,
    now: dt.datetime | None = None,
) -> CertPaths:
    """Mint a CA and a serving certificate for a Service and write them to ``out_dir``.

    Files: ``ca.crt`` (the ``caBundle``), ``tls.crt``, ``tls.key`` (mode 0600) — the key
    names of a ``kubernetes.io/tls`` Secret. Each file is written to a temporary name and
    renamed into place, so a reader never sees half a file. ``now`` defaults to the clock.
    """
    now = now or dt.datetime.now(dt.UTC)
    ca_pem, ca_key_pem = make_ca(f"fairshare-ca ({service}.{namespace})", days=days, now=now)
    cert_pem, key_pem = make_serving_cert(
        ca_pem,
        ca_key_pem,
        dns_names=service_dns_names(service, namespace),
        ip_addresses=ip_addresses,
        days=days,
        now=now,
    )
    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    paths = CertPaths(directory / "ca.crt", directory / "tls.crt", directory / "tls.key")
    _write_atomic(paths.ca_cert, ca_pem, mode=0o644)
    _write_atomic(paths.cert, cert_pem, mode=0o644)
    _write_atomic(paths.key, key_pem, mode=0o600)
    return paths


#: Who presents a client certificate to whom (``--client-ca`` on both servers): file stem
#: → common name. kube-apiserver calls the webhook, kube-scheduler calls the extender.
CLIENTS: dict[str, str] = {
    "apiserver-client": "kube-apiserver (fairshare webhook client)",
    "scheduler-client": "kube-scheduler (fairshare extender client)",
}


@dataclass(frozen=True, slots=True)
class ClientCertPaths:
    """Where ``write_client_certs`` put its files: the CA and one (cert, key) per client."""

    ca_cert: Path
    clients: dict[str, tuple[Path, Path]]


def write_client_certs(
    out_dir: str | os.PathLike[str],
    *,
    clients: dict[str, str] | None = None,
    days: int = 365,
    now: dt.datetime | None = None,
) -> ClientCertPaths:
    """Mint a client CA and one client certificate per entry of ``clients`` (stem → CN).

    Files: ``client-ca.crt`` (what the servers' ``--client-ca`` points at) and
    ``<stem>.crt`` / ``<stem>.key`` (0600). The CA key is not kept: re-run to rotate, and
    hand the new files to both sides.
    """
    now = now or dt.datetime.now(dt.UTC)
    wanted = CLIENTS if clients is None else clients
    if not wanted:
        raise TLSError("no clients to make certificates for")
    ca_pem, ca_key_pem = make_ca("fairshare-client-ca", days=days, now=now)
    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    paths = ClientCertPaths(directory / "client-ca.crt", {})
    _write_atomic(paths.ca_cert, ca_pem, mode=0o644)
    for stem, common_name in wanted.items():
        cert_pem, key_pem = make_client_cert(
            ca_pem, ca_key_pem, common_name=common_name, days=days, now=now
        )
        cert, key = directory / f"{stem}.crt", directory / f"{stem}.key"
        _write_atomic(cert, cert_pem, mode=0o644)
        _write_atomic(key, key_pem, mode=0o600)
        paths.clients[stem] = (cert, key)
    return paths


def read_client_certs(
    out_dir: str | os.PathLike[str], *, clients: dict[str, str] | None = None
) -> ClientCertPaths:
    """The files ``write_client_certs`` wrote to ``out_dir``; ``TLSError`` if one is missing
    or a certificate was not issued by ``client-ca.crt``."""
    directory = Path(out_dir)
    wanted = CLIENTS if clients is None else clients
    paths = ClientCertPaths(directory / "client-ca.crt", {})
    needed = [paths.ca_cert]
    for stem in wanted:
        paths.clients[stem] = (directory / f"{stem}.crt", directory / f"{stem}.key")
        needed += paths.clients[stem]
    missing = [str(p) for p in needed if not p.is_file()]
    if missing:
        raise TLSError(f"missing {', '.join(missing)} (run without --reuse to make them)")
    ca = x509.load_pem_x509_certificate(paths.ca_cert.read_bytes())
    for cert, _key in paths.clients.values():
        leaf = x509.load_pem_x509_certificate(cert.read_bytes())
        try:  # the signature, not only the name: every client CA has the same CN
            leaf.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            raise TLSError(f"{cert} was not issued by {paths.ca_cert}") from None
    return paths


def admission_kubeconfig(user: str, cert: str, key: str) -> dict[str, Any]:
    """The kubeconfig kube-apiserver reads for webhook client credentials.

    kube-apiserver picks the ``users`` entry named after the webhook it dials: the exact
    ``SERVICE.NAMESPACE.svc`` (or ``host:port`` for a URL webhook), then ``*.`` suffix
    wildcards, then ``*``. Name it ``fairshare-webhook.fairshare-system.svc`` so no other
    webhook receives this certificate; ``*`` suits a test cluster with a dynamic port.
    """
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "users": [{"name": user, "user": {"client-certificate": cert, "client-key": key}}],
    }


def admission_configuration(kubeconfig_path: str) -> dict[str, Any]:
    """``--admission-control-config-file`` content pointing both webhook plugins at it."""

    def plugin() -> dict[str, str]:
        return {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "WebhookAdmissionConfiguration",
            "kubeConfigFile": kubeconfig_path,
        }

    return {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [
            {"name": name, "configuration": plugin()}
            for name in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")
        ],
    }


# --------------------------------------------------------------------------- helpers


def _check_validity(days: int, now: dt.datetime) -> None:
    if days <= 0:
        raise TLSError(f"days must be > 0, got {days}")
    if now.tzinfo is None:
        raise TLSError("now must be timezone-aware (UTC)")


def _builder(
    *,
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    days: int,
    now: dt.datetime,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _public_der(public_key: Any) -> bytes:
    der: bytes = public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return der


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def read_not_after(cert_file: Path) -> dt.datetime:
    return x509.load_pem_x509_certificate(cert_file.read_bytes()).not_valid_after_utc


def _write_atomic(path: Path, data: bytes, *, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as file:
        os.fchmod(fd, mode)  # O_CREAT's mode is filtered by the umask and ignored if it exists
        file.write(data)
    os.replace(tmp, path)
