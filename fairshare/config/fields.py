"""The scalar field types of the FairShareConfig schema: resource names, Kubernetes names
and label selectors, quantities, weights, fractions and durations, each an ``Annotated``
type whose validators give a clear pydantic error. ``fairshare.config.schema`` builds its
models from them and re-exports every public name.
"""

from __future__ import annotations

import difflib
import math
import re
from typing import Annotated, Final, NoReturn

from pydantic import AfterValidator, BeforeValidator
from pydantic_core import PydanticCustomError

from fairshare import quantities

GPU_RESOURCE: Final = "nvidia.com/gpu"
CPU_RESOURCE: Final = "cpu"
MIG_RESOURCE_PREFIX: Final = "nvidia.com/mig-"
NATIVE_RESOURCES: Final = (GPU_RESOURCE, "cpu", "memory", "ephemeral-storage", "storage")
"""The default DRF dimensions, in their default order."""

_DNS_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN: Final = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
_NAME_PART: Final = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_LABEL_VALUE: Final = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_MIG_PROFILE: Final = re.compile(r"[0-9a-z]+([.+-][0-9a-z]+)*")
_CONDITION_TYPE: Final = re.compile(r"([-a-z0-9.]+/)?[A-Za-z0-9][-A-Za-z0-9_.]*")
LABEL_VALUE_MAX: Final = 63


def is_label_value(value: str) -> bool:
    """A valid Kubernetes label value (the empty one included)."""
    return len(value) <= LABEL_VALUE_MAX and bool(_LABEL_VALUE.fullmatch(value))


def is_label_key(value: str) -> bool:
    """A valid Kubernetes label key: ``[prefix/]name``, the prefix a DNS subdomain, the
    name up to 63 characters (``topology.kubernetes.io/zone``, ``rack``)."""
    return _is_qualified_name(value)


# --- validators for the annotated field types --------------------------------------------


def _fail(error_type: str, message: str) -> NoReturn:
    # The message goes through ctx so that braces in user input are never formatted.
    raise PydanticCustomError(error_type, "{message}", {"message": message})


def _not_bool(value: object) -> object:
    # pydantic's lax mode reads YAML's `yes` as 1.0; a weight is never a boolean.
    if isinstance(value, bool):
        _fail("number_type", "must be a number, not a boolean")
    return value


def _finite(value: float) -> float:
    if not math.isfinite(value):
        _fail("number_range", "must be a finite number")
    return value


def _non_negative(value: float) -> float:
    if _finite(value) < 0:
        _fail("number_range", "must be >= 0")
    return value


def _unit_interval(value: float) -> float:
    if not 0 <= _finite(value) <= 1:
        _fail("number_range", "must be between 0 and 1")
    return value


def _positive(value: float) -> float:
    if _finite(value) <= 0:
        _fail("number_range", "must be > 0")
    return value


def _at_least_one(value: int) -> int:
    if value < 1:
        _fail("number_range", "must be >= 1")
    return value


def _quantity(value: object) -> object:
    if not isinstance(value, str | int | float):
        return value  # the str schema reports the type
    try:
        amount = quantities.parse_quantity(value)
    except quantities.QuantityError as exc:
        _fail("quantity", str(exc))
    if amount < 0:
        _fail("quantity", f'must be >= 0, got "{value}"')
    return repr(value) if isinstance(value, float) else str(value)


def _unit_fraction(value: object) -> object:
    if not isinstance(value, str | int | float):
        return value
    try:
        amount = quantities.parse_fraction(value)
    except quantities.QuantityError as exc:
        _fail("fraction", f'invalid fraction "{value}": {exc.reason}')
    if not 0 < amount <= 1:
        _fail("fraction", f'must be > 0 and <= 1, got "{value}"')
    return repr(value) if isinstance(value, float) else str(value)


def _is_qualified_name(value: str) -> bool:
    prefix, slash, name = value.rpartition("/")
    if slash and (len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        return False
    return len(name) <= 63 and _NAME_PART.fullmatch(name) is not None


def _matching(
    error_type: str, pattern: re.Pattern[str] | None, max_len: int, message: str
) -> AfterValidator:
    """A validator accepting strings that fully match ``pattern`` (None: qualified names)."""

    def check(value: str) -> str:
        ok = _is_qualified_name(value) if pattern is None else bool(pattern.fullmatch(value))
        if not ok or len(value) > max_len:
            _fail(error_type, f'"{value}" {message}')
        return value

    return AfterValidator(check)


_LABEL_VALUE_CHECK = _matching(
    "label_value", _LABEL_VALUE, LABEL_VALUE_MAX, "is not a valid label value"
)
_DNS_LABEL_CHECK = _matching("dns_label", _DNS_LABEL, 63, "must be a DNS-1123 label (a-z 0-9 -)")


def _selector(value: dict[str, str]) -> dict[str, str]:
    if not value:
        _fail("selector", "must not be empty (it would match every namespace); omit it")
    return value


def validate_resource_name(name: str) -> str | None:
    """Why ``name`` cannot be a DRF dimension, or None if it can.

    Allowed: the native resources, ``hugepages-<size>``, ``nvidia.com/mig-<profile>``
    and extended resources ``<domain>/<name>``. Plain names (``gpu``, ``cpux``) are not.
    """
    if name in NATIVE_RESOURCES:
        return None
    if name.startswith(MIG_RESOURCE_PREFIX):
        if _MIG_PROFILE.fullmatch(name.removeprefix(MIG_RESOURCE_PREFIX)):
            return None
        return f'invalid MIG resource "{name}" (expected {MIG_RESOURCE_PREFIX}<profile>)'
    if name.startswith("hugepages-"):
        try:
            quantities.parse_quantity(name.removeprefix("hugepages-"))
        except quantities.QuantityError:
            return f'invalid hugepages resource "{name}" (expected e.g. hugepages-2Mi)'
        return None
    if "/" in name:
        return None if _is_qualified_name(name) else f'invalid extended resource "{name}"'
    hints = [n for n in NATIVE_RESOURCES if n.endswith("/" + name)]
    hints = hints or difflib.get_close_matches(name, NATIVE_RESOURCES, n=1)
    hint = f' (did you mean "{hints[0]}"?)' if hints else ""
    return (
        f'unknown resource "{name}"{hint}; use {", ".join(NATIVE_RESOURCES)}, '
        f"{MIG_RESOURCE_PREFIX}<profile> or an extended resource <domain>/<name>"
    )


def _resource_name(value: str) -> str:
    problem = validate_resource_name(value)
    if problem is not None:
        _fail("resource_name", problem)
    return value


Weight = Annotated[float, BeforeValidator(_not_bool), AfterValidator(_non_negative)]
PositiveWeight = Annotated[float, BeforeValidator(_not_bool), AfterValidator(_positive)]
Band = Annotated[float, BeforeValidator(_not_bool), AfterValidator(_unit_interval)]
Quantity = Annotated[str, BeforeValidator(_quantity)]
"""A non-negative Kubernetes quantity, kept as written (numbers become their string)."""
UnitFraction = Annotated[str, BeforeValidator(_unit_fraction)]
"""A fraction in (0, 1]: ``"1/7"``, ``"0.25"`` or ``1``, kept as written."""
DnsLabel = Annotated[str, _DNS_LABEL_CHECK]
ResourceName = Annotated[str, AfterValidator(_resource_name)]
PodCount = Annotated[int, BeforeValidator(_not_bool), AfterValidator(_at_least_one)]
LabelSelector = Annotated[
    dict[
        Annotated[str, _matching("label_key", None, 317, "is not a valid label key")],
        Annotated[str, _LABEL_VALUE_CHECK],
    ],
    AfterValidator(_selector),
]
SchedulerName = Annotated[
    str, _matching("dns_subdomain", _DNS_SUBDOMAIN, 253, "must be a DNS-1123 subdomain")
]
TaintKey = Annotated[str, _matching("taint_key", None, 317, "is not a valid taint key")]
ConditionType = Annotated[
    str, _matching("condition_type", _CONDITION_TYPE, 316, "is not a valid condition type")
]
MigProfile = Annotated[
    str,
    _matching(
        "mig_profile", _MIG_PROFILE, 63, 'must be a MIG profile such as "1g.10gb" (no prefix)'
    ),
]


_DURATION: Final = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?(?:h|m|s))+")
_DURATION_PART: Final = re.compile(r"([0-9]+(?:\.[0-9]*)?)(h|m|s)")
MIN_HALF_LIFE_SECONDS: Final = 60.0


def parse_duration(text: str) -> float:
    """Seconds in a Go-style duration (``1h``, ``30m``, ``1h30m``, ``90s``, ``1.5h``).

    Raises ValueError for anything else (a bare number has no unit)."""
    if not isinstance(text, str) or not _DURATION.fullmatch(text.strip()):
        raise ValueError(f"invalid duration {text!r}")
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0}
    return sum(float(n) * scale[u] for n, u in _DURATION_PART.findall(text.strip()))


def _seconds(value: object) -> float:
    """``value`` as a duration in seconds, or the field's error."""
    if not isinstance(value, str):
        _fail(
            "duration",
            f"must be a duration string such as 1h, 30m or 1h30m, got {value!r} "
            "(a bare number has no unit)",
        )
    try:
        return parse_duration(value)
    except ValueError:
        _fail(
            "duration",
            f'"{value}" is not a duration; write it as 1h, 30m, 90s or 1h30m (units h, m, s)',
        )


def _duration(value: object) -> object:
    _seconds(value)
    return value


Duration = Annotated[str, BeforeValidator(_duration)]
"""A Go-style duration (``1h``, ``30m``, ``0s``), kept as written."""


def _half_life(value: object) -> object:
    seconds = _seconds(value)
    if seconds < MIN_HALF_LIFE_SECONDS:
        _fail(
            "duration",
            f'must be at least 1m, got "{value}" (the history would forget within '
            "seconds; to turn the history off, omit usageHistory)",
        )
    return value


HalfLife = Annotated[str, BeforeValidator(_half_life)]
"""A half-life of at least one minute, a Go-style duration kept as written."""
