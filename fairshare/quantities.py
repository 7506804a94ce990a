"""Kubernetes resource quantities, parsed exactly: ``parse_quantity("1500m") ==
Fraction(3, 2)``.

Grammar and rounding are apimachinery's ``ParseQuantity`` (a non-zero magnitude rounds up
to a whole nano; a binary-suffixed one is capped at 2**63-1), with two stricter rules: a
number with no digits (``"Ki"``, ``"e3"``, ``"."``) is refused, as the CRD OpenAPI pattern
refuses it, and decimal exponents are limited to ``|e| <= 10_000``, so a hostile
``1e999999999`` cannot build a huge integer. ``parse_fraction`` reads the non-Kubernetes
form ``"1/7"`` / ``"0.25"`` (MIG profiles, ``fairshare.io/gpu-fraction``).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Final, Literal

from fairshare.errors import FairshareError

__all__ = [
    "QuantityError",
    "QuantityKind",
    "format_quantity",
    "parse_bytes",
    "parse_cpu_milli",
    "parse_fraction",
    "parse_quantity",
    "quantity_kind",
    "to_int",
    "to_milli",
]

QuantityKind = Literal["cpu", "bytes", "gpu", "decimal"]
"""How ``format_quantity`` renders an amount: cores, bytes, GPUs or plain decimal SI."""

_NANO: Final = 10**9
_MAX_BINARY: Final = 2**63 - 1  # apimachinery maxAllowed
_MAX_EXPONENT: Final = 10_000

_BINARY_SUFFIXES: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_SUFFIXES: Final = {
    "n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18,
}  # fmt: skip
_DECIMAL_SUFFIX_BY_EXPONENT: Final = {e: s for s, e in _DECIMAL_SUFFIXES.items()}

# The same split as the Go scanner: sign, digits, optional "." digits, then a suffix made of
# suffix letters, an optional sign and digits. [0-9] rather than \d: no Unicode digits.
_QUANTITY_RE: Final = re.compile(
    r"(?P<sign>[+-]?)(?P<whole>[0-9]*)(?:\.(?P<frac>[0-9]*))?"
    r"(?P<suffix>[eEinumkKMGTP]*[+-]?[0-9]*)"
)
_EXPONENT_RE: Final = re.compile(r"[eE](?P<exp>[+-]?[0-9]+)")
_FRACTION_RE: Final = re.compile(
    r"(?P<sign>[+-]?)(?:(?P<num>[0-9]+)/(?P<den>[0-9]+)"
    r"|(?P<whole>[0-9]*)(?:\.(?P<frac>[0-9]*))?)"
)


class QuantityError(FairshareError, ValueError):
    """A string is not a valid quantity (or fraction). ``value`` is the offending input."""

    def __init__(self, value: object, reason: str) -> None:
        self.value = value
        self.reason = reason
        super().__init__(f'invalid quantity "{value}": {reason}')

    def __reduce__(self) -> tuple[type[QuantityError], tuple[object, str]]:
        return type(self), (self.value, self.reason)


def _as_text(value: str | int | float) -> str:
    # bool is an int subclass; "true" is never a quantity.
    if isinstance(value, bool):
        raise QuantityError(value, "expected a string or number, got a boolean")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(value, "must be a finite number")
        # repr() is the shortest string that round-trips, so 0.1 means 1/10 and not the
        # binary double nearest to it; repr(1e+20) is itself valid quantity syntax.
        return repr(value)
    if isinstance(value, str):
        return value
    raise QuantityError(value, f"expected a string or number, got {type(value).__name__}")


def _decimal(whole: str, frac: str) -> Fraction:
    return Fraction(int(whole + frac or "0"), 10 ** len(frac))


def parse_quantity(s: str | int | float) -> Fraction:
    """Parse a Kubernetes quantity (``"100m"``, ``"1.5Gi"``, ``"12E-3"``) to an exact value.

    Numbers are accepted too (``2``, ``0.5``), as YAML and JSON produce them. Raises
    ``QuantityError`` naming the input on any malformed string. Strings parsed before are
    answered from memory (pods repeat a few quantities; the first ``_MEMORY`` distinct
    strings are kept, errors never).
    """
    if type(s) is str:
        known = _PARSED.get(s)
        if known is not None:
            return known
        value = _parse_quantity(s)
        if len(_PARSED) < _MEMORY:
            _PARSED[s] = value
        return value
    return _parse_quantity(s)


_MEMORY: Final = 4096
_PARSED: dict[str, Fraction] = {}


def _parse_quantity(s: str | int | float) -> Fraction:
    text = _as_text(s)
    if not text:
        raise QuantityError(s, "empty string")
    if any(c.isspace() for c in text):
        raise QuantityError(s, "whitespace is not allowed")
    match = _QUANTITY_RE.fullmatch(text)
    if match is None:
        raise QuantityError(s, "expected <number><suffix>, e.g. 500m, 1.5Gi, 2e3")
    whole, frac, suffix = match["whole"], match["frac"] or "", match["suffix"]
    if not whole and not frac:
        raise QuantityError(s, "the number has no digits")
    magnitude = _decimal(whole, frac) * _suffix_factor(s, suffix)
    if magnitude:
        # apimachinery rounds non-zero magnitudes up to the nano: "you asked for some".
        magnitude = Fraction(math.ceil(magnitude * _NANO), _NANO)
    if suffix in _BINARY_SUFFIXES and magnitude > _MAX_BINARY:
        magnitude = Fraction(_MAX_BINARY)
    return -magnitude if match["sign"] == "-" else magnitude


def _suffix_factor(original: object, suffix: str) -> Fraction:
    if suffix in _DECIMAL_SUFFIXES:
        return Fraction(10) ** _DECIMAL_SUFFIXES[suffix]
    if suffix in _BINARY_SUFFIXES:
        return Fraction(2 ** _BINARY_SUFFIXES[suffix])
    exponent = _EXPONENT_RE.fullmatch(suffix)
    if exponent is None:
        raise QuantityError(
            original,
            f'unknown suffix "{suffix}" (use Ki Mi Gi Ti Pi Ei, n u m k M G T P E, or e<exp>)',
        )
    value = int(exponent["exp"])
    if abs(value) > _MAX_EXPONENT:
        raise QuantityError(original, f"exponent {value} is out of range")
    return Fraction(10) ** value


def parse_fraction(s: str | int | float) -> Fraction:
    """Parse a GPU fraction: ``"1/7"``, ``"0.25"``, ``".5"``, ``"1"`` or a number.

    Not a Kubernetes quantity (no suffixes); used for MIG profile fractions and the
    ``fairshare.io/gpu-fraction`` annotation. Range checks are the caller's job.
    """
    text = _as_text(s)
    match = _FRACTION_RE.fullmatch(text)
    if match is None:
        raise QuantityError(s, 'expected a fraction such as "1/7", "0.25" or "1"')
    if match["num"] is not None:
        if int(match["den"]) == 0:
            raise QuantityError(s, "zero denominator")
        value = Fraction(int(match["num"]), int(match["den"]))
    else:
        whole, frac = match["whole"], match["frac"] or ""
        if not whole and not frac:
            raise QuantityError(s, 'expected a fraction such as "1/7", "0.25" or "1"')
        value = _decimal(whole, frac)
    return -value if match["sign"] == "-" else value


def _round_away(value: Fraction) -> int:
    # k8s ScaledValue rounds away from zero (inf.RoundUp): -0.1 -> -1, 0.1 -> 1.
    return math.ceil(value) if value >= 0 else -math.ceil(-value)


def to_milli(q: Fraction | int) -> int:
    """``q`` in thousandths, rounded up (away from zero) as k8s ``MilliValue()`` does."""
    return _round_away(Fraction(q) * 1000)


def to_int(q: Fraction | int) -> int:
    """``q`` as an integer, rounded up (away from zero) as k8s ``Value()`` does."""
    return _round_away(Fraction(q))


def parse_cpu_milli(s: str | int | float) -> int:
    """Parse a CPU quantity to millicores: ``"1.5"`` -> 1500, ``"0.1m"`` -> 1."""
    return to_milli(parse_quantity(s))


def parse_bytes(s: str | int | float) -> int:
    """Parse a memory or storage quantity to bytes: ``"1Ki"`` -> 1024, ``"1.5k"`` -> 1500."""
    return to_int(parse_quantity(s))


def quantity_kind(resource: str) -> QuantityKind:
    """The rendering kind of a resource name, for ``format_quantity``."""
    if resource == "cpu":
        return "cpu"
    if resource in ("memory", "ephemeral-storage", "storage") or resource.startswith("hugepages-"):
        return "bytes"
    if resource == "nvidia.com/gpu" or resource.startswith("nvidia.com/mig-"):
        return "gpu"
    return "decimal"


def format_quantity(q: Fraction | int, kind: QuantityKind = "decimal") -> str:
    """Render an amount for people: ``"1500m"`` (cpu), ``"2Gi"`` (bytes), ``"0.5"`` (gpu).

    * ``cpu``: whole cores as integers (``"2"``), otherwise canonical decimal SI (``"1500m"``);
    * ``bytes``: the largest exact binary suffix (``"1536Mi"``), else (or when shorter)
      decimal SI (``"1k"``, ``"12E"``);
    * ``gpu``: a plain decimal (``"0.25"``), or ``"3/7"`` when no finite decimal exists;
    * ``decimal``: Kubernetes' canonical decimal SI form (``"1500m"``, ``"2k"``).

    Exact: values that decimal SI cannot show without rounding fall back to ``"p/q"``.
    """
    value = Fraction(q)
    if value < 0:
        return "-" + format_quantity(-value, kind)
    if value == 0:
        return "0"
    if kind == "gpu":
        return _plain_decimal(value) or f"{value.numerator}/{value.denominator}"
    if kind == "cpu" and value.denominator == 1:
        return str(value.numerator)
    decimal = _decimal_si(value)
    if kind == "bytes" and value.denominator == 1:
        for suffix, shift in reversed(_BINARY_SUFFIXES.items()):
            if value.numerator % (1 << shift) == 0:
                binary = f"{value.numerator >> shift}{suffix}"
                # "1536Mi" over "1610612736", but "12E" over "11444091796875Mi".
                return binary if len(binary) <= len(decimal) else decimal
    return decimal


def _decimal_si(value: Fraction) -> str:
    scaled = value * _NANO
    if scaled.denominator != 1:
        return _plain_decimal(value) or f"{value.numerator}/{value.denominator}"
    mantissa, exponent = scaled.numerator, -9
    while mantissa % 1000 == 0 and exponent < 18:
        mantissa, exponent = mantissa // 1000, exponent + 3
    return f"{mantissa}{_DECIMAL_SUFFIX_BY_EXPONENT[exponent]}"


def _plain_decimal(value: Fraction) -> str | None:
    """Exact decimal digits of a non-negative value, or None if they never terminate."""
    den, places = value.denominator, 0
    while den % 10 == 0:
        den, places = den // 10, places + 1
    while den % 2 == 0:
        den, places = den // 2, places + 1
    while den % 5 == 0:
        den, places = den // 5, places + 1
    if den != 1:
        return None
    digits = str(value.numerator * 10**places // value.denominator).rjust(places + 1, "0")
    if not places:
        return digits
    return f"{digits[:-places]}.{digits[-places:]}".rstrip("0").rstrip(".")
