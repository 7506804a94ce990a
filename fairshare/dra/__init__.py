"""GPUs requested and offered through Dynamic Resource Allocation (``resource.k8s.io/v1``).

A claim's GPUs are the devices it asks of a GPU device class (``GPU_DEVICE_CLASSES``,
default ``gpu.nvidia.com``; callers pass their configured set):

* ``requests[].exactly`` (and the pre-v1 flat shape): ``count`` (default 1) for
  ``ExactCount``, ``all_devices`` (default 8) for ``All``;
* ``requests[].firstAvailable[]``: the largest count among the GPU sub-requests;
* once allocated, ``status.allocation.devices.results``: the devices given to the GPU
  requests.

Admission counts a ResourceClaim from creation to deletion, used by a pod or not (as
ResourceQuota does); the scheduler side counts the claims bound pods reference, once per
claim. The claim kube-scheduler generates for a DRA-backed ``nvidia.com/gpu`` (KEP-5004)
counts 0: the pod's own request is its usage. A node's capacity is the devices a GPU
DeviceClass selects in its ResourceSlices; no CEL is evaluated (``device_match`` reads
the driver and attribute equalities GPU classes use and refuses anything else).

``slices`` (capacity), ``book`` (capacity followed event by event) and ``claims`` (a
claim's GPUs, the admission check) are re-exported here.
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
    taint_rule_warning,
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
    "taint_rule_warning",
    "template_gpus",
    "whole_and_parts",
]
