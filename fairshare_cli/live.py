"""``fairshare status`` and ``fairshare explain``: list the live cluster once and feed the
servers' own trackers (the extender's ``Cache``, the webhook's ``UsageTracker``
and ``GangBook``), so every figure is the one the servers would compute.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fairshare.errors import FairshareError
from fairshare_cli.output import print_report


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
            extra=(list_podgroups, lost_runs_reader(args.config_namespace)),
        )
    )
    return (snap, *feed_trackers(snap))


LOST_RUNS = "fairshare.io/LostRuns"
"""The snapshot's key for the runs lost to hardware (``extender.recovery``)."""


def lost_runs_reader(namespace: str) -> Any:
    """An extra list for the snapshot: the runs lost to hardware faults the extender's
    leader recorded in ``namespace`` (none when it recorded none)."""

    async def read(api_client: Any, snap: Any) -> None:
        from kubernetes_asyncio import client

        from extender import recovery

        try:
            runs = await recovery.read_runs(client.CoreV1Api(api_client), namespace)
        except Exception as exc:  # an explanation, never worth failing the command for
            snap.warnings.append(f"runs lost to hardware not read: {exc}")
            return
        snap.objects[LOST_RUNS] = [r.to_dict() for r in runs.values()]

    return read


@dataclass
class ExtenderSide:
    """The extender's cache and kube-scheduler's feedback, fed one listing."""

    cache: Any
    feedback: Any
    sizes: dict[Any, int | None]

    def snapshot(self, config: Any) -> Any:
        """The extender's snapshot for ``config``: verdicts applied, pod groups sized by
        the listed PodGroups (else their annotation)."""
        return self.cache.snapshot(config, feedback=self.feedback, podgroups=(self.sizes, {}))


async def list_podgroups(api_client: Any, snap: Any) -> None:
    """The snapshot's PodGroups (``gangs.podgroups.list_podgroups``: listed when some pod
    is a gang member), under ``gangs.podgroups.KIND``, and the warnings of that list."""
    from fairshare.gangs import podgroups
    from fairshare.state import informers

    found, warnings = await podgroups.list_podgroups(
        informers.custom_object_lister(api_client), snap.objects.get("Pod", [])
    )
    snap.objects[podgroups.KIND] = found
    snap.warnings.extend(warnings)


def feed_trackers(snap: Any) -> Any:
    """The extender's side (``ExtenderSide``) and the webhook's ``UsageTracker``, each fed
    the listing's lists through ``on_resync`` as their watches would feed them."""
    from extender.cache import Cache
    from extender.feedback import Feedback
    from fairshare.state.usage import UsageTracker

    config = snap.config
    tracker = ExtenderSide(Cache(lambda: config), Feedback(), podgroup_sizes(snap))
    snap.feed(tracker.feedback, ("Pod", "ResourceClaim"))
    snap.feed(
        tracker.cache,
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


def _status_once(args: argparse.Namespace) -> dict[str, Any]:
    from fairshare import report

    snap, tracker, usage = _live_state(args)
    config, assessed = snap.config, None
    if snap.config.usage_history is not None and snap.usage_history is not None:
        from fairshare import cluster_shares, history

        seen = tracker.snapshot(config)
        demand = cluster_shares.demand_rows(seen.state, seen.queue)
        config, assessed = history.judge_recorded(
            snap.config, snap.usage_history, now=time.time(), demand=demand
        )
    seen = tracker.snapshot(config)
    out = report.build_status(
        config=config,
        state=seen.state,
        pending=list(seen.queue),
        mix=seen.mix,
        quota=quota_view(snap, usage),
        unreadable=tracker.cache.unreadable,
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
    from fairshare.gangs import podgroups

    return podgroups.min_counts(snap.objects.get(podgroups.KIND, []))


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
    """``gangs.status.group_statuses`` of the snapshot's pod groups (sized by their listed
    PodGroups, else their annotation), as the extender's next member filter would judge
    them (the CLI has no live plan: those are on the extender's status page)."""
    from fairshare import gangs

    seen = tracker.snapshot(config)
    return gangs.status.group_statuses(
        config=config,
        state=seen.state,
        pods=seen.gang_pods,
        pending=seen.pending,
        podgroups=podgroup_sizes(snap),
    )


def group_fits(snap: Any, tracker: Any, config: Any) -> Any:
    """How waiting pod groups count at the gate, as the extender's filter counts them
    (the snapshot's rule)."""
    return tracker.snapshot(config).groups


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
        print_report(_status_once(args), args.output, report.render_status_text)
        return 0
    if not args.watch > 0:
        print("error: --watch must be > 0 seconds", file=sys.stderr)
        return 1
    tty = sys.stdout.isatty()
    # Ctrl-C must end the watch wherever it lands. Inside ``asyncio.run`` the default
    # handling only cancels the running task, and code that turns that cancellation into
    # an error or a result swallows it, so the watch would go on after SIGINT. An own
    # handler makes it a KeyboardInterrupt there too (asyncio.run leaves a handler alone
    # that is not the default one).
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
                print_report(data, args.output, report.render_status_text)
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
    print_report(data, args.output, report.render_explain_text)
    return 0


def explain_report(snap: Any, tracker: Any, usage: Any, pod: dict[str, Any]) -> dict[str, Any]:
    """``report.explain_pod`` for ``pod`` with the webhook's verdict
    (``webhook.dryrun.judge_as_created``: the webhook's usage without the pod's own
    share, as if it were created now)."""
    from fairshare import gangs, report, resources
    from fairshare.preemption import holds
    from fairshare.state import objects
    from webhook.dryrun import judge_as_created

    config = snap.config
    meta = pod.get("metadata") or {}
    ns, name = str(meta.get("namespace")), str(meta.get("name"))
    group = gangs.group_of(pod)
    admission, shown = judge_as_created(
        pod,
        usage=usage,
        config=config,
        book=gang_book(snap, usage),
        podgroup_min=podgroup_sizes(snap).get(group) if group else None,
    )
    uid = objects.pod_uid(pod)
    seen = tracker.snapshot(config)
    req = seen.pending.get(uid)
    error = None
    if req is None:
        try:
            req = objects.pod_request(
                pod,
                config=config,
                tenant=objects.pod_tenant(
                    pod, config=config, namespace_labels=seen.namespace_labels
                ),
                index=seen.state.index,
            )
        except resources.DemandError as exc:
            error = str(exc)
    gang = None
    if group is not None:
        rows = [g for g in gang_statuses(snap, tracker, config) if g.key == group]
        gang = rows[0].as_dict() if rows else None
    from extender import recovery as lost
    from fairshare import recovery

    runs, _ = recovery.runs_from_dict({"runs": snap.objects.get(LOST_RUNS, [])})
    return report.explain_pod(
        config=config,
        state=seen.state,
        pending=list(seen.queue),
        req=req,
        namespace=ns,
        name=name,
        quota=shown,
        admission=admission,
        demand_error=error,
        gang=gang,
        group_fits=group_fits(snap, tracker, config),
        holds=list(seen.holds),
        given=holds.given_rooms(
            (
                (f"{meta.get('namespace')}/{meta.get('name')}", tenant, meta.get("annotations"))
                for uid, p in tracker.cache.pods.items()
                if (meta := p.get("metadata") or {})
                and (tenant := (b.tenant if (b := seen.state.pods.get(uid)) else None))
            ),
            now=time.time(),
            keep=config.take_back_after_seconds(),
        ),
        hardware=lost.explain_run(pod, runs),
    )


def add_parsers(sub: Any) -> None:
    """Add this family's commands to the ``fairshare`` subparsers ``sub``."""
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
