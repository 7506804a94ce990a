"""``fairshare certs`` and ``fairshare client-certs``: make the serving and client
certificates (``fairshare.tls``) and, when asked, store them as Secrets or patch the
webhook configurations' ``caBundle`` through the API.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def cmd_certs(args: argparse.Namespace) -> int:
    import asyncio

    from fairshare import tls

    paths = tls.write_certs(
        args.out,
        service=args.service,
        namespace=args.namespace,
        ip_addresses=tuple(args.ip),
        days=args.days,
    )
    print(f"wrote {paths.ca_cert}, {paths.cert}, {paths.key}")
    mutating = [n for n in (args.patch_mutating or "").split(",") if n]
    validating = [n for n in (args.patch_validating or "").split(",") if n]
    if mutating or validating:
        patched = asyncio.run(
            tls.patch_webhook_ca_bundle(
                paths.ca_cert.read_bytes(),
                mutating=mutating,
                validating=validating,
                kubeconfig=args.kubeconfig,
            )
        )
        print(f"caBundle patched into: {', '.join(patched) or 'nothing'}")
    if args.secret:
        asyncio.run(
            tls.write_tls_secret(
                paths, namespace=args.namespace, name=args.secret, kubeconfig=args.kubeconfig
            )
        )
        print(f"secret {args.namespace}/{args.secret} written")
    return 0


CLIENT_SECRETS = {
    "apiserver-client": "fairshare-apiserver-client",
    "scheduler-client": "fairshare-scheduler-client",
}
CLIENT_CA_SECRET = "fairshare-client-ca"


def cmd_client_certs(args: argparse.Namespace) -> int:
    import asyncio

    import yaml

    from fairshare import tls

    if args.keep_existing and not args.secrets:
        print("error: --keep-existing needs --secrets NAMESPACE", file=sys.stderr)
        return 1
    if args.keep_existing and asyncio.run(
        tls.secret_exists(args.secrets, CLIENT_CA_SECRET, kubeconfig=args.kubeconfig)
    ):
        print(
            f"secret {args.secrets}/{CLIENT_CA_SECRET} exists; keeping the client CA "
            "(delete that Secret to rotate)"
        )
        return 0
    if args.reuse:
        try:
            paths = tls.read_client_certs(args.out)
        except tls.TLSError as exc:
            print(f"error: --reuse: {exc}", file=sys.stderr)
            return 1
    else:
        paths = tls.write_client_certs(args.out, days=args.days)
    node_dir = args.node_dir.rstrip("/")
    cert, key = paths.clients["apiserver-client"]
    kubeconfig = tls.admission_kubeconfig(
        args.webhook_user, f"{node_dir}/{cert.name}", f"{node_dir}/{key.name}"
    )
    (args.out / "admission-kubeconfig.yaml").write_text(yaml.safe_dump(kubeconfig))
    admission = tls.admission_configuration(f"{node_dir}/admission-kubeconfig.yaml")
    (args.out / "admission-config.yaml").write_text(yaml.safe_dump(admission, sort_keys=False))
    print(
        f"wrote {paths.ca_cert}, "
        + ", ".join(f"{c.name}/{k.name}" for c, k in paths.clients.values())
        + ", admission-kubeconfig.yaml, admission-config.yaml"
    )
    if args.secrets:
        ca = paths.ca_cert.read_bytes()
        writes = [(CLIENT_CA_SECRET, "Opaque", {"ca.crt": ca})]
        for stem, (c, k) in paths.clients.items():
            data = {"tls.crt": c.read_bytes(), "tls.key": k.read_bytes(), "ca.crt": ca}
            writes.append((CLIENT_SECRETS[stem], "kubernetes.io/tls", data))
        asyncio.run(tls.write_secrets(writes, namespace=args.secrets, kubeconfig=args.kubeconfig))
        for name, _kind, _data in writes:
            print(f"secret {args.secrets}/{name} written")
    return 0


def add_parsers(sub: Any) -> None:
    """Add this family's commands to the ``fairshare`` subparsers ``sub``."""
    certs = sub.add_parser("certs", help="make a CA and a serving certificate for a Service")
    certs.add_argument("--service", required=True, help="Service name (for the DNS SANs)")
    certs.add_argument("--namespace", required=True)
    certs.add_argument("--out", type=Path, required=True, help="directory for ca.crt, tls.*")
    certs.add_argument("--ip", action="append", default=[], help="IP SAN (repeatable)")
    certs.add_argument("--days", type=int, default=365)
    certs.add_argument("--secret", default=None, help="also write this kubernetes.io/tls Secret")
    certs.add_argument(
        "--patch-mutating", default=None, help="MutatingWebhookConfiguration names (comma list)"
    )
    certs.add_argument(
        "--patch-validating", default=None, help="ValidatingWebhookConfiguration names"
    )
    certs.add_argument("--kubeconfig", default=None, help="default: in-cluster config")
    certs.set_defaults(func=cmd_certs)

    cc = sub.add_parser(
        "client-certs",
        help="make the client CA and certificates kube-apiserver and kube-scheduler present "
        "to --client-ca servers",
    )
    cc.add_argument("--out", type=Path, required=True, help="directory for the files")
    cc.add_argument("--days", type=int, default=365)
    cc.add_argument(
        "--node-dir",
        default="/etc/kubernetes/fairshare",
        help="where the files will be on the control-plane node (paths in the admission "
        "kubeconfig and config)",
    )
    cc.add_argument(
        "--webhook-user",
        default="fairshare-webhook.fairshare-system.svc",
        help="kubeconfig user name kube-apiserver matches against the webhook it dials "
        "('*' = every webhook)",
    )
    cc.add_argument(
        "--secrets",
        metavar="NAMESPACE",
        default=None,
        help=f"also write the Secrets {CLIENT_CA_SECRET}, "
        + ", ".join(CLIENT_SECRETS.values())
        + " in NAMESPACE",
    )
    cc.add_argument(
        "--keep-existing",
        action="store_true",
        help=f"do nothing if Secret {CLIENT_CA_SECRET} already exists (re-runnable Job)",
    )
    cc.add_argument(
        "--reuse",
        action="store_true",
        help="use the CA and certificates already in --out instead of minting new ones "
        "(e.g. to store them as Secrets after the control plane was given them)",
    )
    cc.add_argument("--kubeconfig", default=None, help="default: in-cluster config")
    cc.set_defaults(func=cmd_client_certs)
