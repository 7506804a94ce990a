"""The ``fairshare`` command line: config validation, the simulator, the servers, and
``status`` / ``explain`` against a live cluster.

An adapter: it reads files and the environment and prints; the work is done by the
pure core. Errors a user can cause (bad config, bad scenario, missing trace) print a
clear message and exit 1, never a traceback. Must not import aiohttp at module level
(the servers' subcommands import their apps lazily).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Callable, Sequence
from importlib import resources as importlib_resources
from pathlib import Path
from typing import Any, TextIO

from fairshare import __version__
from fairshare.errors import ConfigError, FairshareError

DEFAULT_TRACE = Path("../shared/data/openb")


def _print_config_error(what: str, exc: ConfigError, out: TextIO) -> None:
    print(f"error: {what} is invalid ({len(exc.errors)} problem(s)):", file=out)
    for e in exc.errors:
        print(f"  {e.path}: {e.message}", file=out)


def cmd_config_validate(args: argparse.Namespace) -> int:
    from fairshare.config import loading

    try:
        cfg = loading.load_config_file(args.file)
    except ConfigError as exc:
        _print_config_error(str(args.file), exc, sys.stderr)
        return 1
    names = ", ".join(t.name for t in cfg.tenants) or "none"
    print(f"{args.file}: valid ({len(cfg.tenants)} tenant(s): {names})")
    return 0


def cmd_config_example(args: argparse.Namespace) -> int:
    from fairshare.config import loading

    sys.stdout.write(loading.dump_default_config())
    return 0


class Progress:
    """A progress bar on a terminal; a line every 10 % elsewhere (logs, CI)."""

    def __init__(self, label: str, out: TextIO = sys.stderr) -> None:
        self.label, self.out = label, out
        self.tty = out.isatty()
        self.last = -1
        self.start = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        pct = 100 * done // max(total, 1)
        step = pct if self.tty else pct // 10 * 10
        if step == self.last and done != total:
            return
        self.last = step
        secs = time.monotonic() - self.start
        bar = "#" * (pct // 4) + "." * (25 - pct // 4)
        line = f"{self.label} [{bar}] {pct:3d}% {done}/{total} pods {secs:.0f}s"
        if self.tty:
            self.out.write("\r" + line + ("\n" if done >= total else ""))
        else:
            self.out.write(line + "\n")
        self.out.flush()


def _write_report(report: dict[str, Any], path: Path | None) -> None:
    if path is not None:
        path.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n", encoding="utf-8")
        print(f"report written to {path}", file=sys.stderr)


def cmd_simulate(args: argparse.Namespace) -> int:
    from fairshare.simulator import runner, scenario

    if args.trace is not None or args.pods is not None:
        return _simulate_trace(args)
    if args.demo:
        text = (
            importlib_resources.files("fairshare.simulator")
            .joinpath("scenarios/demo.yaml")
            .read_text(encoding="utf-8")
        )
        what = "built-in demo scenario"
        try:
            loaded = scenario.parse_scenario(text)
        except ConfigError as exc:
            _print_config_error(what, exc, sys.stderr)
            return 1
    elif args.scenario is None:
        print("error: give a SCENARIO file, --demo, or --trace DIR", file=sys.stderr)
        return 1
    else:
        what = str(args.scenario)
        try:
            loaded = scenario.load_scenario(args.scenario)
        except ConfigError as exc:
            _print_config_error(what, exc, sys.stderr)
            return 1
    sim = runner.run_scenario(loaded, policy=args.policy, seed=args.seed)
    report = runner.build_report(sim)
    print(f"fairshare simulate: {what}\n")
    print(runner.render_text(report))
    _write_report(report, args.out)
    if args.plot is not None:
        shares = {n: t["dominantShare"] for n, t in report["tenants"].items()}
        runner.plot(args.plot, curves={}, shares=shares)
    return 0


def _simulate_trace(args: argparse.Namespace) -> int:
    from fairshare.simulator import openb, runner

    trace = args.trace if args.trace is not None else DEFAULT_TRACE
    if not trace.is_dir():
        print(f"error: trace folder {trace} not found. {openb.TRACE_HELP}", file=sys.stderr)
        return 1
    pods = args.pods or "default"
    progress: Callable[[int, int], None] | None = None
    if not args.quiet:
        progress = Progress(f"openb {pods} seed {args.seed} {args.policy}")
    try:
        sim, result = openb.run_trace(
            trace,
            pods=pods,
            seed=args.seed,
            policy=args.policy,
            arrival=args.arrival,
            tenants=args.tenants,
            progress=progress,
        )
    except openb.TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    report = runner.build_report(sim)
    report["trace"] = {
        "pods": pods,
        "seed": args.seed,
        "arrival": args.arrival,
        "placed": result.placed,
        "failed": result.failed,
        "allocationAt100": result.allocation_at(100),
        "curve": {str(k): round(v, 3) for k, v in result.curve.items()},
        "attribution": "Alibaba Cluster Trace Program, cluster-trace-gpu-v2023 (openb); "
        "Weng et al., USENIX ATC '23",
    }
    report.pop("pending", None)
    print(runner.render_text({**report, "pending": {}}))
    at100 = result.allocation_at(100)
    if at100 is not None:
        print(f"GPU allocation at 100 % arrived: {at100:.2f} %")
    _write_report(report, args.out)
    if args.plot is not None:
        shares = {n: t["dominantShare"] for n, t in report["tenants"].items()}
        runner.plot(args.plot, curves={args.policy: result.curve}, shares=shares)
    return 0


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
        _print_config_error("config", exc, sys.stderr)
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
        lambda: serve(
            config_file=args.config_file,
            configmap=args.configmap,
            kubeconfig=args.kubeconfig,
            state_file=args.state_file,
            host=args.host,
            port=args.port,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            **extra,
        ),
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
    from scheduler_plugin.app import Election, serve

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

    from scheduler_plugin.reclaimer import serve

    return _run_async(
        args,
        lambda: serve(
            config_file=args.config_file,
            configmap=args.configmap,
            kubeconfig=args.kubeconfig,
            host=args.host,
            port=args.port,
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


def _cluster_args(p: argparse.ArgumentParser) -> None:
    from fairshare.state import snapshot

    p.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG or ~/.kube/config")
    p.add_argument(
        "--config-namespace",
        default=snapshot.DEFAULT_CONFIG_NAMESPACE,
        help="namespace of the fairshare config ConfigMap (default: %(default)s)",
    )
    p.add_argument(
        "--config-name",
        default=snapshot.DEFAULT_CONFIG_NAME,
        help="name of the fairshare config ConfigMap (default: %(default)s)",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=snapshot.DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="give up on the API after this long (default: %(default)s)",
    )
    p.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")


def _live_state(args: argparse.Namespace) -> Any:
    """List the cluster once and feed the servers' trackers (the extender's and the
    webhook's); returns (snapshot, extender tracker, usage tracker)."""
    import asyncio

    from fairshare.state import snapshot

    if not args.request_timeout > 0:
        raise FairshareError("--request-timeout must be > 0 seconds")
    snap = asyncio.run(
        snapshot.take_snapshot(
            kubeconfig=args.kubeconfig,
            config_ref=(args.config_namespace, args.config_name),
            timeout=args.request_timeout,
        )
    )
    return (snap, *feed_trackers(snap))


def feed_trackers(snap: Any) -> Any:
    """The extender's ``ExtenderTracker`` and the webhook's ``UsageTracker``, each fed the
    snapshot's lists through ``on_resync`` as their watches would feed them."""
    from fairshare.state.usage import UsageTracker
    from scheduler_plugin.tracking import ExtenderTracker

    config = snap.config
    tracker = ExtenderTracker(lambda: config)
    snap.feed(
        tracker,
        (
            "Namespace",
            "DeviceClass",
            "DeviceTaintRule",
            "ResourceSlice",
            "Node",
            "Pod",
            "ResourceClaim",
        ),
    )
    usage = UsageTracker(lambda: config)
    snap.feed(usage)
    return tracker, usage


def _print_report(report: dict[str, Any], output: str, text: Callable[[Any], str]) -> None:
    if output == "json":
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    elif output == "yaml":
        import yaml

        sys.stdout.write(yaml.safe_dump(report, sort_keys=False))
    else:
        sys.stdout.write(text(report))
    sys.stdout.flush()


def _status_once(args: argparse.Namespace) -> dict[str, Any]:
    from fairshare import report

    snap, tracker, usage = _live_state(args)
    config, assessed = snap.config, None
    if snap.config.usage_history is not None and snap.usage_history is not None:
        from fairshare import gating, history

        demand = gating.demand_rows(tracker.state, tracker.pending_queue())
        config, assessed = history.judge_recorded(
            snap.config, snap.usage_history, now=time.time(), demand=demand
        )
    out = report.build_status(
        config=config,
        state=tracker.state,
        pending=tracker.pending_queue(),
        mix=tracker.mix(),
        quota=quota_view(snap, usage),
        unreadable=tracker.unreadable,
        scheduling_gated=scheduling_gated(snap),
        gangs=[g.as_dict() for g in gang_statuses(snap, tracker, config)],
        group_fits=group_fits(snap, tracker, config),
    )
    if snap.warnings:
        out["warnings"] = list(snap.warnings)
    if assessed is not None:
        out["usageHistory"] = report.history_rows(assessed)
    return out


def podgroup_sizes(snap: Any) -> dict[Any, int | None]:
    """``min_count`` of the snapshot's PodGroups, by group (None: it has none)."""
    from fairshare import gangs
    from fairshare.state.snapshot import PODGROUP

    sizes: dict[gangs.GroupKey, int | None] = {}
    for pg in snap.objects.get(PODGROUP, []):
        meta = pg.get("metadata") or {}
        native = str(pg.get("apiVersion", "")).startswith(gangs.NATIVE_GROUP + "/")
        key = gangs.GroupKey(
            str(meta.get("namespace") or "default"), str(meta.get("name") or ""), native
        )
        sizes[key] = gangs.podgroup_min_count(pg)
    return sizes


def gang_book(snap: Any, usage: Any) -> Any:
    """The webhook's accounts of the snapshot's pod groups (``webhook.gangquota``): the
    room held for their missing members counts in their tenants' quota usage."""
    from webhook.gangquota import GangBook

    config = snap.config
    book = GangBook(lambda: config, device_memory=usage.max_device_memory)
    book.on_resync("Pod", list(snap.objects.get("Pod", [])))
    for key, n in podgroup_sizes(snap).items():
        if n is not None:
            book.learn(key, n)
    return book


def quota_view(snap: Any, usage: Any) -> Any:
    """What the webhook checks limits against: its usage plus the gangs' holds."""
    from webhook.gangquota import GangHoldView

    book = gang_book(snap, usage)
    return GangHoldView(usage, book) if book.groups else usage


def gang_statuses(snap: Any, tracker: Any, config: Any) -> list[Any]:
    """``gangstatus.group_statuses`` of the snapshot's pod groups (sized by their listed
    PodGroups, else their annotation), as the extender's next member filter would judge
    them (the CLI has no live plan: those are on the extender's status page)."""
    from fairshare import gangstatus

    return gangstatus.group_statuses(
        config=config,
        state=tracker.state,
        pods=tracker.pods,
        pending=tracker.pending,
        podgroups=podgroup_sizes(snap),
    )


def group_fits(snap: Any, tracker: Any, config: Any) -> Any:
    """How waiting pod groups count at the gate (``gangwait.groups_for``), as the
    extender's filter counts them."""
    from fairshare import gangwait

    return gangwait.groups_for(
        config,
        tracker.state,
        tracker.pods,
        tracker.pending,
        fair=tracker.fair_shares(config),
        sizes=podgroup_sizes(snap),
    )


def scheduling_gated(snap: Any) -> set[str]:
    """Uids of the snapshot's pods that still have ``spec.schedulingGates``."""
    from fairshare.state import objects

    return {
        objects.pod_uid(p)
        for p in snap.objects.get("Pod", [])
        if (p.get("spec") or {}).get("schedulingGates")
    }


def cmd_status(args: argparse.Namespace) -> int:
    from fairshare import report

    if args.watch is None:
        _print_report(_status_once(args), args.output, report.render_status_text)
        return 0
    if not args.watch > 0:
        print("error: --watch must be > 0 seconds", file=sys.stderr)
        return 1
    tty = sys.stdout.isatty()
    # Ctrl-C must end the watch wherever it lands. Inside ``asyncio.run`` the default
    # handling only cancels the running task, and code that turns that cancellation into
    # an error or a result swallows it, so the watch goes on (a CI run once saw it outlive
    # SIGINT by a minute). An own handler makes it a KeyboardInterrupt there too
    # (asyncio.run leaves a handler alone that is not the default one).
    previous = signal.signal(signal.SIGINT, _raise_interrupt)
    try:
        while True:
            try:
                data = _status_once(args)
            except FairshareError as exc:
                # A watch outlives a blip of the API: say so and try again next round.
                print(f"error: {exc}", file=sys.stderr)
            else:
                if tty and args.output == "table":
                    sys.stdout.write("\x1b[H\x1b[2J")
                    print(time.strftime("%H:%M:%S"), f"every {args.watch:g}s")
                _print_report(data, args.output, report.render_status_text)
                if not tty or args.output != "table":
                    print("---" if args.output == "yaml" else "", flush=True)
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGINT, previous)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _explain_target(args: argparse.Namespace, snap: Any) -> dict[str, Any]:
    """The pod to explain: from the cluster (NAMESPACE/POD) or a file (``-f``)."""
    import yaml

    if (args.pod is None) == (args.file is None):
        raise FairshareError("give NAMESPACE/POD or -f pod.yaml (one of them)")
    if args.file is not None:
        try:
            doc = yaml.safe_load(Path(args.file).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise FairshareError(f"cannot read {args.file}: {exc}") from exc
        if not isinstance(doc, dict) or doc.get("kind") != "Pod":
            raise FairshareError(f"{args.file}: expected one object of kind: Pod")
        meta = doc.setdefault("metadata", {})
        if not isinstance(meta, dict) or not meta.get("name"):
            raise FairshareError(f"{args.file}: metadata.name is missing")
        meta["namespace"] = args.namespace or meta.get("namespace") or "default"
        meta.setdefault("uid", f"explain:{meta['namespace']}/{meta['name']}")
        return dict(doc)
    ns, sep, name = str(args.pod).partition("/")
    if not sep:
        ns, name = args.namespace or "default", str(args.pod)
    for pod in snap.objects.get("Pod", []):
        meta = pod.get("metadata") or {}
        if meta.get("namespace") == ns and meta.get("name") == name:
            return dict(pod)
    raise FairshareError(f"pod {ns}/{name} not found")


def cmd_explain(args: argparse.Namespace) -> int:
    from fairshare import report

    snap, tracker, usage = _live_state(args)
    pod = _explain_target(args, snap)
    data = explain_report(snap, tracker, usage, pod)
    if snap.warnings:
        data["warnings"] = list(snap.warnings)
    _print_report(data, args.output, report.render_explain_text)
    return 0


def explain_report(snap: Any, tracker: Any, usage: Any, pod: dict[str, Any]) -> dict[str, Any]:
    """``report.explain_pod`` for ``pod`` with the webhook's verdict (``review.judge`` on
    the webhook's usage without the pod's own share, as if it were created now)."""
    import uuid

    from fairshare import report, resources, tenancy
    from fairshare.state import objects
    from webhook import review, wire

    config = snap.config
    meta = pod.get("metadata") or {}
    ns, name = str(meta.get("namespace")), str(meta.get("name"))
    tenant = tenancy.resolve_tenant(ns, usage.namespace_labels(ns), config).tenant
    from fairshare import gangs
    from webhook.gangquota import GangHoldView

    own = usage.pods.get(usage.pod_names.get(f"{ns}/{name}", ""), (ns, {}))[1]
    view = report.ExcludingView(usage, ns, own, tenant)
    group = gangs.group_of(pod)
    book = gang_book(snap, usage)
    context = (
        review.GangContext(book, podgroup_min=podgroup_sizes(snap).get(group)) if group else None
    )
    if context is None and book.groups:
        context = review.GangContext(book)
    shown = GangHoldView(view, book, exclude=(group, name) if group else None)
    body = {
        "apiVersion": wire.API_VERSION,
        "kind": wire.KIND,
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": name,
            "namespace": ns,
            "operation": "CREATE",
            "object": pod,
            "dryRun": True,
        },
    }
    verdict = review.judge(
        wire.decode_review(json.dumps(body).encode()),
        view=view,
        config=config,
        phase="validate",
        gang=context,
    )
    response = verdict.response
    admission = report.AdmissionVerdict(
        allowed=response.allowed,
        message=response.status.message if response.status else "",
        warnings=tuple(response.warnings),
    )
    uid = objects.pod_uid(pod)
    req = tracker.pending.get(uid)
    error = None
    if req is None:
        try:
            req = objects.pod_request(
                pod,
                config=config,
                tenant=objects.pod_tenant(
                    pod, config=config, namespace_labels=tracker.namespace_labels
                ),
                index=tracker.state.index,
            )
        except resources.DemandError as exc:
            error = str(exc)
    gang = None
    if group is not None:
        rows = [g for g in gang_statuses(snap, tracker, config) if g.key == group]
        gang = rows[0].as_dict() if rows else None
    return report.explain_pod(
        config=config,
        state=tracker.state,
        pending=tracker.pending_queue(),
        req=req,
        namespace=ns,
        name=name,
        quota=shown,
        admission=admission,
        demand_error=error,
        gang=gang,
        group_fits=group_fits(snap, tracker, config),
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fairshare",
        description="Fair-share admission webhook and scheduler extender for GPU clusters.",
    )
    p.add_argument("--version", action="version", version=f"fairshare {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    cfg = sub.add_parser("config", help="validate or print FairShareConfig documents")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True)
    v = cfg_sub.add_parser("validate", help="check a config file; exit 1 listing every error")
    v.add_argument("file", type=Path)
    v.set_defaults(func=cmd_config_validate)
    ex = cfg_sub.add_parser("example", help="print a commented example config")
    ex.set_defaults(func=cmd_config_example)

    sim = sub.add_parser("simulate", help="replay a scenario or the openb trace")
    sim.add_argument("scenario", nargs="?", type=Path, help="a kind: Scenario YAML file")
    sim.add_argument("--demo", action="store_true", help="run the built-in demo scenario")
    sim.add_argument("--trace", type=Path, default=None, help="openb trace folder")
    sim.add_argument("--pods", default=None, help="openb pod list name (default: default)")
    sim.add_argument("--seed", type=int, default=42)
    sim.add_argument("--policy", choices=("ours", "bestfit", "fgd"), default="ours")
    sim.add_argument("--arrival", type=float, default=1.0, help="trace: stop at this × GPUs")
    sim.add_argument("--tenants", type=int, default=0, help="trace: K synthetic tenants")
    sim.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    sim.add_argument("--plot", type=Path, default=None, help="write a PNG plot here")
    sim.add_argument("--quiet", action="store_true", help="no progress bar")
    sim.set_defaults(func=cmd_simulate)

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

    st = sub.add_parser(
        "status",
        help="per-tenant usage, shares and pods, and cluster GPU figures, from the live cluster",
    )
    _cluster_args(st)
    st.add_argument(
        "--watch",
        type=float,
        nargs="?",
        const=5.0,
        default=None,
        metavar="SECONDS",
        help="list again and redraw every SECONDS (default 5)",
    )
    st.set_defaults(func=cmd_status)
    xp = sub.add_parser(
        "explain",
        help="what the webhook and the extender would say about a pod now",
    )
    xp.add_argument("pod", nargs="?", default=None, help="NAMESPACE/POD in the cluster")
    xp.add_argument("-f", "--file", default=None, help="a Pod manifest not created yet")
    xp.add_argument("-n", "--namespace", default=None, help="namespace for -f or a bare POD")
    _cluster_args(xp)
    xp.set_defaults(func=cmd_explain)

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
    return p


def kubectl_main(argv: Sequence[str] | None = None) -> int:
    """``kubectl fairshare ...``: the same commands as a kubectl plugin."""
    return main(argv, prog="kubectl fairshare")


def main(argv: Sequence[str] | None = None, *, prog: str = "fairshare") -> int:
    parser = build_parser()
    parser.prog = prog
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except FairshareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
