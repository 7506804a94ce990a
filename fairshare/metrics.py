"""Prometheus metrics of fairshare, as one object over a registry the caller owns.

``Metrics(registry)`` declares every metric on the ``CollectorRegistry`` it is given;
each app builds its own, and the default registry is never touched. Names take the
``fairshare_`` prefix and base units; label values come from code and config, never from
request bodies, so the cardinality is bounded by the config.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, choose_encoder, generate_latest
from prometheus_client.registry import Collector

__all__ = [
    "ADMISSION_BUCKETS",
    "CHARGEBACK_SERIES",
    "EXTENDER_BUCKETS",
    "RECLAIM_BUCKETS",
    "ChargebackRows",
    "Metrics",
    "render",
]

#: Admission latency buckets (seconds): dense below 10 ms, where the p99 target lies.
ADMISSION_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.5,
    1.0,
)

#: Extender verb latency buckets (seconds): sub-millisecond filter/prioritize at 500
#: candidates up to bind, which waits on the API server.
EXTENDER_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)

#: Time for a tenant under its guarantee to get it back (seconds): reclaim waits for
#: evictions, grace periods and the scheduler, so seconds to minutes.
RECLAIM_BUCKETS = (1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 300.0, 600.0)

_PER_RESOURCE = ("usage", "limit", "reserved")

#: The chargeback gauges (``docs/chargeback.md``): name -> (help, label names). Each is a
#: pure function of the pods bound now and the config, computed at scrape time, so every
#: replica exports the same values and a restart loses nothing (``max by`` dedups).
CHARGEBACK_SERIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "fairshare_pod_gpu_allocation": (
        "Chargeback: the pod's share of one physical GPU (1 whole, a fraction, a MIG "
        "slice's or a DRA share's part; device mig/pool: of the node's GPU pool).",
        ("namespace", "pod", "container", "node", "device", "tenant", "gpu_model"),
    ),
    "fairshare_pod_gpu_idle_allocation": (
        "Chargeback: the part of the GPU's idle remainder attributed to the pod (the "
        "remainder of a GPU held in part, pro rata to its holders' shares).",
        ("namespace", "pod", "container", "node", "device", "tenant", "gpu_model"),
    ),
    "fairshare_gpu_capacity": (
        "Chargeback: GPUs behind one device key of a node (1 per GPU; a MIG or DRA pool its GPUs).",
        ("node", "device", "gpu_model"),
    ),
    "fairshare_pod_resource_allocation": (
        "Chargeback: the pod's request of a non-GPU resource (cores, bytes).",
        ("namespace", "pod", "node", "tenant", "resource"),
    ),
    "fairshare_node_gpu_hourly_price": (
        "Chargeback: the config's price of one GPU-hour on the node (per node, else per "
        "GPU model, else per resource).",
        ("node", "gpu_model"),
    ),
    "fairshare_node_resource_hourly_price": (
        "Chargeback: the config's price of one unit-hour of a non-GPU resource on the node.",
        ("node", "resource"),
    ),
}

ChargebackRows = Mapping[str, Sequence[tuple[Sequence[str], float]]]
"""Series name (a key of ``CHARGEBACK_SERIES``) -> (label values, value) rows."""


class _ChargebackCollector(Collector):
    def __init__(self) -> None:
        self.source: Callable[[], ChargebackRows | None] | None = None

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return []  # computed at scrape time: no fixed description

    def collect(self) -> Iterator[GaugeMetricFamily]:
        rows = self.source() if self.source is not None else None
        if rows is None:
            return
        for name, (text, labels) in CHARGEBACK_SERIES.items():
            family = GaugeMetricFamily(name, text, labels=list(labels))
            for values, value in rows.get(name, ()):
                family.add_metric(list(values), value)
            yield family


class Metrics:
    """Every fairshare metric, declared on ``registry``.

    Both apps use the same class; each sets the series it knows about (the webhook the
    admission and reservation figures, the extender the verb, share and chargeback ones).
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._labelled: dict[int, set[str]] = {}
        self._chargeback = _ChargebackCollector()
        registry.register(self._chargeback)
        r = registry
        self.gpu_handoff_seconds = Histogram(
            "fairshare_gpu_handoff_seconds",
            "Seconds from a fractional pod's bind to its GPU ConfigMap written "
            "(the reservation pod's report included)",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
            registry=r,
        )
        self.gpu_handoff_problems = Counter(
            "fairshare_gpu_handoff_problems_total",
            "Shared-GPU handoff problems surfaced on pods, by problem "
            "(report_timeout, reservation_lost, configmap_conflict, api_error)",
            ["problem"],
            registry=r,
        )
        self.gpu_reservations = Counter(
            "fairshare_gpu_reservations_total",
            "Reservation pods created and deleted, by action",
            ["action"],
            registry=r,
        )
        self.admission_requests = Counter(
            "fairshare_admission_requests_total",
            "Admission reviews answered, by operation, decision and reason code.",
            ["operation", "decision", "reason"],
            registry=r,
        )
        self.admission_duration = Histogram(
            "fairshare_admission_duration_seconds",
            "Time to answer one admission review, from decoded body to encoded response.",
            ["operation"],
            buckets=ADMISSION_BUCKETS,
            registry=r,
        )
        self.extender_requests = Counter(
            "fairshare_extender_requests_total",
            "Scheduler extender calls, by verb (filter, prioritize, preempt, bind) and outcome.",
            ["verb", "outcome"],
            registry=r,
        )
        self.extender_duration = Histogram(
            "fairshare_extender_request_duration_seconds",
            "Time to answer one scheduler extender call, by verb.",
            ["verb"],
            buckets=EXTENDER_BUCKETS,
            registry=r,
        )
        self.unexpected_errors = Counter(
            "fairshare_unexpected_errors_total",
            "Exceptions that escaped a policy or verb and were answered by the error path.",
            ["component"],
            registry=r,
        )
        self.config_reloads = Counter(
            "fairshare_config_reloads_total",
            "Config updates validated and swapped in.",
            registry=r,
        )
        self.config_reload_errors = Counter(
            "fairshare_config_reload_errors_total",
            "Config updates refused as invalid; the last good config stayed in force.",
            registry=r,
        )
        self.tls_reloads = Counter(
            "fairshare_tls_reloads_total",
            "Serving certificate rotations picked up without restart.",
            registry=r,
        )
        self.tls_reload_errors = Counter(
            "fairshare_tls_reload_errors_total",
            "Rotated certificate files that failed to load; the last good pair stayed.",
            registry=r,
        )
        self.tls_handshakes = Counter(
            "fairshare_tls_handshakes_total",
            "TLS handshakes on the serving port, one per new connection. Clients that "
            "keep connections alive (kube-apiserver, kube-scheduler) make it grow far "
            "slower than the request counters; a rate near theirs means no reuse.",
            registry=r,
        )
        self.tls_cert_expiry = Gauge(
            "fairshare_tls_cert_expiry_timestamp_seconds",
            "Expiry (Unix time) of the serving certificate in use.",
            registry=r,
        )
        self.tenant_usage = Gauge(
            "fairshare_tenant_usage",
            "Tenant usage by resource, in canonical units (cores, bytes, GPUs).",
            ["tenant", "resource"],
            registry=r,
        )
        self.tenant_limit = Gauge(
            "fairshare_tenant_limit",
            "Tenant hard limit by resource, in canonical units; absent when unlimited.",
            ["tenant", "resource"],
            registry=r,
        )
        self.tenant_reserved = Gauge(
            "fairshare_tenant_reserved",
            "Admitted but not yet observed requests held against the tenant, by resource.",
            ["tenant", "resource"],
            registry=r,
        )
        self.tenant_dominant_share = Gauge(
            "fairshare_tenant_dominant_share",
            "Weighted dominant share of the tenant (max over resources of used/capacity).",
            ["tenant"],
            registry=r,
        )
        self.tenant_fair_share = Gauge(
            "fairshare_tenant_fair_share",
            "Dominant share the tenant is entitled to under weighted DRF water-filling.",
            ["tenant"],
            registry=r,
        )
        self.tenant_gated_pods = Gauge(
            "fairshare_tenant_gated_pods",
            "Pending pods of the tenant the fair-share gate refused at their last filter.",
            ["tenant"],
            registry=r,
        )
        self.tenant_gangs_waiting = Gauge(
            "fairshare_tenant_gangs_waiting",
            "Pod groups (gangs) of the tenant with members pending and fewer than minCount "
            "bound, planned or not.",
            ["tenant"],
            registry=r,
        )
        self.tenant_gang_held_gpus = Gauge(
            "fairshare_tenant_gang_held_gpus",
            "GPUs held by the tenant's incomplete gangs (bound members of a group that is "
            "not running yet and the room its plan reserves).",
            ["tenant"],
            registry=r,
        )
        self.tenant_parent = Gauge(
            "fairshare_tenant_parent",
            "1 for each tenant that has a parent in the tree of tenants (labels tenant, "
            "parent); join on tenant to drill down from an organisation to its teams.",
            ["tenant", "parent"],
            registry=r,
        )
        self.tenant_history_usage_share = Gauge(
            "fairshare_tenant_history_usage_share",
            "usageHistory: the tenant's decayed dominant usage share of the cluster "
            "(0..1; its subtree's in a tree of tenants).",
            ["tenant"],
            registry=r,
        )
        self.tenant_history_weighted_share = Gauge(
            "fairshare_tenant_history_weighted_share",
            "usageHistory: the tenant's weight over its demanding siblings' (times its "
            "parent's in a tree; 0..1, 0 without demand).",
            ["tenant"],
            registry=r,
        )
        self.tenant_history_weight_factor = Gauge(
            "fairshare_tenant_history_weight_factor",
            "usageHistory: what the tenant's weight is multiplied by (1 unchanged, down to "
            "minWeightFactor for a tenant that used more than its weighted share).",
            ["tenant"],
            registry=r,
        )
        self.cluster_gpu_allocation = Gauge(
            "fairshare_cluster_gpu_allocation_ratio",
            "Allocated GPUs over allocatable GPUs in the cluster (0..1).",
            registry=r,
        )
        self.cluster_gpu_fragmentation = Gauge(
            "fairshare_cluster_gpu_fragmentation_ratio",
            "Share of free GPU capacity the observed workload mix cannot use (0..1).",
            registry=r,
        )
        self.gpus_in_service = Gauge(
            "fairshare_gpus_in_service",
            "GPUs in service: every GPU the nodes report minus those of nodes with a fatal "
            "GPU signal (the capacity fair shares divide).",
            registry=r,
        )
        self.gpus_failed = Gauge(
            "fairshare_gpus_failed",
            "GPUs of nodes with a fatal GPU signal (out of service).",
            registry=r,
        )
        self.gpu_unhealthy_devices = Gauge(
            "fairshare_gpu_unhealthy_devices",
            "GPUs of healthy nodes out of service one by one (device plugin unhealthy "
            "devices, DRA devices tainted NoSchedule/NoExecute).",
            registry=r,
        )
        self.guarantee_coverage = Gauge(
            "fairshare_guarantee_coverage_ratio",
            "In-service capacity over the sum of the top-level tenants' guarantees, per "
            "resource with guarantees (below 1: the guarantees cannot all be honoured).",
            ["resource"],
            registry=r,
        )
        self.tenant_gpus_on_failed = Gauge(
            "fairshare_tenant_gpus_on_failed_hardware",
            "GPUs the tenant's bound pods hold on nodes with a fatal GPU signal.",
            ["tenant"],
            registry=r,
        )
        self.tenant_resource_seconds = Counter(
            "fairshare_tenant_resource_seconds_total",
            "Chargeback: resource amount times seconds held, per tenant and resource.",
            ["tenant", "resource"],
            registry=r,
        )
        self.tenant_cost = Counter(
            "fairshare_tenant_cost_total",
            "Chargeback: cost accrued from the config's price per resource-hour.",
            ["tenant"],
            registry=r,
        )
        self.reclaim_evictions = Counter(
            "fairshare_reclaim_evictions_total",
            "Reclaim evictions, by outcome (evicted, blocked by a PodDisruptionBudget, "
            "failed), victim tenant and beneficiary tenant.",
            ["outcome", "tenant", "beneficiary"],
            registry=r,
        )
        self.reclaim_waiting = Counter(
            "fairshare_reclaim_waiting_total",
            "Pods under their tenant's guarantee that reclaim could not serve, by reason.",
            ["reason", "tenant"],
            registry=r,
        )
        self.gangs_recovered = Counter(
            "fairshare_gangs_recovered_total",
            "Pod groups evicted whole after a member was lost to a hardware fault, so that "
            "they restart whole (health.recoverGangs), by tenant.",
            ["tenant"],
            registry=r,
        )
        self.hardware_lost_pods = Counter(
            "fairshare_hardware_lost_pods_total",
            "Bound pods lost to a hardware fault (their node failed or went, or they failed "
            "on unhealthy GPUs), by tenant.",
            ["tenant"],
            registry=r,
        )
        self.forgiven_seconds = Counter(
            "fairshare_forgiven_pod_seconds_total",
            "Pod-seconds of runs lost to a hardware fault taken back out of the usage "
            "history (health.forgiveFaults), by tenant.",
            ["tenant"],
            registry=r,
        )
        self.reclaim_restore = Histogram(
            "fairshare_reclaim_guarantee_restore_seconds",
            "Time from a tenant's pending request under its guarantee to no such request "
            "left (its guaranteed share restored).",
            ["tenant"],
            buckets=RECLAIM_BUCKETS,
            registry=r,
        )
        self.reclaim_leader = Gauge(
            "fairshare_reclaim_leader",
            "1 while this reclaimer holds the leader Lease, else 0.",
            registry=r,
        )
        self.quarantine_breaker_open = Gauge(
            "fairshare_quarantine_breaker_open",
            "1 while the quarantine's circuit breaker keeps a failed GPU node from being "
            "cordoned (health.quarantine), else 0; 0 on replicas that do not lead.",
            registry=r,
        )
        self.quarantine_nodes = Gauge(
            "fairshare_quarantine_nodes",
            "GPU nodes with a fatal signal, by what the quarantine does with them: "
            "cordoned (fairshare holds the cordon), held_back (the breaker stopped it), "
            "others (cordoned by someone else), remediator (left to a remediator), "
            "by_hand (uncordoned by hand after fairshare cordoned it).",
            ["state"],
            registry=r,
        )
        self.quarantine_window_nodes = Gauge(
            "fairshare_quarantine_window_nodes",
            "Nodes fairshare quarantined within the circuit breaker's window.",
            registry=r,
        )
        self.quarantine_limit = Gauge(
            "fairshare_quarantine_window_limit",
            "Nodes the circuit breaker lets fairshare quarantine within its window.",
            registry=r,
        )
        self.quarantine_actions = Counter(
            "fairshare_quarantine_actions_total",
            "Quarantine actions on nodes, by action (cordon, uncordon, release, "
            "forget_override) and outcome (done, conflict, failed).",
            ["action", "outcome"],
            registry=r,
        )
        self.quarantine_evictions = Counter(
            "fairshare_quarantine_evictions_total",
            "Evictions of pods from quarantined nodes, by outcome (evicted, blocked by a "
            "PodDisruptionBudget, failed).",
            ["outcome"],
            registry=r,
        )
        self.extender_leader = Gauge(
            "fairshare_extender_leader",
            "1 while this extender replica holds the leader Lease and decides, else 0 "
            "(always 1 without --lease).",
            registry=r,
        )
        self.native_info = Info(
            "fairshare_native",
            "Kernel implementation loaded: c (compiled) or py (pure-Python twin).",
            registry=r,
        )
        self.build_info = Info("fairshare_build", "fairshare version.", registry=r)
        # Which (tenant, resource) series each per-resource gauge holds, for replacement.
        self._series: dict[str, set[tuple[str, str]]] = {name: set() for name in _PER_RESOURCE}
        self._tenants: set[str] = set()

    # ----------------------------------------------------------------- requests

    def observe_admission(self, operation: str, decision: str, reason: str, seconds: float) -> None:
        """Count one admission review and record its latency.

        ``operation`` is the request's (``CREATE``, ``UPDATE``...), ``decision`` e.g.
        ``allowed``/``denied``/``patched``, ``reason`` a short code (``""`` when allowed).
        """
        self.admission_requests.labels(operation, decision, reason).inc()
        self.admission_duration.labels(operation).observe(seconds)

    def observe_extender(self, verb: str, outcome: str, seconds: float) -> None:
        """Count one extender call (``outcome`` e.g. ``ok``, ``error``) and its latency."""
        self.extender_requests.labels(verb, outcome).inc()
        self.extender_duration.labels(verb).observe(seconds)

    def count_unexpected_error(self, component: str) -> None:
        """Count an exception that escaped into the error path of ``component``."""
        self.unexpected_errors.labels(component).inc()

    def observe_config_reload(self, *, ok: bool) -> None:
        """Count a config update: swapped in (``ok``) or refused."""
        (self.config_reloads if ok else self.config_reload_errors).inc()

    def observe_tls_reload(self, *, ok: bool) -> None:
        """Count a certificate rotation: loaded (``ok``) or refused."""
        (self.tls_reloads if ok else self.tls_reload_errors).inc()

    def count_tls_handshake(self) -> None:
        """Count a TLS handshake begun on the serving port (a new connection)."""
        self.tls_handshakes.inc()

    def set_tls_cert_expiry(self, timestamp: float) -> None:
        """Record the serving certificate's ``notAfter`` as Unix seconds."""
        self.tls_cert_expiry.set(timestamp)

    # ----------------------------------------------------------------- tenants

    def set_tenant_figures(
        self,
        tenant: str,
        *,
        usage: Mapping[str, float] | None = None,
        limit: Mapping[str, float] | None = None,
        reserved: Mapping[str, float] | None = None,
        dominant_share: float | None = None,
        fair_share: float | None = None,
    ) -> None:
        """Set a tenant's gauges; ``None`` leaves that figure as it is.

        Each mapping (resource name → amount in canonical units) replaces the tenant's
        previous series of that gauge: a resource missing from it loses its series. So
        ``limit`` lists only the resources the tenant is limited on.
        """
        self._tenants.add(tenant)
        for name, values in (("usage", usage), ("limit", limit), ("reserved", reserved)):
            if values is not None:
                self._replace(name, tenant, values)
        if dominant_share is not None:
            self.tenant_dominant_share.labels(tenant).set(dominant_share)
        if fair_share is not None:
            self.tenant_fair_share.labels(tenant).set(fair_share)

    def set_tenant_tree(self, parents: Mapping[str, str | None]) -> None:
        """Replace the ``fairshare_tenant_parent`` series: one per tenant with a parent."""
        self.tenant_parent.clear()
        for tenant, parent in sorted(parents.items()):
            if parent is not None:
                self.tenant_parent.labels(tenant, parent).set(1)

    def set_gated_pods(self, tenant: str, count: int) -> None:
        """Set how many of the tenant's pending pods the fair-share gate holds back."""
        self._tenants.add(tenant)
        self.tenant_gated_pods.labels(tenant).set(count)

    def set_gang_figures(self, tenant: str, *, waiting: int, held_gpus: float) -> None:
        """Set the tenant's waiting gangs and the GPUs its incomplete gangs hold."""
        _check_amount("gang held GPUs", held_gpus)
        self._tenants.add(tenant)
        self.tenant_gangs_waiting.labels(tenant).set(waiting)
        self.tenant_gang_held_gpus.labels(tenant).set(held_gpus)

    def set_usage_history(self, tenants: Mapping[str, tuple[float, float, float]]) -> None:
        """Replace the ``fairshare_tenant_history_*`` series: per tenant its decayed usage
        share, weighted share and weight factor. An empty mapping drops them all (history
        off, or a replica that no longer leads)."""
        gauges = (
            self.tenant_history_usage_share,
            self.tenant_history_weighted_share,
            self.tenant_history_weight_factor,
        )
        for gauge in gauges:
            gauge.clear()
        for tenant, values in sorted(tenants.items()):
            for gauge, value in zip(gauges, values, strict=True):
                gauge.labels(tenant).set(value)

    def retain_tenants(self, tenants: Iterable[str]) -> None:
        """Drop the gauge series of every tenant not in ``tenants`` (after a config reload).

        Chargeback counters are kept: they are cumulative and a scrape may still need them.
        """
        keep = set(tenants)
        for tenant in sorted(self._tenants - keep):
            for name in _PER_RESOURCE:
                self._replace(name, tenant, {})
            for gauge in (
                self.tenant_dominant_share,
                self.tenant_fair_share,
                self.tenant_gated_pods,
                self.tenant_gangs_waiting,
                self.tenant_gang_held_gpus,
            ):
                _remove_quietly(gauge, tenant)
        self._tenants &= keep

    def set_cluster_figures(
        self, *, gpu_allocation_ratio: float, gpu_fragmentation_ratio: float
    ) -> None:
        """Set the cluster-wide GPU allocation and fragmentation ratios (0..1)."""
        self.cluster_gpu_allocation.set(gpu_allocation_ratio)
        self.cluster_gpu_fragmentation.set(gpu_fragmentation_ratio)

    def set_fleet_health(
        self,
        *,
        in_service: float,
        failed: float,
        unhealthy_devices: int,
        coverage: Mapping[str, float],
        on_failed: Mapping[str, float],
    ) -> None:
        """Export the healthy fleet (``fairshare.fleet``); resources and tenants absent
        from ``coverage`` / ``on_failed`` lose their series (a tenant at 0 on failed
        hardware is exported as 0 while it is in ``on_failed``)."""
        self.gpus_in_service.set(in_service)
        self.gpus_failed.set(failed)
        self.gpu_unhealthy_devices.set(unhealthy_devices)
        self._replace_series(self.guarantee_coverage, coverage)
        self._replace_series(self.tenant_gpus_on_failed, on_failed)

    def _replace_series(self, gauge: Gauge, values: Mapping[str, float]) -> None:
        known = self._labelled.setdefault(id(gauge), set())
        for gone in known - set(values):
            with contextlib.suppress(KeyError):
                gauge.remove(gone)
        for label, value in values.items():
            gauge.labels(label).set(value)
        self._labelled[id(gauge)] = set(values)

    # ----------------------------------------------------------------- reclaim

    def count_reclaim_eviction(self, outcome: str, *, tenant: str, beneficiary: str) -> None:
        """Count one eviction attempt: ``outcome`` is ``evicted``, ``blocked`` or ``failed``."""
        self.reclaim_evictions.labels(outcome, tenant, beneficiary).inc()

    def count_reclaim_waiting(self, reason: str, tenant: str) -> None:
        """Count a pod reclaim could not serve this round (``reason`` a short code)."""
        self.reclaim_waiting.labels(reason, tenant).inc()

    def count_gang_recovered(self, tenant: str) -> None:
        """One pod group evicted whole after a hardware loss."""
        self.gangs_recovered.labels(tenant).inc()

    def count_hardware_lost(self, tenant: str, pods: int = 1) -> None:
        """Bound pods lost to a hardware fault."""
        self.hardware_lost_pods.labels(tenant).inc(pods)

    def count_forgiven(self, tenant: str, pod_seconds: float) -> None:
        """Pod-seconds taken back out of the usage history after a hardware loss."""
        _check_amount("forgiven pod-seconds", pod_seconds)
        self.forgiven_seconds.labels(tenant).inc(pod_seconds)

    def observe_guarantee_restored(self, tenant: str, seconds: float) -> None:
        """Record how long ``tenant`` waited under its guarantee before it was restored."""
        self.reclaim_restore.labels(tenant).observe(seconds)

    def set_extender_leader(self, leader: bool) -> None:
        """Export whether this extender replica decides (holds the Lease, caught up)."""
        self.extender_leader.set(1 if leader else 0)

    def set_quarantine(
        self, *, breaker_open: bool, nodes: dict[str, int], window_nodes: int, limit: int
    ) -> None:
        """Export the quarantine's state (``extender.quarantine``)."""
        self.quarantine_breaker_open.set(1 if breaker_open else 0)
        for state, count in nodes.items():
            self.quarantine_nodes.labels(state).set(count)
        self.quarantine_window_nodes.set(window_nodes)
        self.quarantine_limit.set(limit)

    def count_quarantine_action(self, action: str, outcome: str) -> None:
        """Count one node action of the quarantine."""
        self.quarantine_actions.labels(action, outcome).inc()

    def count_quarantine_eviction(self, outcome: str) -> None:
        """Count one eviction from a quarantined node (``evicted``, ``blocked``, ``failed``)."""
        self.quarantine_evictions.labels(outcome).inc()

    def set_reclaim_leader(self, leader: bool) -> None:
        """Export whether this reclaimer holds the leader Lease."""
        self.reclaim_leader.set(1 if leader else 0)

    # ----------------------------------------------------------------- chargeback

    def set_chargeback_source(self, source: Callable[[], ChargebackRows | None]) -> None:
        """Compute the chargeback gauges (``CHARGEBACK_SERIES``) from ``source`` at each
        scrape (None: not synced yet, no series)."""
        self._chargeback.source = source

    def accrue_chargeback(
        self,
        usage_by_tenant: Mapping[str, Mapping[str, float]],
        seconds: float,
        pricing: Mapping[str, float] | None = None,
    ) -> None:
        """Add ``seconds`` of the given usage to the chargeback counters.

        For each tenant and resource: ``resource_seconds += amount × seconds``. With
        ``pricing`` (price per resource-hour), ``cost += Σ_r amount_r × price_r × seconds /
        3600`` over the priced resources; unpriced resources cost nothing. Without
        ``pricing`` no cost series is created. All inputs are checked first (finite,
        ≥ 0), so a bad value raises ``ValueError`` before any counter moves.
        """
        _check_amount("seconds", seconds)
        for tenant, usage in usage_by_tenant.items():
            for resource, amount in usage.items():
                _check_amount(f"usage[{tenant!r}][{resource!r}]", amount)
        for resource, price in (pricing or {}).items():
            _check_amount(f"pricing[{resource!r}]", price)
        for tenant in sorted(usage_by_tenant):
            usage = usage_by_tenant[tenant]
            for resource in sorted(usage):
                self.tenant_resource_seconds.labels(tenant, resource).inc(usage[resource] * seconds)
            if pricing is not None:
                per_hour = math.fsum(usage[r] * pricing[r] for r in sorted(usage) if r in pricing)
                self.tenant_cost.labels(tenant).inc(per_hour * seconds / 3600.0)

    # ----------------------------------------------------------------- info

    def set_native_info(self, impl: str) -> None:
        """Export which kernel implementation is loaded (``c`` or ``py``)."""
        self.native_info.info({"impl": impl})

    def set_build_info(self, version: str) -> None:
        """Export the running fairshare version."""
        self.build_info.info({"version": version})

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """This registry in the exposition format; see ``render``."""
        return render(self.registry, accept)

    def _replace(self, name: str, tenant: str, values: Mapping[str, float]) -> None:
        gauge: Gauge = getattr(self, f"tenant_{name}")
        held = self._series[name]
        for key in sorted(k for k in held if k[0] == tenant and k[1] not in values):
            _remove_quietly(gauge, *key)
            held.discard(key)
        for resource in sorted(values):
            gauge.labels(tenant, resource).set(values[resource])
            held.add((tenant, resource))


def render(registry: CollectorRegistry, accept: str | None = None) -> tuple[bytes, str]:
    """Serialise ``registry``; return ``(body, content_type)`` for a ``/metrics`` response.

    Without ``accept`` (or when it does not ask for OpenMetrics) this is the Prometheus
    text format from ``generate_latest`` (``CONTENT_TYPE_LATEST``); with an ``Accept``
    header that asks for ``application/openmetrics-text``, OpenMetrics instead.
    """
    if accept:
        encoder, content_type = choose_encoder(accept)
        return encoder(registry), content_type
    return generate_latest(registry), CONTENT_TYPE_LATEST


def _check_amount(what: str, value: float) -> None:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be finite and >= 0, got {value!r}")


def _remove_quietly(metric: Gauge, *labels: str) -> None:
    # remove() raises KeyError for a series never set; "already gone" is fine here.
    with contextlib.suppress(KeyError):
        metric.remove(*labels)
