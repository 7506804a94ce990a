"""TLS for the webhook and the extender: certificates, server contexts, hot reload, and
storing the certificates in the cluster.

kube-apiserver only calls admission webhooks over HTTPS, and it checks the serving
certificate against the ``caBundle`` of the webhook configuration and the service DNS name
it dials (``NAME.NS.svc``). This package covers that whole path, one job a module:

- ``fairshare.tls.certs``: make certificates (``cryptography``) and write / read them as
  files; no network.
- ``fairshare.tls.serving``: the server ``SSLContext`` and ``CertReloader``, which swaps a
  rotated certificate into new handshakes without a restart.
- ``fairshare.tls.secrets``: write Secrets and patch the webhook configurations'
  ``caBundle`` through the API (``kubernetes_asyncio``, imported inside the functions).

Every public name is re-exported here, so ``from fairshare import tls`` keeps working.
Adapter package: file I/O and (lazily) ``kubernetes_asyncio`` are allowed. It must not
import ``aiohttp``, ``webhook`` or ``extender``.
"""

from __future__ import annotations

from fairshare.tls.certs import (
    CLIENTS,
    CLOCK_SKEW,
    CertPaths,
    ClientCertPaths,
    TLSError,
    admission_configuration,
    admission_kubeconfig,
    make_ca,
    make_client_cert,
    make_serving_cert,
    read_client_certs,
    service_dns_names,
    write_certs,
    write_client_certs,
)
from fairshare.tls.secrets import (
    build_ca_bundle_patch,
    patch_webhook_ca_bundle,
    secret_exists,
    write_secrets,
    write_tls_secret,
)
from fairshare.tls.serving import CIPHERS_TLS12, CertReloader, server_ssl_context

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
    "write_tls_secret",
]
