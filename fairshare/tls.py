"""TLS for the webhook and the extender: certificates, server contexts, hot reload.

kube-apiserver only calls admission webhooks over HTTPS, and it checks the serving
certificate against the ``caBundle`` of the webhook configuration and the service DNS name
it dials (``NAME.NS.svc``). This module covers that whole path:

- ``make_ca`` / ``make_serving_cert`` build PEM pairs. They are pure functions of their
  arguments *except* for key material and serial numbers, which must be random; ``now`` is
  a parameter, so validity windows are reproducible and testable.
- ``write_certs`` is the thin file adapter behind ``fairshare certs`` (reads the clock,
  writes ``ca.crt``, ``tls.crt``, ``tls.key``; the key file is 0600).
- ``server_ssl_context`` builds the server ``SSLContext``: TLS 1.2 minimum, ECDHE + AEAD
  ciphers for TLS 1.2 (TLS 1.3 suites are all AEAD), no compression.
- ``CertReloader`` re-reads the certificate and key when a mounted Secret rotates, and swaps
  them into *new* handshakes through the context's ``sni_callback``, so the server never
  restarts. A half-written rotation keeps the last good pair.
- ``patch_webhook_ca_bundle`` writes the CA bundle into Mutating/Validating webhook
  configurations through the API.

Adapter module: file I/O and (lazily) ``kubernetes_asyncio`` are allowed here. It must not
import ``aiohttp``, ``webhook`` or ``scheduler_plugin``; the apps hand ``CertReloader.context``
to ``aiohttp.web.TCPSite(ssl_context=...)`` themselves.

Design choices:

- ECDSA P-256 keys: accepted by kube-apiserver and every TLS 1.2+ client, and a handshake
  costs a fraction of RSA-2048's, which matters when the apiserver opens many connections.
- The serving certificate's ``notBefore`` is backdated by ``CLOCK_SKEW`` so that an
  apiserver whose clock lags ours a little still accepts a freshly minted certificate.
- ``write_certs`` does not keep the CA key: each run mints a fresh CA, and the bundle is
  re-patched into the webhook configurations. Less secret material lies on disk.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import ipaddress
import logging
import os
import ssl
from collections.abc import Callable, Iterable, Sequence
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
    "CIPHERS_TLS12",
    "CLIENTS",
    "CLOCK_SKEW",
    "CertPaths",
    "CertReloader",
    "ClientCertPaths",
    "TLSError",
    "admission_configuration",
    "admission_kubeconfig",
    "build_ca_bundle_patch",
    "make_ca",
    "make_client_cert",
    "make_serving_cert",
    "patch_webhook_ca_bundle",
    "read_client_certs",
    "secret_exists",
    "server_ssl_context",
    "service_dns_names",
    "write_certs",
    "write_client_certs",
    "write_secrets",
]

log = logging.getLogger(__name__)

#: OpenSSL cipher string for TLS 1.2: forward secrecy (ECDHE) and AEAD (GCM, ChaCha20) only.
#: TLS 1.3 suites are configured apart by OpenSSL and are all AEAD already.
CIPHERS_TLS12 = "ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL:!eNULL"

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


# --------------------------------------------------------------------------- server contexts


def server_ssl_context(
    cert_file: str | os.PathLike[str],
    key_file: str | os.PathLike[str],
    *,
    client_ca: str | os.PathLike[str] | None = None,
) -> ssl.SSLContext:
    """A server ``SSLContext`` loaded with the certificate chain and key.

    TLS 1.2 minimum; TLS 1.2 ciphers limited to ``CIPHERS_TLS12`` (ECDHE + AEAD); no TLS
    compression (CRIME); server cipher preference; no session tickets (they would outlive
    a rotated key; session IDs still resume). Raises ``ssl.SSLError``/``OSError`` for
    unreadable or mismatched files.

    With ``client_ca`` the server asks every client for a certificate and verifies one
    that is offered against that CA (``CERT_OPTIONAL``: a bad certificate fails the
    handshake, no certificate is let through). OpenSSL checks a client certificate's
    extended key usage for ``clientAuth`` on the server side. The apps then refuse every
    path but the probes and metrics to a connection without a verified peer certificate
    (see ``webhook.app``), so kubelet probes and Prometheus need no certificate.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(CIPHERS_TLS12)
    context.options |= (
        ssl.OP_NO_COMPRESSION
        | ssl.OP_CIPHER_SERVER_PREFERENCE
        | ssl.OP_SINGLE_ECDH_USE
        | ssl.OP_NO_TICKET
    )
    context.load_cert_chain(os.fspath(cert_file), os.fspath(key_file))
    if client_ca is not None:
        context.verify_mode = ssl.CERT_OPTIONAL
        context.load_verify_locations(cafile=os.fspath(client_ca))
    return context


_Stamp = tuple[tuple[int, int, int, int], ...]


class CertReloader:
    """Serve the current certificate of a rotating pair of files without restarting.

    Give ``context`` to the server once. Its ``sni_callback`` runs in every handshake
    (with or without SNI) and points the connection at the newest good context, so new
    connections get the new certificate while open ones finish on the old.

    ``maybe_reload()`` checks the files' (device, inode, size, mtime); the app calls it
    periodically (``run()`` is such a loop). Kubelet rotates a mounted Secret by swapping a
    symlink, which changes the inode; ``stat`` follows the link. If the new files do not
    load (half-written, key and certificate from different rotations) the last good
    context stays, the error is logged, kept in ``last_error`` and passed to ``on_error``
    (e.g. to count it). The stamp still advances, so a broken pair is reported once, and
    the next write is tried again.

    The constructor raises if the *initial* files are unusable: fail fast at startup.

    ``client_ca`` (optional) is the CA that client certificates are verified against; it is
    part of every context loaded, including reloaded ones (the ``sni_callback`` switch
    moves a connection to the new context's trust store), and a change of that file
    reloads too.
    """

    def __init__(
        self,
        cert_file: str | os.PathLike[str],
        key_file: str | os.PathLike[str],
        *,
        on_error: Callable[[Exception], None] | None = None,
        client_ca: str | os.PathLike[str] | None = None,
        on_reload: Callable[[dt.datetime], None] | None = None,
    ) -> None:
        self._cert_file = Path(cert_file)
        self._on_reload = on_reload
        self._key_file = Path(key_file)
        self._client_ca = Path(client_ca) if client_ca is not None else None
        self._on_error = on_error
        self._stamp = self._read_stamp()
        self._front = server_ssl_context(self._cert_file, self._key_file, client_ca=self._client_ca)
        self._front.sni_callback = self._select
        self._current = self._front
        self._not_after = _read_not_after(self._cert_file)
        self.reloads = 0
        self.last_error: Exception | None = None

    @property
    def context(self) -> ssl.SSLContext:
        """The context to hand to the server; it stays the same object across reloads."""
        return self._front

    @property
    def current(self) -> ssl.SSLContext:
        """The context new handshakes are switched to (the last good one loaded)."""
        return self._current

    @property
    def not_after(self) -> dt.datetime:
        """Expiry (UTC) of the certificate being served, e.g. for an expiry gauge."""
        return self._not_after

    def maybe_reload(self) -> bool:
        """Reload if the files changed; True if a new certificate is now being served."""
        try:
            stamp = self._read_stamp()
        except OSError as error:  # a file is missing for a moment during rotation
            self._report(error)
            return False
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            fresh = server_ssl_context(self._cert_file, self._key_file, client_ca=self._client_ca)
            not_after = _read_not_after(self._cert_file)
        except (OSError, ssl.SSLError, ValueError) as error:
            self._report(error)
            return False
        self._current, self._not_after = fresh, not_after
        self.reloads += 1
        self.last_error = None
        log.info("TLS certificate reloaded from %s (expires %s)", self._cert_file, not_after)
        if self._on_reload is not None:
            self._on_reload(not_after)
        return True

    async def run(self, *, interval: float = 10.0) -> None:
        """Call ``maybe_reload`` every ``interval`` seconds until cancelled."""
        while True:
            await asyncio.sleep(interval)
            self.maybe_reload()

    def _select(self, connection: Any, server_name: str | None, context: ssl.SSLContext) -> None:
        # Called by OpenSSL during the ClientHello; returning None continues the handshake.
        current = self._current
        if current is not context:
            connection.context = current

    @property
    def requires_client_cert(self) -> bool:
        """True when client certificates are verified (``client_ca`` was given)."""
        return self._client_ca is not None

    def _read_stamp(self) -> _Stamp:
        files = (self._cert_file, self._key_file, self._client_ca)
        stats = tuple(os.stat(f) for f in files if f is not None)
        return tuple((s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns) for s in stats)

    def _report(self, error: Exception) -> None:
        self.last_error = error
        log.warning(
            "TLS reload from %s failed, keeping the old certificate: %s", self._cert_file, error
        )
        if self._on_error is not None:
            self._on_error(error)


# --------------------------------------------------------------------------- webhook configs


def build_ca_bundle_patch(
    webhook_names: Sequence[str], ca_bundle_pem: bytes
) -> list[dict[str, Any]]:
    """RFC 6902 patch that sets ``clientConfig.caBundle`` on every webhook, by index.

    A ``test`` of each webhook's name precedes its ``add``, so the patch fails rather than
    write to the wrong entry if the list was reordered since it was read. ``add`` on an
    object member replaces an existing value.
    """
    bundle = base64.b64encode(ca_bundle_pem).decode("ascii")
    ops: list[dict[str, Any]] = []
    for index, name in enumerate(webhook_names):
        ops.append({"op": "test", "path": f"/webhooks/{index}/name", "value": name})
        ops.append(
            {"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": bundle}
        )
    return ops


async def patch_webhook_ca_bundle(
    ca_bundle_pem: bytes,
    *,
    mutating: Sequence[str] = (),
    validating: Sequence[str] = (),
    kubeconfig: str | None = None,
    api: Any = None,
) -> list[str]:
    """Set ``caBundle`` on every webhook of the named webhook configurations.

    ``api`` is an ``AdmissionregistrationV1Api`` (or a test double with the same
    ``read_*``/``patch_*`` coroutines); without it a client is built from ``kubeconfig``,
    or the in-cluster service account when that is None, and closed afterwards. Returns
    ``kind/name`` of every configuration patched, in order. API errors propagate.
    """
    if api is not None:
        return await _patch_all(api, ca_bundle_pem, mutating=mutating, validating=validating)
    # Imported here so that only `fairshare certs --patch-webhooks` pays for it.
    from kubernetes_asyncio import client

    from fairshare.state import informers

    api_client = await informers.make_api_client(kubeconfig)
    async with api_client:
        v1 = client.AdmissionregistrationV1Api(api_client)
        return await _patch_all(v1, ca_bundle_pem, mutating=mutating, validating=validating)


async def write_tls_secret(
    paths: CertPaths,
    *,
    namespace: str,
    name: str,
    kubeconfig: str | None = None,
) -> None:
    """Create or replace the ``kubernetes.io/tls`` Secret ``namespace/name`` from ``paths``.

    The Secret carries ``tls.crt``, ``tls.key`` and ``ca.crt``, as cert-manager writes
    them, so the same Deployment works with either.
    """
    files = {"tls.crt": paths.cert, "tls.key": paths.key, "ca.crt": paths.ca_cert}
    data = {key: path.read_bytes() for key, path in files.items()}
    await write_secrets(
        [(name, "kubernetes.io/tls", data)], namespace=namespace, kubeconfig=kubeconfig
    )


async def write_secrets(
    secrets: Sequence[tuple[str, str, dict[str, bytes]]],
    *,
    namespace: str,
    kubeconfig: str | None = None,
) -> None:
    """Create or replace each Secret ``(name, type, data)`` in ``namespace``, over one
    API client."""
    from kubernetes_asyncio import client
    from kubernetes_asyncio.client.rest import ApiException

    from fairshare.state import informers

    api_client = await informers.make_api_client(kubeconfig)
    async with api_client:
        v1 = client.CoreV1Api(api_client)
        for name, secret_type, data in secrets:
            body: Any = {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": secret_type,
                "metadata": {"name": name, "namespace": namespace},
                "data": {key: base64.b64encode(value).decode() for key, value in data.items()},
            }
            try:
                await v1.create_namespaced_secret(namespace, body)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                await v1.replace_namespaced_secret(name, namespace, body)


async def secret_exists(namespace: str, name: str, *, kubeconfig: str | None = None) -> bool:
    """True if the Secret exists (other API errors propagate)."""
    from kubernetes_asyncio import client
    from kubernetes_asyncio.client.rest import ApiException

    from fairshare.state import informers

    api_client = await informers.make_api_client(kubeconfig)
    async with api_client:
        try:
            await client.CoreV1Api(api_client).read_namespaced_secret(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
    return True


async def _patch_all(
    api: Any, ca_bundle_pem: bytes, *, mutating: Sequence[str], validating: Sequence[str]
) -> list[str]:
    done: list[str] = []
    for kind, names in (("mutating", mutating), ("validating", validating)):
        read = getattr(api, f"read_{kind}_webhook_configuration")
        patch = getattr(api, f"patch_{kind}_webhook_configuration")
        for name in names:
            current = await read(name)
            webhook_names = [webhook.name for webhook in current.webhooks or ()]
            await patch(name, build_ca_bundle_patch(webhook_names, ca_bundle_pem))
            done.append(f"{kind.capitalize()}WebhookConfiguration/{name}")
    return done


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


def _read_not_after(cert_file: Path) -> dt.datetime:
    return x509.load_pem_x509_certificate(cert_file.read_bytes()).not_valid_after_utc


def _write_atomic(path: Path, data: bytes, *, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as file:
        os.fchmod(fd, mode)  # O_CREAT's mode is filtered by the umask and ignored if it exists
        file.write(data)
    os.replace(tmp, path)
