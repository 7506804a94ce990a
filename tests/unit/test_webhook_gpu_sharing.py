"""GPU-sharing annotations: every rejection as structured data, canonical forms, messages."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from fairshare.config.loading import config_from_mapping
from fairshare.config.schema import FairShareConfig
from tests.builders import make_pod
from webhook.patches import PatchOp
from webhook.policies import gpu_sharing
from webhook.policies.gpu_sharing import Normalised, Rejection

FRAC = "fairshare.io/gpu-fraction"
MEM = "fairshare.io/gpu-memory"
FRAC_PATH = "/metadata/annotations/fairshare.io~1gpu-fraction"
MEM_PATH = "/metadata/annotations/fairshare.io~1gpu-memory"
GI = 1024**3
SHARES = "fairshare.io/gpu-fraction, fairshare.io/gpu-memory"
KNOWN = (
    SHARES
    + ", fairshare.io/gpu-container, fairshare.io/gpu-configmap, fairshare.io/gpu-models"
    + ", fairshare.io/gang-min-members, fairshare.io/gang-topology-key"
)
ALLOWED_FRAC = 'a multiple of 0.05 from 0.05 to 0.95 (e.g. "0.5"), or a whole nvidia.com/gpu'


def config(**sharing: Any) -> FairShareConfig:
    return config_from_mapping(
        {
            "apiVersion": "fairshare.io/v1alpha1",
            "kind": "FairShareConfig",
            "gpuSharing": sharing,
        }
    )


DEFAULT = config()


def pod(annotations: dict[str, str], **requests: Any) -> dict[str, Any]:
    return make_pod().annotations(annotations).container(requests=requests or {"cpu": "1"}).obj()


@pytest.mark.parametrize(
    ("annotations", "requests", "ops"),
    [
        ({}, {}, ()),
        ({"example.com/x": "y"}, {}, ()),
        ({FRAC: "0.25"}, {}, ()),
        ({FRAC: "1/4"}, {}, (PatchOp("add", FRAC_PATH, "0.25"),)),
        ({FRAC: ".5"}, {}, (PatchOp("add", FRAC_PATH, "0.5"),)),
        ({FRAC: "0.250"}, {}, (PatchOp("add", FRAC_PATH, "0.25"),)),
        ({FRAC: "0.95"}, {}, ()),
        ({MEM: "8Gi"}, {}, ()),
        ({MEM: "8192Mi"}, {}, (PatchOp("add", MEM_PATH, "8Gi"),)),
        # 1e9 bytes = 953.67Mi, rounded up to the 1Mi unit: 954Mi
        ({MEM: "1G"}, {}, (PatchOp("add", MEM_PATH, "954Mi"),)),
        ({MEM: "80Gi"}, {}, ()),
        ({}, {"nvidia.com/gpu": "2"}, ()),
        ({}, {"nvidia.com/mig-1g.10gb": "1"}, ()),
    ],
    ids=[
        "nothing", "foreign-annotation", "canonical-fraction", "ratio", "leading-dot",
        "trailing-zero", "largest-fraction", "canonical-memory", "memory-mi", "memory-rounded",
        "memory-at-device-size", "whole-gpus", "known-mig",
    ],
)  # fmt: skip
def test_valid_requests_normalise(
    annotations: dict[str, str], requests: dict[str, str], ops: tuple[PatchOp, ...]
) -> None:
    got = gpu_sharing.check_gpu_sharing(
        pod(annotations, **requests), config=DEFAULT, device_memory=80 * GI
    )
    assert isinstance(got, Normalised)
    assert got.ops == ops


def test_normalising_the_canonical_form_again_gives_no_ops() -> None:
    first = gpu_sharing.check_gpu_sharing(pod({FRAC: "1/4"}), config=DEFAULT)
    assert isinstance(first, Normalised) and first.canonical == {FRAC: "0.25"}
    second = gpu_sharing.check_gpu_sharing(pod(dict(first.canonical)), config=DEFAULT)
    assert isinstance(second, Normalised) and second.ops == ()


AF = f"annotation {FRAC}"
AM = f"annotation {MEM}"
WHOLE = "a whole GPU or more; request nvidia.com/gpu instead"


@pytest.mark.parametrize(
    ("annotations", "requests", "want"),
    [
        ({FRAC: "0.33"}, {}, (AF, "0.33", "not a multiple of 0.05")),
        ({FRAC: "0"}, {}, (AF, "0", "outside (0, 1)")),
        ({FRAC: "-0.5"}, {}, (AF, "-0.5", "outside (0, 1)")),
        ({FRAC: "1"}, {}, (AF, "1", WHOLE)),
        ({FRAC: "1.5"}, {}, (AF, "1.5", WHOLE)),
        ({FRAC: "half"}, {}, (AF, "half", "not a fraction")),
        ({FRAC: "1/0"}, {}, (AF, "1/0", "not a fraction")),
        (
            {FRAC: "0.5"},
            {"nvidia.com/gpu": "1"},
            (AF, "0.5", "cannot be combined with a whole-GPU request (nvidia.com/gpu: 1)"),
        ),
        (
            {MEM: "8Gi"},
            {"nvidia.com/gpu": "2"},
            (AM, "8Gi", "cannot be combined with a whole-GPU request (nvidia.com/gpu: 2)"),
        ),
        ({FRAC: "0.5", MEM: "8Gi"}, {}, (AF, "0.5", f"cannot be combined with annotation {MEM}")),
        ({MEM: "0"}, {}, (AM, "0", "must be > 0")),
        ({MEM: "lots"}, {}, (AM, "lots", "not a quantity")),
        ({MEM: "81Gi"}, {}, (AM, "81Gi", "above the largest GPU's memory (80Gi)")),
        (
            {"fairshare.io/gpu-fration": "0.5"},
            {},
            ("annotation fairshare.io/gpu-fration", "0.5", "unknown fairshare.io annotation"),
        ),
        (
            {"fairshare.io/gpu-devices": "0"},
            {},
            (
                "annotation fairshare.io/gpu-devices",
                "0",
                "is set by the fairshare scheduler when it binds the pod",
            ),
        ),
        (
            {},
            {"nvidia.com/mig-9g.99gb": "1"},
            ("resource nvidia.com/mig-9g.99gb", "1", "unknown MIG profile"),
        ),
        (
            {FRAC: "0.5"},
            {"nvidia.com/mig-1g.10gb": "1"},
            ("resource nvidia.com/mig-1g.10gb", "1", f"cannot be combined with annotation {FRAC}"),
        ),
        (
            {},
            {"cpu": "lots"},
            ("spec.containers", "", 'container \'c0\': resources cpu: invalid quantity "lots": '),
        ),
    ],
    ids=[
        "off-step", "zero", "negative", "one", "above-one", "not-a-number", "zero-denominator",
        "fraction-with-whole-gpu", "memory-with-whole-gpu", "fraction-and-memory",
        "memory-zero", "memory-garbage", "memory-above-device", "unknown-key",
        "devices-key", "unknown-mig", "mig-and-fraction", "bad-quantity",
    ],
)  # fmt: skip
def test_rejections(
    annotations: dict[str, str], requests: dict[str, str], want: tuple[str, str, str]
) -> None:
    got = gpu_sharing.check_gpu_sharing(
        pod(annotations, **requests), config=DEFAULT, device_memory=80 * GI
    )
    assert isinstance(got, Rejection)
    assert (got.subject, got.value) == want[:2]
    assert got.problem.startswith(want[2])


@pytest.mark.parametrize(
    ("annotations", "requests", "allowed"),
    [
        ({FRAC: "0.33"}, {}, ALLOWED_FRAC),
        ({FRAC: "0.5", MEM: "8Gi"}, {}, f"one of {SHARES}"),
        (
            {FRAC: "0.5"},
            {"nvidia.com/gpu": "1"},
            "either the annotation or nvidia.com/gpu, not both",
        ),
        ({MEM: "x"}, {}, 'a positive quantity such as "8Gi", rounded up to 1Mi, at most 80Gi'),
        ({"fairshare.io/tenant": "nlp"}, {}, KNOWN),
    ],
    ids=["fraction", "both-annotations", "with-whole-gpu", "memory", "unknown-key"],
)
def test_rejections_say_what_is_allowed(
    annotations: dict[str, str], requests: dict[str, str], allowed: str
) -> None:
    got = gpu_sharing.check_gpu_sharing(
        pod(annotations, **requests), config=DEFAULT, device_memory=80 * GI
    )
    assert isinstance(got, Rejection) and got.allowed == allowed


def test_min_fraction_is_enforced_and_rounded_to_the_step() -> None:
    # step 0.05, minimum 0.12 -> smallest allowed multiple is 0.15
    cfg = config(fractionStep="0.05", minFraction="0.12")
    assert gpu_sharing.allowed_fractions(cfg) == (
        Fraction(3, 20),
        Fraction(19, 20),
        Fraction(1, 20),
    )
    got = gpu_sharing.check_gpu_sharing(pod({FRAC: "0.1"}), config=cfg)
    assert isinstance(got, Rejection) and got.problem == "below the minimum 0.15"


def test_a_step_without_a_finite_decimal_is_written_as_a_ratio() -> None:
    cfg = config(fractionStep="1/7", minFraction="1/7")
    got = gpu_sharing.check_gpu_sharing(pod({FRAC: "2/7"}), config=cfg)
    assert isinstance(got, Normalised) and got.ops == ()
    off = gpu_sharing.check_gpu_sharing(pod({FRAC: "0.25"}), config=cfg)
    assert isinstance(off, Rejection) and off.problem == "not a multiple of 1/7"


def test_step_of_one_disables_fractions() -> None:
    cfg = config(fractionStep="1", minFraction="1")
    assert gpu_sharing.allowed_fractions(cfg) is None
    got = gpu_sharing.check_gpu_sharing(pod({FRAC: "0.5"}), config=cfg)
    assert isinstance(got, Rejection)
    assert got.allowed.startswith("none (fractional GPUs are disabled")


def test_memory_unit_from_config() -> None:
    got = gpu_sharing.check_gpu_sharing(pod({MEM: "1500Mi"}), config=config(memoryUnit="1Gi"))
    assert isinstance(got, Normalised) and got.canonical == {MEM: "2Gi"}


def test_unknown_device_memory_is_not_checked() -> None:
    got = gpu_sharing.check_gpu_sharing(pod({MEM: "200Gi"}), config=DEFAULT, device_memory=None)
    assert isinstance(got, Normalised)


def test_unknown_mig_lists_the_configured_profiles() -> None:
    got = gpu_sharing.check_gpu_sharing(pod({}, **{"nvidia.com/mig-9g.99gb": "1"}), config=DEFAULT)
    assert isinstance(got, Rejection)
    assert "nvidia.com/mig-1g.10gb" in got.allowed and "nvidia.com/mig-7g.80gb" in got.allowed


@pytest.mark.parametrize(
    ("rejection", "text"),
    [
        (
            Rejection(f"annotation {FRAC}", "0.33", "not a multiple of 0.05", ALLOWED_FRAC),
            'annotation fairshare.io/gpu-fraction="0.33": not a multiple of 0.05; allowed: '
            'a multiple of 0.05 from 0.05 to 0.95 (e.g. "0.5"), or a whole nvidia.com/gpu',
        ),
        (Rejection("spec.containers", "", "bad"), 'spec.containers="": bad'),
    ],
    ids=["with-allowed", "without-allowed"],
)
def test_render_rejection(rejection: Rejection, text: str) -> None:
    assert gpu_sharing.render_rejection(rejection) == text


MODELS = "fairshare.io/gpu-models"
MODELS_PATH = "/metadata/annotations/fairshare.io~1gpu-models"
AMOD = f"annotation {MODELS}"


@pytest.mark.parametrize(
    ("annotations", "requests", "ops"),
    [
        ({MODELS: "Tesla-T4"}, {"nvidia.com/gpu": "1"}, ()),
        ({MODELS: "NVIDIA-A100-SXM4-80GB|Tesla-T4"}, {"nvidia.com/gpu": "2"}, ()),
        (
            {MODELS: " Tesla-T4 | NVIDIA-A100-SXM4-80GB |Tesla-T4"},
            {"nvidia.com/gpu": "1"},
            (PatchOp("add", MODELS_PATH, "NVIDIA-A100-SXM4-80GB|Tesla-T4"),),
        ),
        ({MODELS: "Tesla-T4", FRAC: "0.5"}, {}, ()),
        ({MODELS: "Tesla-T4", MEM: "8Gi"}, {}, ()),
        ({MODELS: "NVIDIA-A100-SXM4-80GB"}, {"nvidia.com/mig-1g.10gb": "1"}, ()),
    ],
    ids=["one", "two-sorted", "blanks-and-repeats", "with-fraction", "with-memory", "with-mig"],
)
def test_gpu_models_are_accepted_on_gpu_pods_and_normalised(
    annotations: dict[str, str], requests: dict[str, str], ops: tuple[PatchOp, ...]
) -> None:
    got = gpu_sharing.check_gpu_sharing(
        pod(annotations, **requests), config=DEFAULT, device_memory=80 * GI
    )
    assert isinstance(got, Normalised), got
    assert got.ops == ops
    again = dict(annotations, **(got.canonical or {}))
    second = gpu_sharing.check_gpu_sharing(pod(again, **requests), config=DEFAULT)
    assert isinstance(second, Normalised) and second.ops == ()


@pytest.mark.parametrize(
    ("value", "requests", "problem"),
    [
        ("", {"nvidia.com/gpu": "1"}, "names no GPU model"),
        (" | ", {"nvidia.com/gpu": "1"}, "names no GPU model"),
        ("Tesla-T4||A100", {"nvidia.com/gpu": "1"}, "has an empty model name"),
        ("Tesla T4", {"nvidia.com/gpu": "1"}, '"Tesla T4" is not a valid nvidia.com/gpu.product'),
        ("-T4", {"nvidia.com/gpu": "1"}, '"-T4" is not a valid'),
        ("x" * 64, {"nvidia.com/gpu": "1"}, f'"{"x" * 64}" is not a valid'),
        ("Tesla-T4", {"cpu": "2"}, "the pod asks for no GPU"),
        ("Tesla-T4", {"nvidia.com/gpu": "0"}, "the pod asks for no GPU"),
    ],
    ids=["empty", "only-separators", "empty-name", "space", "leading-dash", "too-long",
         "cpu-only", "zero-gpus"],
)  # fmt: skip
def test_gpu_models_rejections(value: str, requests: dict[str, str], problem: str) -> None:
    got = gpu_sharing.check_gpu_sharing(pod({MODELS: value}, **requests), config=DEFAULT)
    assert isinstance(got, Rejection), got
    assert (got.subject, got.value) == (AMOD, value)
    assert got.problem.startswith(problem)
    assert got.allowed.startswith("GPU products (nvidia.com/gpu.product label values)") or (
        got.allowed == "a pod that requests nvidia.com/gpu, a GPU share or MIG"
    )
