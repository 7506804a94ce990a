"""Tests of fairshare.tls: certificate contents, real handshakes on loopback, hot reload.

Handshakes run against a real ``ssl`` server on 127.0.0.1 (a thread with blocking
sockets, plus one asyncio server as aiohttp uses), and a client that trusts only our CA,
so chain building, SAN matching and protocol limits are OpenSSL's own verdicts.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import os
import queue
import socket
import ssl
import stat
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fairshare import tls

SERVICE, NAMESPACE = "fairshare-webhook", "fairshare-system"
FIXED_NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)


# --------------------------------------------------------------------------- helpers


@dataclass(frozen=True)
class CA:
    cert_pem: bytes
    key_pem: bytes
    path: Path


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CA:
    cert_pem, key_pem = tls.make_ca("test-ca", days=30, now=dt.datetime.now(dt.UTC))
    path = tmp_path_factory.mktemp("ca") / "ca.crt"
    path.write_bytes(cert_pem)
    return CA(cert_pem, key_pem, path)


def mint(ca: CA) -> tuple[bytes, bytes]:
    """A serving pair for the test service and 127.0.0.1, valid now."""
    return tls.make_serving_cert(
        ca.cert_pem,
        ca.key_pem,
        dns_names=tls.service_dns_names(SERVICE, NAMESPACE),
        ip_addresses=["127.0.0.1"],
        days=1,
        now=dt.datetime.now(dt.UTC),
    )


class SecretVolume:
    """A directory laid out as kubelet mounts a Secret, rotated the way kubelet does it.

    ``tls.crt -> ..data/tls.crt``, ``..data -> ..<generation>``; a rotation writes a new
    generation directory and swaps the ``..data`` symlink atomically.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.generation = 0
        self.cert = root / "tls.crt"
        self.key = root / "tls.key"

    def publish(self, cert_pem: bytes, key_pem: bytes) -> None:
        self.generation += 1
        target = self.root / f"..gen_{self.generation}"
        target.mkdir()
        (target / "tls.crt").write_bytes(cert_pem)
        (target / "tls.key").write_bytes(key_pem)
        staging = self.root / "..data_tmp"
        staging.symlink_to(target.name)
        os.replace(staging, self.root / "..data")
        for name in ("tls.crt", "tls.key"):
            if not (self.root / name).is_symlink():
                (self.root / name).symlink_to(f"..data/{name}")


@pytest.fixture
def volume(tmp_path: Path, ca: CA) -> SecretVolume:
    vol = SecretVolume(tmp_path)
    vol.publish(*mint(ca))
    return vol


@dataclass
class ThreadedTLSServer:
    """Accepts on 127.0.0.1, handshakes with ``context()``, sends b"ok", closes.

    Each connection's outcome (None or the server-side exception) goes to ``results``.
    """

    context: Callable[[], ssl.SSLContext]
    results: queue.Queue[BaseException | None] = field(default_factory=queue.Queue)

    def __post_init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.port: int = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                try:
                    with self.context().wrap_socket(conn, server_side=True) as stream:
                        stream.sendall(b"ok")
                    self.results.put(None)
                except (ssl.SSLError, OSError) as error:
                    self.results.put(error)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()

    def outcome(self) -> BaseException | None:
        return self.results.get(timeout=5)


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[], ssl.SSLContext]], ThreadedTLSServer]]:
    servers: list[ThreadedTLSServer] = []

    def start(context: Callable[[], ssl.SSLContext]) -> ThreadedTLSServer:
        servers.append(ThreadedTLSServer(context))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def trusting(ca: CA) -> ssl.SSLContext:
    """A client context that trusts only the test CA and checks host names."""
    return ssl.create_default_context(cafile=str(ca.path))


def handshake(
    port: int, client: ssl.SSLContext, server_hostname: str | None = "127.0.0.1"
) -> tuple[x509.Certificate, str | None, str]:
    """Connect, read b"ok"; return the server certificate, protocol version and cipher."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        client.wrap_socket(raw, server_hostname=server_hostname) as stream,
    ):
        assert stream.recv(2) == b"ok"
        der = stream.getpeercert(binary_form=True)
        assert der is not None
        cipher = stream.cipher()
        assert cipher is not None
        return x509.load_der_x509_certificate(der), stream.version(), cipher[0]


def legacy_client(maximum: ssl.TLSVersion) -> ssl.SSLContext:
    """A client willing to speak old protocols, so that the *server* is what refuses."""
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    # Setting TLS 1.0/1.1 bounds is deprecated in Python's ssl; that is the point here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        client.minimum_version = ssl.TLSVersion.TLSv1
        client.maximum_version = maximum
    client.set_ciphers("ALL:@SECLEVEL=0")
    return client


# --------------------------------------------------------------------------- certificates


def test_service_dns_names() -> None:
    assert tls.service_dns_names("web", "ns") == (
        "web",
        "web.ns",
        "web.ns.svc",
        "web.ns.svc.cluster.local",
    )


def test_ca_is_a_ca() -> None:
    cert_pem, _ = tls.make_ca("fairshare-ca", days=10, now=FIXED_NOW)
    cert = x509.load_pem_x509_certificate(cert_pem)
    basic = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert basic.critical and basic.value.ca
    assert usage.critical and usage.value.key_cert_sign
    cert.verify_directly_issued_by(cert)  # self-signed
    # Validity: FIXED_NOW - 5 min skew .. FIXED_NOW + 10 days.
    assert cert.not_valid_before_utc == FIXED_NOW - tls.CLOCK_SKEW
    assert cert.not_valid_after_utc == FIXED_NOW + dt.timedelta(days=10)


def test_serving_cert_contents() -> None:
    ca_pem, ca_key = tls.make_ca("fairshare-ca", days=10, now=FIXED_NOW)
    cert_pem, key_pem = tls.make_serving_cert(
        ca_pem,
        ca_key,
        dns_names=tls.service_dns_names("web", "ns"),
        ip_addresses=["127.0.0.1", "::1"],
        days=3,
        now=FIXED_NOW,
    )
    cert = x509.load_pem_x509_certificate(cert_pem)
    ca_cert = x509.load_pem_x509_certificate(ca_pem)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [
        "web",
        "web.ns",
        "web.ns.svc",
        "web.ns.svc.cluster.local",
    ]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "::1"]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert cert.issuer == ca_cert.subject
    cert.verify_directly_issued_by(ca_cert)
    assert cert.not_valid_after_utc == FIXED_NOW + dt.timedelta(days=3)
    assert key_pem.startswith(b"-----BEGIN PRIVATE KEY-----")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dns_names": [], "ip_addresses": []}, "at least one"),
        ({"days": 0}, "days"),
        ({"now": dt.datetime(2026, 1, 1)}, "timezone"),  # naive on purpose
        ({"other_ca_key": True}, "does not match"),
        ({"ip_addresses": ["10.0.0.300"]}, "does not appear to be an IPv4 or IPv6"),
    ],
    ids=["no-names", "zero-days", "naive-now", "foreign-ca-key", "bad-ip"],
)
def test_serving_cert_rejects(kwargs: dict[str, Any], message: str) -> None:
    ca_pem, ca_key = tls.make_ca("ca", days=1, now=FIXED_NOW)
    if kwargs.pop("other_ca_key", False):
        _, ca_key = tls.make_ca("other", days=1, now=FIXED_NOW)
    args: dict[str, Any] = {"dns_names": ["web"], "days": 1, "now": FIXED_NOW, **kwargs}
    with pytest.raises(tls.TLSError, match=message):
        tls.make_serving_cert(ca_pem, ca_key, **args)


def test_serving_cert_from_external_rsa_ca_without_key_identifier() -> None:
    # A CA made by another tool: RSA 2048, no SubjectKeyIdentifier extension.
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "external")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(FIXED_NOW)
        .not_valid_after(FIXED_NOW + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    cert_pem, _ = tls.make_serving_cert(
        ca_cert.public_bytes(serialization.Encoding.PEM),
        key_pem,
        dns_names=["web"],
        days=1,
        now=FIXED_NOW,
    )
    cert = x509.load_pem_x509_certificate(cert_pem)
    cert.verify_directly_issued_by(ca_cert)
    aki = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    assert aki.key_identifier == x509.SubjectKeyIdentifier.from_public_key(key.public_key()).digest


def test_write_certs(tmp_path: Path) -> None:
    paths = tls.write_certs(
        tmp_path / "out", service="web", namespace="ns", ip_addresses=["10.0.0.1"]
    )
    assert (paths.ca_cert.name, paths.cert.name, paths.key.name) == ("ca.crt", "tls.crt", "tls.key")
    assert stat.S_IMODE(paths.key.stat().st_mode) == 0o600
    cert = x509.load_pem_x509_certificate(paths.cert.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "web.ns.svc" in sans.get_values_for_type(x509.DNSName)
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["10.0.0.1"]
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(paths.ca_cert.read_bytes()))
    assert sorted(p.name for p in paths.ca_cert.parent.iterdir()) == [
        "ca.crt",
        "tls.crt",
        "tls.key",
    ]


def test_write_client_certs(tmp_path: Path) -> None:
    paths = tls.write_client_certs(tmp_path / "c", days=2)
    ca = x509.load_pem_x509_certificate(paths.ca_cert.read_bytes())
    assert set(paths.clients) == set(tls.CLIENTS)
    for stem, (cert_path, key_path) in paths.clients.items():
        assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        cert.verify_directly_issued_by(ca)
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]  # never a serving cert
        cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
        assert cn == tls.CLIENTS[stem]
    # --reuse reads back the same files; a pair from another CA is refused.
    again = tls.read_client_certs(tmp_path / "c")
    assert again == paths
    other = tls.write_client_certs(tmp_path / "other")
    cert, _key = other.clients["scheduler-client"]
    (tmp_path / "c" / "scheduler-client.crt").write_bytes(cert.read_bytes())
    with pytest.raises(tls.TLSError, match="was not issued by"):
        tls.read_client_certs(tmp_path / "c")
    with pytest.raises(tls.TLSError, match="missing"):
        tls.read_client_certs(tmp_path / "empty")
    with pytest.raises(tls.TLSError, match="no clients"):
        tls.write_client_certs(tmp_path / "none", clients={})


def test_make_client_cert_rejects_bad_input() -> None:
    now = dt.datetime.now(dt.UTC)
    ca_pem, ca_key = tls.make_ca("c", days=1, now=now)
    with pytest.raises(tls.TLSError, match="common name"):
        tls.make_client_cert(ca_pem, ca_key, common_name="", days=1, now=now)
    with pytest.raises(tls.TLSError, match="days"):
        tls.make_client_cert(ca_pem, ca_key, common_name="x", days=0, now=now)
    _, other_key = tls.make_ca("other", days=1, now=now)
    with pytest.raises(tls.TLSError, match="does not match"):
        tls.make_client_cert(ca_pem, other_key, common_name="x", days=1, now=now)


def test_admission_configuration_points_both_plugins_at_the_kubeconfig() -> None:
    config = tls.admission_configuration("/etc/k/adm.yaml")
    assert config["kind"] == "AdmissionConfiguration"
    assert config["apiVersion"] == "apiserver.config.k8s.io/v1"
    names = [p["name"] for p in config["plugins"]]
    assert names == ["ValidatingAdmissionWebhook", "MutatingAdmissionWebhook"]
    for plugin in config["plugins"]:
        conf = plugin["configuration"]
        # The kind kube-apiserver v1 registers for this file (WebhookAdmissionConfiguration).
        assert conf["kind"] == "WebhookAdmissionConfiguration"
        assert conf["kubeConfigFile"] == "/etc/k/adm.yaml"
    assert config["plugins"][0]["configuration"] is not config["plugins"][1]["configuration"]
    kubeconfig = tls.admission_kubeconfig("svc.ns.svc", "/c.crt", "/c.key")
    (user,) = kubeconfig["users"]
    assert user == {
        "name": "svc.ns.svc",
        "user": {"client-certificate": "/c.crt", "client-key": "/c.key"},
    }


# --------------------------------------------------------------------------- handshakes


@pytest.mark.parametrize(
    "server_hostname",
    ["127.0.0.1", f"{SERVICE}.{NAMESPACE}.svc", f"{SERVICE}.{NAMESPACE}.svc.cluster.local"],
)
def test_handshake_verifies_against_ca(
    serve: Any, volume: SecretVolume, ca: CA, server_hostname: str
) -> None:
    context = tls.server_ssl_context(volume.cert, volume.key)
    server = serve(lambda: context)
    cert, version, _ = handshake(server.port, trusting(ca), server_hostname)
    assert server.outcome() is None
    assert version == "TLSv1.3"
    assert cert.public_bytes(serialization.Encoding.PEM) == volume.cert.read_bytes()


@pytest.mark.parametrize(
    ("server_hostname", "foreign_ca"),
    [("other.svc", False), ("127.0.0.1", True)],
    ids=["wrong-name", "untrusted-ca"],
)
def test_handshake_fails_verification(
    serve: Any, volume: SecretVolume, ca: CA, server_hostname: str, foreign_ca: bool, tmp_path: Path
) -> None:
    context = tls.server_ssl_context(volume.cert, volume.key)
    server = serve(lambda: context)
    client = trusting(ca)
    if foreign_ca:
        other = tmp_path / "other-ca.crt"
        other.write_bytes(tls.make_ca("other", days=1, now=dt.datetime.now(dt.UTC))[0])
        client = ssl.create_default_context(cafile=str(other))
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(server.port, client, server_hostname)
    assert server.outcome() is not None  # the client aborted the handshake


def test_tls_1_1_refused_by_server(serve: Any, volume: SecretVolume) -> None:
    context = tls.server_ssl_context(volume.cert, volume.key)
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    server = serve(lambda: context)
    with pytest.raises(ssl.SSLError):
        handshake(server.port, legacy_client(ssl.TLSVersion.TLSv1_1), None)
    error = server.outcome()
    assert isinstance(error, ssl.SSLError)
    assert "UNSUPPORTED_PROTOCOL" in str(error)  # the server said no, not the client


def test_tls_1_2_uses_ecdhe_aead_only(serve: Any, volume: SecretVolume) -> None:
    context = tls.server_ssl_context(volume.cert, volume.key)
    assert context.options & ssl.OP_NO_COMPRESSION
    server = serve(lambda: context)
    _, version, cipher = handshake(server.port, legacy_client(ssl.TLSVersion.TLSv1_2), None)
    assert version == "TLSv1.2"
    assert cipher.startswith("ECDHE-") and ("GCM" in cipher or "CHACHA20" in cipher)
    assert server.outcome() is None
    # A TLS 1.2 client that only offers CBC suites finds no shared cipher.
    cbc_only = legacy_client(ssl.TLSVersion.TLSv1_2)
    cbc_only.set_ciphers("ECDHE-ECDSA-AES128-SHA256:ECDHE-ECDSA-AES128-SHA:@SECLEVEL=0")
    with pytest.raises(ssl.SSLError):
        handshake(server.port, cbc_only, None)
    assert isinstance(server.outcome(), ssl.SSLError)


# --------------------------------------------------------------------------- reloading


def serial_of(port: int, ca: CA) -> int:
    return handshake(port, trusting(ca), f"{SERVICE}.{NAMESPACE}.svc")[0].serial_number


def test_reload_serves_rotated_cert_to_new_connections(
    serve: Any, volume: SecretVolume, ca: CA
) -> None:
    reloader = tls.CertReloader(volume.cert, volume.key)
    server = serve(lambda: reloader.context)  # one context object, as a TCPSite holds it
    first = serial_of(server.port, ca)
    assert not reloader.maybe_reload()  # unchanged files: nothing to do

    volume.publish(*mint(ca))
    assert reloader.maybe_reload()
    second = serial_of(server.port, ca)
    assert second != first
    assert second == x509.load_pem_x509_certificate(volume.cert.read_bytes()).serial_number
    assert reloader.reloads == 1
    assert not reloader.maybe_reload()


@pytest.mark.parametrize(
    "breakage",
    ["truncated-cert", "garbage-key", "key-from-other-pair"],
)
def test_invalid_rotation_keeps_last_good(
    serve: Any, volume: SecretVolume, ca: CA, breakage: str
) -> None:
    errors: list[Exception] = []
    reloader = tls.CertReloader(volume.cert, volume.key, on_error=errors.append)
    server = serve(lambda: reloader.context)
    first = serial_of(server.port, ca)
    good_cert, good_key = mint(ca)
    broken = {
        "truncated-cert": (good_cert[: len(good_cert) // 2], good_key),  # half-written
        "garbage-key": (good_cert, b"not a key"),
        "key-from-other-pair": (good_cert, mint(ca)[1]),
    }[breakage]
    volume.publish(*broken)

    assert not reloader.maybe_reload()
    assert reloader.last_error is not None and errors == [reloader.last_error]
    assert serial_of(server.port, ca) == first
    assert not reloader.maybe_reload()  # reported once, not on every tick

    volume.publish(good_cert, good_key)  # the rotation completes
    assert reloader.maybe_reload()
    assert reloader.last_error is None
    assert serial_of(server.port, ca) == x509.load_pem_x509_certificate(good_cert).serial_number


def test_missing_file_keeps_last_good(volume: SecretVolume) -> None:
    reloader = tls.CertReloader(volume.cert, volume.key)
    before = reloader.current
    os.replace(volume.root / "..data", volume.root / "..gone")
    assert not reloader.maybe_reload()
    assert isinstance(reloader.last_error, FileNotFoundError)
    assert reloader.current is before


def test_reloader_fails_fast_on_bad_initial_files(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_bytes(b"junk")
    (tmp_path / "tls.key").write_bytes(b"junk")
    with pytest.raises(ssl.SSLError):
        tls.CertReloader(tmp_path / "tls.crt", tmp_path / "tls.key")


def test_not_after_follows_rotation(volume: SecretVolume, ca: CA) -> None:
    reloader = tls.CertReloader(volume.cert, volume.key)
    first = reloader.not_after
    cert_pem, key_pem = tls.make_serving_cert(
        ca.cert_pem,
        ca.key_pem,
        dns_names=["x"],
        days=2,
        now=dt.datetime.now(dt.UTC),
    )
    volume.publish(cert_pem, key_pem)
    assert reloader.maybe_reload()
    assert reloader.not_after > first  # 2 days instead of 1


def test_serving_reloader_reports_expiry_and_reloads_to_metrics(
    volume: SecretVolume, ca: CA
) -> None:
    from prometheus_client import CollectorRegistry

    import serving
    from fairshare.metrics import Metrics

    registry = CollectorRegistry()
    reloader = serving.cert_reloader(
        str(volume.cert), str(volume.key), client_ca=None, metrics=Metrics(registry)
    )

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels or None)

    expiry = "fairshare_tls_cert_expiry_timestamp_seconds"
    assert sample(expiry) == reloader.not_after.timestamp()  # set at start, not only on reload
    cert_pem, key_pem = tls.make_serving_cert(
        ca.cert_pem, ca.key_pem, dns_names=["x"], days=3, now=dt.datetime.now(dt.UTC)
    )
    volume.publish(cert_pem, key_pem)
    assert reloader.maybe_reload()
    assert sample(expiry) == reloader.not_after.timestamp()
    assert sample("fairshare_tls_reloads_total") == 1.0
    volume.publish(b"not a certificate", key_pem)
    assert not reloader.maybe_reload()
    assert sample("fairshare_tls_reload_errors_total") == 1.0
    assert sample(expiry) == reloader.not_after.timestamp()  # the good one still serves


async def test_asyncio_server_gets_rotated_cert(volume: SecretVolume, ca: CA) -> None:
    """The same swap works for asyncio's SSLObject, which aiohttp's server uses."""
    reloader = tls.CertReloader(volume.cert, volume.key)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"ok")
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    async def serial(port: int) -> int:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=trusting(ca), server_hostname=f"{SERVICE}.{NAMESPACE}.svc"
        )
        assert await reader.read(2) == b"ok"
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
        await writer.wait_closed()
        return x509.load_der_x509_certificate(der).serial_number

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=reloader.context)
    async with server:
        port = server.sockets[0].getsockname()[1]
        first = await serial(port)
        volume.publish(*mint(ca))
        assert reloader.maybe_reload()
        assert await serial(port) != first


async def test_run_polls_until_cancelled(volume: SecretVolume, ca: CA) -> None:
    reloader = tls.CertReloader(volume.cert, volume.key)
    task = asyncio.create_task(reloader.run(interval=0.01))
    volume.publish(*mint(ca))
    for _ in range(500):
        if reloader.reloads:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert reloader.reloads == 1


# --------------------------------------------------------------------------- webhook configs


def test_build_ca_bundle_patch() -> None:
    bundle = base64.b64encode(b"PEM").decode()
    assert tls.build_ca_bundle_patch(["a.fairshare.io", "b.fairshare.io"], b"PEM") == [
        {"op": "test", "path": "/webhooks/0/name", "value": "a.fairshare.io"},
        {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": bundle},
        {"op": "test", "path": "/webhooks/1/name", "value": "b.fairshare.io"},
        {"op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": bundle},
    ]


class FakeAdmissionApi:
    """Stands in for AdmissionregistrationV1Api: configs by name, patches recorded."""

    def __init__(self, webhooks: dict[str, list[str]]) -> None:
        self.webhooks = webhooks
        self.patches: list[tuple[str, str, list[dict[str, Any]]]] = []

    def _config(self, name: str) -> SimpleNamespace:
        return SimpleNamespace(webhooks=[SimpleNamespace(name=w) for w in self.webhooks[name]])

    async def read_mutating_webhook_configuration(self, name: str) -> SimpleNamespace:
        return self._config(name)

    async def read_validating_webhook_configuration(self, name: str) -> SimpleNamespace:
        return self._config(name)

    async def patch_mutating_webhook_configuration(self, name: str, body: Any) -> None:
        self.patches.append(("mutating", name, body))

    async def patch_validating_webhook_configuration(self, name: str, body: Any) -> None:
        self.patches.append(("validating", name, body))


async def test_patch_webhook_ca_bundle_patches_every_webhook() -> None:
    api = FakeAdmissionApi(
        {"fairshare-mutate": ["m.fairshare.io"], "fairshare-validate": ["p", "q"]}
    )
    done = await tls.patch_webhook_ca_bundle(
        b"PEM", mutating=["fairshare-mutate"], validating=["fairshare-validate"], api=api
    )
    assert done == [
        "MutatingWebhookConfiguration/fairshare-mutate",
        "ValidatingWebhookConfiguration/fairshare-validate",
    ]
    assert [(kind, name, len(body)) for kind, name, body in api.patches] == [
        ("mutating", "fairshare-mutate", 2),  # test + add for one webhook
        ("validating", "fairshare-validate", 4),  # two webhooks
    ]


async def test_serving_reloader_counts_one_handshake_per_connection(
    volume: SecretVolume, ca: CA
) -> None:
    """Requests on a kept-alive connection add no handshake; a new connection adds one."""
    import aiohttp
    from aiohttp import web
    from prometheus_client import CollectorRegistry

    import serving
    from fairshare.metrics import Metrics

    registry = CollectorRegistry()
    reloader = serving.cert_reloader(
        str(volume.cert), str(volume.key), client_ca=None, metrics=Metrics(registry)
    )

    async def ok(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=reloader.context)
    await site.start()
    port = runner.addresses[0][1]

    def handshakes() -> float | None:
        return registry.get_sample_value("fairshare_tls_handshakes_total")

    async def session() -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(ssl=trusting(ca), limit=1)
        return aiohttp.ClientSession(connector=connector)

    async def served_serial() -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=trusting(ca))
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (await reader.read()).endswith(b"ok")
        writer.close()
        await writer.wait_closed()
        return x509.load_der_x509_certificate(der).serial_number

    try:
        assert handshakes() == 0
        async with await session() as client:
            for _ in range(3):
                async with client.get(f"https://127.0.0.1:{port}/") as resp:
                    assert await resp.text() == "ok"
            assert handshakes() == 1
        async with await session() as client, client.get(f"https://127.0.0.1:{port}/") as resp:
            assert await resp.text() == "ok"
        assert handshakes() == 2
        # The rotation swap still runs behind the count: new connections get the new pair.
        before = await served_serial()
        volume.publish(*mint(ca))
        assert reloader.maybe_reload()
        assert await served_serial() != before
        assert handshakes() == 4
    finally:
        await runner.cleanup()
