"""``fairshare webhook``, ``extender``, ``gpu-reporter`` and ``reclaimer``: the long-running
processes. Each command imports its app inside its function, so the other commands never
load aiohttp.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from fairshare.errors import ConfigError, FairshareError
from fairshare_cli.output import print_config_error


def _serve_args(p: argparse.ArgumentParser, *, port: int) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", dest="config_file", help="FairShareConfig YAML file (polled)")
    src.add_argument("--configmap", help="NAMESPACE/NAME of the config ConfigMap (watched)")
    state = p.add_mutually_exclusive_group()
    state.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster config)")
    state.add_argument(
        "--state", dest="state_file", help="a Kubernetes List file instead of the API"
    )
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=port)
    p.add_argument("--tls-cert", help="serving certificate (re-read when it changes)")
    p.add_argument("--tls-key", help="serving key")
    p.add_argument(
        "--client-ca",
        help="CA file: require a client certificate signed by it on every path except "
        "/healthz, /readyz, /metrics and /status (needs --tls-cert/--tls-key)",
    )
    p.add_argument(
        "--not-ready-after",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="/readyz fails once the API has been unreachable this long (default 10)",
    )
    p.add_argument("--log-level", default="INFO")


def _run_async(args: argparse.Namespace, main: Callable[[], Any]) -> int:
    """Log at ``--log-level`` and run the coroutine ``main()`` until it ends or Ctrl-C;
    a config error at startup prints its field paths and exits 1."""
    import asyncio
    import logging

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        asyncio.run(main())
    except ConfigError as exc:
        print_config_error("config", exc, sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


def _run_server(args: argparse.Namespace, serve: Callable[..., Any], **extra: Any) -> int:
    if bool(args.tls_cert) != bool(args.tls_key):
        print("error: give both --tls-cert and --tls-key, or neither", file=sys.stderr)
        return 1
    if args.client_ca and not args.tls_cert:
        print("error: --client-ca needs --tls-cert and --tls-key", file=sys.stderr)
        return 1
    if args.client_ca:
        extra["client_ca"] = args.client_ca
    if not args.not_ready_after > 0:
        print("error: --not-ready-after must be > 0 seconds", file=sys.stderr)
        return 1
    extra["stale_after"] = args.not_ready_after
    return _run_async(
        args,
        lambda: serve(options=_server_options(args), **extra),
    )


def _server_options(args: argparse.Namespace) -> Any:
    """The options every server takes alike (``serving.ServerOptions``); a reclaimer has
    no ``--state`` and no serving certificate."""
    import serving

    return serving.ServerOptions(
        host=args.host,
        port=args.port,
        config_file=args.config_file,
        configmap=args.configmap,
        kubeconfig=args.kubeconfig,
        state_file=getattr(args, "state_file", None),
        tls_cert=getattr(args, "tls_cert", None),
        tls_key=getattr(args, "tls_key", None),
    )


def cmd_webhook(args: argparse.Namespace) -> int:
    from webhook.app import serve

    return _run_server(
        args,
        serve,
        reservation_ttl=args.reservation_ttl,
        shared_reservations=args.shared_reservations,
    )


def cmd_extender(args: argparse.Namespace) -> int:
    from extender.serve import Election, serve

    if args.lease is None:
        if args.leader_label_pod is not None:
            print("error: --leader-label-pod needs --lease", file=sys.stderr)
            return 1
        return _run_server(args, serve, pick_in_filter=args.pick_in_filter)
    if args.state_file is not None:
        print("error: --lease needs the API; a --state run has a single replica", file=sys.stderr)
        return 1
    for flag, ref in (("--lease", args.lease), ("--leader-label-pod", args.leader_label_pod)):
        ns, _, rest = (ref or "x/x").partition("/")
        if not ns or not rest or "/" in rest:
            print(f"error: {flag} wants NAMESPACE/NAME, got {ref!r}", file=sys.stderr)
            return 1
    namespace, _, name = args.lease.partition("/")
    election = Election(
        namespace=namespace,
        name=name,
        identity=args.identity or default_identity(),
        lease_duration=args.lease_duration,
        renew_deadline=args.renew_deadline,
        retry_period=args.retry_period,
        label_pod=args.leader_label_pod,
    )
    return _run_server(args, serve, election=election, pick_in_filter=args.pick_in_filter)


def default_identity() -> str:
    """``hostname_random``: unique per process, so a restarted replica is a new holder."""
    import socket
    import uuid

    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def cmd_gpu_reporter(args: argparse.Namespace) -> int:
    import asyncio
    import contextlib
    import logging
    import os

    from fairshare import gpu_reporter
    from fairshare.state import informers

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s: %(message)s"
    )

    async def main() -> None:
        from kubernetes_asyncio import client

        api_client = await informers.make_api_client(args.kubeconfig)
        async with api_client:
            core = client.CoreV1Api(api_client)

            async def patch(namespace: str, name: str, body: dict[str, Any]) -> None:
                try:
                    await core.patch_namespaced_pod(name, namespace, body)
                except client.ApiException as exc:
                    raise FairshareError(
                        f"cannot annotate pod {namespace}/{name}: HTTP {exc.status} {exc.reason}"
                    ) from exc
                logging.info("reported %s on pod %s/%s", body, namespace, name)

            await gpu_reporter.run(dict(os.environ), patch)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
    return 0


def cmd_reclaimer(args: argparse.Namespace) -> int:
    import socket

    from extender.reclaimer import serve

    return _run_async(
        args,
        lambda: serve(
            options=_server_options(args),
            interval=args.interval,
            cooldown=args.cooldown,
            max_per_minute=args.max_evictions_per_minute,
            grace_period=args.grace_period,
            lease=args.lease,
            identity=args.identity or socket.gethostname(),
            lease_duration=args.lease_duration,
        ),
    )


def _reclaimer_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", dest="config_file", help="FairShareConfig YAML file (polled)")
    src.add_argument("--configmap", help="NAMESPACE/NAME of the config ConfigMap (watched)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster config)")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8889, help="/metrics, /healthz, /readyz")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between rounds")
    p.add_argument(
        "--cooldown",
        type=float,
        default=60.0,
        help="seconds before a reclaim decision may be undone (victim -> beneficiary)",
    )
    p.add_argument("--max-evictions-per-minute", type=int, default=10, help="sliding 60 s window")
    p.add_argument(
        "--grace-period", type=int, default=None, help="eviction grace seconds (default: pod's)"
    )
    p.add_argument(
        "--lease",
        default="fairshare-system/fairshare-reclaimer",
        help="NAMESPACE/NAME of the leader-election Lease",
    )
    p.add_argument("--lease-duration", type=int, default=15, help="seconds")
    p.add_argument("--identity", default=None, help="holder identity (default: hostname)")
    p.add_argument("--log-level", default="INFO")


def add_parsers(sub: Any) -> None:
    """Add this family's commands to the ``fairshare`` subparsers ``sub``."""
    wh = sub.add_parser("webhook", help="run the admission webhook (HTTPS)")
    _serve_args(wh, port=8443)
    wh.add_argument(
        "--reservation-ttl",
        type=float,
        default=30.0,
        help="seconds an admitted pod counts before its watch event arrives",
    )
    wh.add_argument(
        "--shared-reservations",
        metavar="NAMESPACE",
        default=None,
        help="run several replicas safely: keep reservations in per-tenant Leases "
        "in NAMESPACE, updated by compare-and-swap",
    )
    wh.set_defaults(func=cmd_webhook)
    ext = sub.add_parser("extender", help="run the kube-scheduler extender")
    _serve_args(ext, port=8888)
    ext.add_argument(
        "--lease",
        metavar="NAMESPACE/NAME",
        default=None,
        help="run several replicas safely: only the holder of this Lease decides and is "
        "ready (default: no election, one replica)",
    )
    ext.add_argument(
        "--lease-duration", type=int, default=15, help="seconds a Lease holds unrenewed"
    )
    ext.add_argument(
        "--renew-deadline",
        type=float,
        default=10.0,
        help="seconds the leader keeps deciding without a successful renewal",
    )
    ext.add_argument(
        "--retry-period", type=float, default=2.0, help="seconds between Lease attempts"
    )
    ext.add_argument("--identity", default=None, help="holder identity (default: hostname_random)")
    ext.add_argument(
        "--leader-label-pod",
        metavar="NAMESPACE/NAME",
        default=None,
        help="this replica's own pod: labelled fairshare.io/extender-leader=true while it "
        "leads (select it in the Service)",
    )
    ext.add_argument(
        "--pick-in-filter",
        action="store_true",
        help="filter answers only the passing node prioritize would score highest, so "
        "kube-scheduler skips scoring and one round trip per pod (its own scoring plugins "
        "then no longer choose among nodes for these pods; default: off)",
    )
    ext.set_defaults(func=cmd_extender)
    rep = sub.add_parser(
        "gpu-reporter",
        help="in a reservation pod: report the GPU it holds on the pod, then wait",
    )
    rep.add_argument("--kubeconfig", default=None, help="default: the in-cluster service account")
    rep.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    rep.set_defaults(func=cmd_gpu_reporter)
    rec = sub.add_parser(
        "reclaimer", help="run the reclaim controller (evicts borrowed pods for guarantees)"
    )
    _reclaimer_args(rec)
    rec.set_defaults(func=cmd_reclaimer)
