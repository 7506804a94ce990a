"""Certificates into the cluster through the API: the ``kubernetes.io/tls`` and Opaque
Secrets ``fairshare certs`` / ``client-certs`` write, and the ``caBundle`` of the
Mutating/Validating webhook configurations.

Adapter: ``kubernetes_asyncio`` is imported inside the functions, so making certificates
(``fairshare.tls.certs``) never loads the Kubernetes client.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from fairshare.tls.certs import CertPaths

__all__ = [
    "build_ca_bundle_patch",
    "patch_webhook_ca_bundle",
    "secret_exists",
    "write_secrets",
    "write_tls_secret",
]


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
