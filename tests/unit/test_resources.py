"""Pod request vectors, computed by Kubernetes' PodRequests rule."""

from __future__ import annotations

from fractions import Fraction as F

import pytest

from fairshare import resources
from fairshare.resources import CPU, GPU, MEMORY, STORAGE, DemandError, ResourceIndex
from tests.builders import make_pod

MIG = {"1g.10gb": F(1, 7), "3g.40gb": F(3, 7)}
GI = 1024**3


@pytest.mark.parametrize(
    ("pod", "want"),
    [
        # two app containers add up: 0.5 + 1.5 = 2 cores, 1Gi + 1Gi
        (
            make_pod()
            .container(requests={"cpu": "500m", "memory": "1Gi"})
            .container(requests={"cpu": "1.5", "memory": "1Gi"}),
            {CPU: F(2), MEMORY: F(2 * GI)},
        ),
        # a regular init container larger than the apps wins per resource:
        # cpu max(1, 3) = 3; memory max(4Gi, 1Gi) = 4Gi
        (
            make_pod()
            .container(requests={"cpu": "1", "memory": "4Gi"})
            .init(requests={"cpu": "3", "memory": "1Gi"}),
            {CPU: F(3), MEMORY: F(4 * GI)},
        ),
        # a sidecar (restartPolicy Always) runs beside the apps: 1 + 0.5 = 1.5;
        # the later init container runs with the sidecar: 0.5 + 0.8 = 1.3 < 1.5
        (
            make_pod()
            .container(requests={"cpu": "1"})
            .init(requests={"cpu": "500m"}, sidecar=True)
            .init(requests={"cpu": "800m"}),
            {CPU: F(3, 2)},
        ),
        # init container after a sidecar: 0.5 + 2 = 2.5 > apps 1 + 0.5
        (
            make_pod()
            .container(requests={"cpu": "1"})
            .init(requests={"cpu": "500m"}, sidecar=True)
            .init(requests={"cpu": "2"}),
            {CPU: F(5, 2)},
        ),
        # only a limit set: the request defaults to the limit (extended resources too)
        (make_pod().container(limits={"nvidia.com/gpu": "2", "cpu": "1"}), {GPU: F(2), CPU: F(1)}),
        # pod overhead is added on top: 1 + 0.25
        (make_pod().container(requests={"cpu": "1"}).overhead(cpu="250m"), {CPU: F(5, 4)}),
    ],
    ids=["apps-sum", "init-max", "sidecar", "init-after-sidecar", "limit-only", "overhead"],
)
def test_pod_requests_follow_kubernetes(pod, want):
    got = resources.pod_demand(pod.obj(), mig=MIG).amounts
    assert dict(got) == want


@pytest.mark.parametrize(
    ("pod", "count", "per_device", "source"),
    [
        (make_pod().req(gpu=2, cpu="1"), 2, F(1), "device"),
        (
            make_pod().req(cpu="1").annotations({"fairshare.io/gpu-fraction": "0.25"}),
            1,
            F(1, 4),
            "fraction",
        ),
        (make_pod().container(requests={"nvidia.com/mig-1g.10gb": "1"}), 1, F(1, 7), "mig"),
        (make_pod().container(requests={"nvidia.com/mig-3g.40gb": "2"}), 2, F(3, 7), "mig"),
        (make_pod().req(cpu="1"), 0, F(0), "none"),
    ],
    ids=["whole", "fraction", "mig-1g", "mig-3g-x2", "cpu-only"],
)
def test_gpu_demand_shapes(pod, count, per_device, source):
    d = resources.pod_demand(pod.obj(), mig=MIG)
    assert (d.gpu.count, d.gpu.per_device, d.gpu.source) == (count, per_device, source)
    assert d.get(GPU) == count * per_device
    assert not any(k.startswith("nvidia.com/mig-") for k in d.amounts)


def test_gpu_memory_request_resolves_per_device():
    pod = make_pod().req(cpu="1").annotations({"fairshare.io/gpu-memory": "20Gi"}).obj()
    d = resources.pod_demand(pod, mig=MIG)
    assert d.gpu.memory == 20 * GI and d.gpu.count == 1 and d.wants_gpu
    assert d.gpu.per_device == 0  # known only per node
    # on an 80 GiB device 20 GiB is a quarter of the device
    assert d.gpu.with_device_memory(80 * GI).per_device == F(1, 4)
    # more memory than the device has caps at the whole device
    assert d.gpu.with_device_memory(16 * GI).per_device == F(1)


@pytest.mark.parametrize(
    ("pod", "needle"),
    [
        (make_pod().req(cpu="1").annotations({"fairshare.io/gpu-fraction": "1.5"}), "(0, 1]"),
        (make_pod().req(cpu="1").annotations({"fairshare.io/gpu-fraction": "half"}), "half"),
        (make_pod().req(cpu="1").annotations({"fairshare.io/gpu-memory": "-1Gi"}), "> 0"),
        (make_pod().container(requests={"nvidia.com/mig-9g.99gb": "1"}), "unknown MIG profile"),
        (make_pod().container(requests={"cpu": "lots"}), "lots"),
    ],
    ids=["fraction-above-1", "fraction-word", "memory-negative", "mig-unknown", "bad-quantity"],
)
def test_bad_demands_raise_clear_errors(pod, needle):
    with pytest.raises(DemandError, match=None) as exc:
        resources.pod_demand(pod.obj(), mig=MIG)
    assert needle in str(exc.value)


def test_storage_counts_mounted_claims_only():
    pod = make_pod().req(cpu="1").pvc("weights").pvc("unknown").obj()
    d = resources.pod_demand(pod, mig=MIG, pvc_sizes={"weights": F(100 * GI), "other": F(1)})
    assert d.get(STORAGE) == 100 * GI


def test_kernel_units_are_exact_integers():
    idx = ResourceIndex((GPU, CPU, MEMORY))
    row = idx.kernel_vector({GPU: F(1, 4), CPU: F(1, 3), MEMORY: F(3, 2)})
    # quarter GPU = 250 milli; a third of a core rounds up to 334m; 1.5 bytes up to 2
    assert row == [250.0, 334.0, 2.0]
    assert idx.amounts([250.0, 334.0, 2.0])[GPU] == F(1, 4)
