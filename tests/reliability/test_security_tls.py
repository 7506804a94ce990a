"""TLS and client-certificate authentication, with real handshakes on 127.0.0.1.

``--client-ca``: the admission paths (webhook) and the verbs (extender) need a client
certificate signed by the configured CA with ``clientAuth`` usage; ``/healthz``,
``/readyz`` and ``/metrics`` stay open on the same port for kubelet and Prometheus. A
rotated serving certificate keeps the requirement. TLS 1.0/1.1 are refused and only
ECDHE + AEAD suites are negotiated.
"""

from __future__ import annotations

import datetime as dt
import http.client
import json
import ssl
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fairshare import tls
from tests.reliability.conftest import LiveServer, extender_app, extender_pod, webhook_app
from tests.reliability.test_hostile_input import (
    admission_review,
    check_admission_answer,
    check_filter_answer,
)

NOW = dt.datetime.now(dt.UTC)


def client_cert(
    ca_pem: bytes, ca_key_pem: bytes, *, cn: str = "kube-apiserver", usage: Any = None
) -> tuple[bytes, bytes]:
    """A leaf certificate for a TLS client (EKU clientAuth unless ``usage`` says else)."""
    ca = x509.load_pem_x509_certificate(ca_pem)
    ca_key: Any = serialization.load_pem_private_key(ca_key_pem, password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - dt.timedelta(minutes=5))
        .not_valid_after(NOW + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(usage or [ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


@dataclass
class Pki:
    root: Path
    server_ca: Path
    server_cert: Path
    server_key: Path
    client_ca: Path
    good: tuple[Path, Path]  # signed by the client CA, clientAuth
    foreign: tuple[Path, Path]  # signed by another CA
    server_usage: tuple[Path, Path]  # signed by the client CA, serverAuth only

    def rotate_serving_cert(self) -> None:
        ca_pem, ca_key = (
            (self.root / "server-ca.crt").read_bytes(),
            (self.root / "server-ca.key").read_bytes(),
        )
        cert, key = tls.make_serving_cert(
            ca_pem, ca_key, dns_names=["localhost"], ip_addresses=["127.0.0.1"], days=2, now=NOW
        )
        self.server_cert.write_bytes(cert)
        self.server_key.write_bytes(key)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")

    def write(name: str, data: bytes) -> Path:
        (root / name).write_bytes(data)
        return root / name

    server_ca, server_ca_key = tls.make_ca("server-ca", days=1, now=NOW)
    write("server-ca.key", server_ca_key)
    cert, key = tls.make_serving_cert(
        server_ca,
        server_ca_key,
        dns_names=["localhost"],
        ip_addresses=["127.0.0.1"],
        days=1,
        now=NOW,
    )
    client_ca, client_ca_key = tls.make_ca("apiserver-client-ca", days=1, now=NOW)
    other_ca, other_ca_key = tls.make_ca("someone-else", days=1, now=NOW)
    good = client_cert(client_ca, client_ca_key)
    foreign = client_cert(other_ca, other_ca_key)
    server_only = client_cert(
        client_ca, client_ca_key, usage=[ExtendedKeyUsageOID.SERVER_AUTH], cn="not-a-client"
    )
    return Pki(
        root=root,
        server_ca=write("server-ca.crt", server_ca),
        server_cert=write("tls.crt", cert),
        server_key=write("tls.key", key),
        client_ca=write("client-ca.crt", client_ca),
        good=(write("good.crt", good[0]), write("good.key", good[1])),
        foreign=(write("foreign.crt", foreign[0]), write("foreign.key", foreign[1])),
        server_usage=(write("srv.crt", server_only[0]), write("srv.key", server_only[1])),
    )


def client_context(pki: Pki, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.server_ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    return ctx


def call(
    port: int, ctx: ssl.SSLContext, method: str, path: str, body: bytes | None = None
) -> tuple[int, bytes]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def peer_cert(port: int, ctx: ssl.SSLContext) -> bytes | None:
    with (
        ssl.create_connection(("127.0.0.1", port)) as sock,
        ctx.wrap_socket(sock, server_hostname="127.0.0.1") as tls_sock,
    ):
        return tls_sock.getpeercert(binary_form=True)


def negotiated(port: int, ctx: ssl.SSLContext) -> tuple[str, str]:
    with (
        ssl.create_connection(("127.0.0.1", port)) as sock,
        ctx.wrap_socket(sock, server_hostname="127.0.0.1") as tls_sock,
    ):
        cipher, proto, _ = tls_sock.cipher() or ("", "", 0)
    return cipher, proto


def refused(port: int, ctx: ssl.SSLContext, path: str, body: bytes) -> bool:
    """True when the server aborts the handshake (TLS 1.3: on the client's first read)."""
    try:
        call(port, ctx, "POST", path, body)
    except (ssl.SSLError, ConnectionError, http.client.RemoteDisconnected):
        return True
    return False


@pytest.fixture(scope="module")
def webhook_tls(pki: Pki) -> Iterator[tuple[LiveServer, tls.CertReloader]]:
    reloader = tls.CertReloader(pki.server_cert, pki.server_key, client_ca=pki.client_ca)
    assert reloader.requires_client_cert
    app, _deps = webhook_app(client_cert=True)
    with LiveServer(app, ssl_context=reloader.context) as server:
        yield server, reloader


@pytest.fixture(scope="module")
def extender_tls(pki: Pki) -> Iterator[LiveServer]:
    reloader = tls.CertReloader(pki.server_cert, pki.server_key, client_ca=pki.client_ca)
    app, _deps = extender_app(client_cert=True)
    with LiveServer(app, ssl_context=reloader.context) as server:
        yield server


REVIEW = json.dumps(admission_review()).encode()
FILTER = json.dumps({"Pod": extender_pod(1), "NodeNames": ["n1"]}).encode()


# --------------------------------------------------------------------------- webhook


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_webhook_admits_with_a_client_certificate(webhook_tls, pki, path):
    status, data = call(webhook_tls[0].port, client_context(pki, pki.good), "POST", path, REVIEW)
    assert status == 200
    check_admission_answer(data)


@pytest.mark.parametrize("path", ["/mutate", "/validate", "/anything-else"])
def test_webhook_refuses_admission_without_a_client_certificate(webhook_tls, pki, path):
    status, data = call(webhook_tls[0].port, client_context(pki), "POST", path, REVIEW)
    assert status == 403, data
    assert b"client certificate required" in data


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
def test_webhook_probes_and_metrics_need_no_client_certificate(webhook_tls, pki, path):
    status, _ = call(webhook_tls[0].port, client_context(pki), "GET", path)
    assert status == 200


@pytest.mark.parametrize("which", ["foreign", "server_usage"])
def test_webhook_refuses_untrusted_or_non_client_certificates(webhook_tls, pki, which):
    ctx = client_context(pki, getattr(pki, which))
    assert refused(webhook_tls[0].port, ctx, "/validate", REVIEW)
    # and the server is still fine for a good client
    status, _ = call(
        webhook_tls[0].port, client_context(pki, pki.good), "POST", "/validate", REVIEW
    )
    assert status == 200


def test_rotated_serving_certificate_keeps_client_authentication(webhook_tls, pki):
    server, reloader = webhook_tls
    before = x509.load_pem_x509_certificate(pki.server_cert.read_bytes()).serial_number
    pki.rotate_serving_cert()
    assert reloader.maybe_reload()
    after = x509.load_pem_x509_certificate(pki.server_cert.read_bytes()).serial_number
    assert before != after
    ctx = client_context(pki, pki.good)
    status, _ = call(server.port, ctx, "POST", "/validate", REVIEW)
    assert status == 200
    der = peer_cert(server.port, ctx)  # the new certificate is served
    assert der is not None and x509.load_der_x509_certificate(der).serial_number == after
    assert call(server.port, client_context(pki), "POST", "/validate", REVIEW)[0] == 403
    assert refused(server.port, client_context(pki, pki.foreign), "/validate", REVIEW)
    assert call(server.port, client_context(pki), "GET", "/healthz")[0] == 200


# --------------------------------------------------------------------------- extender


@pytest.mark.parametrize("path", ["/filter", "/scheduler/filter"])
def test_extender_verbs_with_a_client_certificate(extender_tls, pki, path):
    status, data = call(extender_tls.port, client_context(pki, pki.good), "POST", path, FILTER)
    assert status == 200
    check_filter_answer(data)


@pytest.mark.parametrize(
    "path", ["/filter", "/prioritize", "/preempt", "/bind", "/scheduler/bind", "/scheduler/x"]
)
def test_extender_refuses_verbs_without_a_client_certificate(extender_tls, pki, path):
    status, _ = call(extender_tls.port, client_context(pki), "POST", path, FILTER)
    assert status == 403


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics", "/status", "/status.json"])
def test_extender_probes_need_no_client_certificate(extender_tls, pki, path):
    assert call(extender_tls.port, client_context(pki), "GET", path)[0] == 200


def test_extender_refuses_a_foreign_client_certificate(extender_tls, pki):
    assert refused(extender_tls.port, client_context(pki, pki.foreign), "/filter", FILTER)


def test_client_ca_is_off_by_default_in_the_apps(pki):
    # Without --client-ca nothing changes: the existing deployments keep working.
    reloader = tls.CertReloader(pki.server_cert, pki.server_key)
    assert not reloader.requires_client_cert
    app, _ = webhook_app()
    with LiveServer(app, ssl_context=reloader.context) as server:
        assert call(server.port, client_context(pki), "POST", "/validate", REVIEW)[0] == 200


# --------------------------------------------------------------------------- protocol, ciphers


def legacy_client(pki: Pki, version: ssl.TLSVersion) -> ssl.SSLContext:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(str(pki.server_ca))
        ctx.minimum_version = version
        ctx.maximum_version = version
        ctx.set_ciphers("ALL:@SECLEVEL=0")
    return ctx


@pytest.mark.parametrize("version", ["TLSv1", "TLSv1_1"])
def test_tls_1_0_and_1_1_refused(extender_tls, pki, version):
    ctx = legacy_client(pki, getattr(ssl.TLSVersion, version))
    with pytest.raises((ssl.SSLError, ConnectionError)):
        call(extender_tls.port, ctx, "GET", "/healthz")


WEAK = {
    "CBC": "AES128-SHA:AES256-SHA:ECDHE-RSA-AES128-SHA:ECDHE-ECDSA-AES128-SHA:"
    "ECDHE-ECDSA-AES256-SHA384:ECDHE-ECDSA-AES128-SHA256",
    "RC4": "RC4",
    "3DES": "3DES:DES-CBC3-SHA",
    "non-ECDHE": "AES128-GCM-SHA256:AES256-GCM-SHA384",
    "NULL": "eNULL:aNULL",
}


@pytest.mark.parametrize("family", sorted(WEAK))
def test_weak_tls12_ciphers_refused(extender_tls, pki, family):
    ctx = legacy_client(pki, ssl.TLSVersion.TLSv1_2)
    try:
        ctx.set_ciphers(WEAK[family] + ":@SECLEVEL=0")
    except ssl.SSLError:
        # This OpenSSL has no such suite (Debian's: RC4, 3DES), so no client can offer
        # one here; the server's own list, on the same library, has none either.
        server = tls.server_ssl_context(pki.server_cert, pki.server_key, client_ca=pki.client_ca)
        names = [suite["name"] for suite in server.get_ciphers()]
        marker = {"3DES": "DES"}.get(family, family)
        assert not [n for n in names if marker in n], names
        return
    with pytest.raises((ssl.SSLError, ConnectionError)):
        call(extender_tls.port, ctx, "GET", "/healthz")


def test_negotiated_suites_are_ecdhe_aead(extender_tls, pki):
    for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
        ctx = client_context(pki)
        ctx.minimum_version = ctx.maximum_version = version
        ctx.set_ciphers("ALL")
        cipher, proto = negotiated(extender_tls.port, ctx)
        assert proto == {"TLSv1_2": "TLSv1.2", "TLSv1_3": "TLSv1.3"}[version.name]
        assert "GCM" in cipher or "CHACHA20" in cipher, cipher
        if version is ssl.TLSVersion.TLSv1_2:
            assert cipher.startswith("ECDHE-"), cipher


def test_server_context_offers_no_weak_suite(pki):
    ctx = tls.server_ssl_context(pki.server_cert, pki.server_key, client_ca=pki.client_ca)
    assert ctx.minimum_version is ssl.TLSVersion.TLSv1_2
    assert ctx.verify_mode is ssl.CERT_OPTIONAL
    for suite in ctx.get_ciphers():
        name = suite["name"]
        assert suite["aead"], name
        assert not any(bad in name for bad in ("CBC", "RC4", "DES", "NULL", "MD5", "EXPORT"))
        if suite["protocol"] == "TLSv1.2":
            assert suite["kea"] == "kx-ecdhe", name


# --------------------------------------------------------------------------- the CLI flag


@pytest.mark.parametrize("command", ["webhook", "extender"])
def test_cli_client_ca_needs_tls(command, capsys, tmp_path):
    from fairshare_cli import main as cli

    config = tmp_path / "c.yaml"
    config.write_text("apiVersion: fairshare.io/v1alpha1\nkind: FairShareConfig\n")
    argv = [command, "--config", str(config), "--state", str(config), "--client-ca", "ca.crt"]
    assert cli.main(argv) == 1
    assert "--client-ca needs --tls-cert and --tls-key" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("command", "module"), [("webhook", "webhook.app"), ("extender", "extender.serve")]
)
def test_cli_passes_client_ca_to_the_server(command, module, monkeypatch, pki):
    import importlib

    from fairshare_cli import main as cli

    seen: dict[str, Any] = {}

    async def fake_serve(**kwargs: Any) -> None:
        seen.update(kwargs)

    monkeypatch.setattr(importlib.import_module(module), "serve", fake_serve)
    argv = [
        command,
        "--config",
        "c.yaml",
        "--tls-cert",
        str(pki.server_cert),
        "--tls-key",
        str(pki.server_key),
        "--client-ca",
        str(pki.client_ca),
    ]
    assert cli.main(argv) == 0
    assert seen["client_ca"] == str(pki.client_ca)
    # The serving certificate travels in the one options object (serving.ServerOptions).
    assert seen["options"].tls_cert == str(pki.server_cert)
