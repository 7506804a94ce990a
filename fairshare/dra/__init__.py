"""GPUs requested through Dynamic Resource Allocation (``resource.k8s.io/v1``).

Pure: no network, no clock. Must not import aiohttp, kubernetes_asyncio or
prometheus_client. Reads ResourceClaim / ResourceClaimTemplate objects as API JSON dicts.

A claim's GPUs are the devices its requests ask for from a **GPU device class**
(``GPU_DEVICE_CLASSES``, default ``gpu.nvidia.com``, the class the NVIDIA DRA driver
installs; callers pass their configured set):

* ``spec.devices.requests[].exactly`` with ``deviceClassName`` in the set:
  ``allocationMode: ExactCount`` (the default) counts ``count`` (default 1);
  ``allocationMode: All`` counts ``all_devices`` (a whole node, default 8) until the
  claim is allocated;
* ``spec.devices.requests[].firstAvailable[]``: the largest count among the GPU
  sub-requests (the worst case the scheduler may pick) until allocated;
* the pre-v1 flat shape (``requests[].deviceClassName`` / ``count`` / ``allocationMode``)
  is read the same way, so claims written for v1beta1 count too;
* once allocated, ``status.allocation.devices.results`` is the truth: the number of
  devices given to the GPU requests (a result's ``request`` is ``<request>`` or
  ``<request>/<sub-request>``).

Accounting choices: admission counts a ResourceClaim from creation to deletion, whether
or not a pod uses it yet (as Kubernetes ResourceQuota counts ``devices`` per claim);
claims generated from a template are ResourceClaims and count the same way, so a pod is
never counted twice for one claim. The scheduler side counts the claims that bound pods
reference (``pod_claim_names``), once per claim. The claim kube-scheduler generates for a
pod's DRA-backed ``nvidia.com/gpu`` (KEP-5004, annotated
``resource.kubernetes.io/extended-resource-claim``) counts 0: the pod's own request is
its usage, on both sides.

Capacity (``slice_capacity``): a node's DRA GPUs are the devices that a configured GPU
DeviceClass selects in the node-local pools of ``resource.k8s.io/v1`` ResourceSlices.
fairshare evaluates no CEL; ``device_match`` reads the driver/attribute equalities GPU
classes are written with and refuses anything else by name.

The package: ``slices`` (capacity: devices, their fractions, taints), ``book``
(``SliceBook``, the capacity followed slice event by slice event) and ``claims`` (a
claim's GPUs, the admission check, KEP-5004); every public name is re-exported here, so
callers keep ``from fairshare import dra`` and ``dra.<name>``.
"""

from fairshare.dra.book import SliceBook
from fairshare.dra.claims import (
    EXTENDED_RESOURCE_CLAIM_ANNOTATION,
    Insufficient,
    allocated_devices,
    asks_gpus_without_claims,
    check_claim,
    claim_gpus,
    claim_spec_gpus,
    extended_resource_claim_name,
    extended_resource_classes,
    is_extended_resource_claim,
    pod_claim_names,
    template_gpus,
    whole_and_parts,
)
from fairshare.dra.slices import (
    ALL_DEVICES_DEFAULT,
    API_VERSION,
    COMPUTE_COUNTER,
    GPU_DEVICE_CLASS,
    GPU_DEVICE_CLASSES,
    KIND_CLAIM,
    KIND_DEVICE_CLASS,
    KIND_SLICE,
    KIND_TAINT_RULE,
    KIND_TEMPLATE,
    MEMORY_SLICE_PREFIX,
    TAINT_EFFECTS,
    ClassShape,
    DeviceIndex,
    DeviceKey,
    DeviceMatch,
    GpuDevice,
    PoolCount,
    SliceCapacity,
    SliceCount,
    TaintSelector,
    capacity_of_pools,
    combine_pool,
    combine_slices,
    count_slice,
    device_match,
    gpu_matches,
    slice_capacity,
    taint_rule_selector,
)

__all__ = [
    "ALL_DEVICES_DEFAULT",
    "API_VERSION",
    "COMPUTE_COUNTER",
    "EXTENDED_RESOURCE_CLAIM_ANNOTATION",
    "GPU_DEVICE_CLASS",
    "GPU_DEVICE_CLASSES",
    "KIND_CLAIM",
    "KIND_DEVICE_CLASS",
    "KIND_SLICE",
    "KIND_TAINT_RULE",
    "KIND_TEMPLATE",
    "MEMORY_SLICE_PREFIX",
    "TAINT_EFFECTS",
    "ClassShape",
    "DeviceIndex",
    "DeviceKey",
    "DeviceMatch",
    "GpuDevice",
    "Insufficient",
    "PoolCount",
    "SliceBook",
    "SliceCapacity",
    "SliceCount",
    "TaintSelector",
    "allocated_devices",
    "asks_gpus_without_claims",
    "capacity_of_pools",
    "check_claim",
    "claim_gpus",
    "claim_spec_gpus",
    "combine_pool",
    "combine_slices",
    "count_slice",
    "device_match",
    "extended_resource_claim_name",
    "extended_resource_classes",
    "gpu_matches",
    "is_extended_resource_claim",
    "pod_claim_names",
    "slice_capacity",
    "taint_rule_selector",
    "template_gpus",
    "whole_and_parts",
]
