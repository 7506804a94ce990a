"""TLS for the webhook and the extender: certificates (``certs``), the server context and
its hot reload (``serving``), and storing certificates in the cluster (``secrets``: the
Secrets and the webhook configurations' ``caBundle``). kube-apiserver calls admission
webhooks over HTTPS only, checking the certificate against the ``caBundle`` and the
Service DNS name. Every public name is re-exported here.
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
