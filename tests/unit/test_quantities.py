"""Table tests for fairshare.quantities.

The valid and invalid tables follow apimachinery's quantity_test.go (TestQuantityParse) case
by case; the expected exact values are worked out in the comments.
"""

from __future__ import annotations

import pickle
from fractions import Fraction

import pytest

from fairshare import quantities
from fairshare.errors import FairshareError
from fairshare.quantities import QuantityError, parse_quantity

F = Fraction
NANO = F(1, 10**9)
MAX_INT64 = 2**63 - 1

VALID = [
    # Zero in every suffix.
    *[(s, F(0)) for s in ["0", "0n", "0u", "0m", "0Ki", "0k", "0Mi", "0M", "0Gi", "0G"]],
    ("0Ti", F(0)),
    ("0T", F(0)),
    # No suffix.
    ("1", F(1)),
    ("9", F(9)),
    # Binary suffixes: n * 2**(10*k).
    ("1Ki", F(1024)),
    ("8Ki", F(8 * 1024)),
    ("7Mi", F(7 * 2**20)),
    ("6Gi", F(6 * 2**30)),
    ("5Ti", F(5 * 2**40)),
    ("4Pi", F(4 * 2**50)),
    ("3Ei", F(3 * 2**60)),  # 3458764513820540928 < 2**63: not capped
    ("10Ti", F(10 * 2**40)),
    ("100Ti", F(100 * 2**40)),
    # Decimal suffixes: n * 10**e.
    ("5n", F(5, 10**9)),
    ("4u", F(4, 10**6)),
    ("3m", F(3, 1000)),
    ("100m", F(1, 10)),
    ("8k", F(8000)),
    ("50k", F(50_000)),
    ("7M", F(7 * 10**6)),
    ("6G", F(6 * 10**9)),
    ("5T", F(5 * 10**12)),
    ("40T", F(40 * 10**12)),
    ("300T", F(300 * 10**12)),
    ("2P", F(2 * 10**15)),
    ("1E", F(10**18)),  # "E" alone is exa, not an exponent
    # Decimal exponents.
    ("1E-3", F(1, 1000)),
    ("1e3", F(1000)),
    ("1E3", F(1000)),
    ("1E6", F(10**6)),
    ("1e9", F(10**9)),
    ("1E12", F(10**12)),
    ("1e13", F(10**13)),
    ("1e14", F(10**14)),
    ("1e15", F(10**15)),
    ("1E18", F(10**18)),
    ("12E-3", F(12, 1000)),
    ("1e+3", F(1000)),
    # Things that look like floating point.
    ("1.5", F(3, 2)),
    ("100.035k", F(100_035)),
    ("0.001", F(1, 1000)),
    ("0.0005k", F(1, 2)),  # 0.0005 * 1000
    ("0.005", F(5, 1000)),
    ("0.05", F(5, 100)),
    ("0.5", F(1, 2)),
    ("0.00050k", F(1, 2)),
    ("0.00500", F(5, 1000)),
    ("0.05000", F(5, 100)),
    ("0.50000", F(1, 2)),
    ("0.5e0", F(1, 2)),
    ("0.5e-1", F(5, 100)),
    ("0.5e-2", F(5, 1000)),
    ("10.035M", F(10_035_000)),
    ("1.2e3", F(1200)),
    ("1.3E+6", F(1_300_000)),
    ("1.40e9", F(1_400_000_000)),
    ("1.53E12", F(153 * 10**10)),
    ("1.6e15", F(16 * 10**14)),
    ("1.7E18", F(17 * 10**17)),
    ("9.01", F(901, 100)),
    ("8.1k", F(8100)),
    ("7.123456M", F(7_123_456)),
    ("6.987654321G", F(6_987_654_321)),
    ("5.444T", F(5444 * 10**9)),
    ("40.1T", F(401 * 10**11)),
    ("300.2T", F(3002 * 10**11)),
    ("2.5P", F(25 * 10**14)),
    ("1.01E", F(101 * 10**16)),
    # Non-zero magnitudes round up to a whole nano.
    ("3.001n", 4 * NANO),  # 3.001n -> 4n
    ("1.1E-9", 2 * NANO),  # 1.1n -> 2n
    ("0.0000000001", NANO),  # 0.1n -> 1n
    ("0.0000000005", NANO),
    ("0.00000000050", NANO),
    ("0.5e-9", NANO),
    ("0.9n", NANO),
    ("0.00000012345", 124 * NANO),  # 123.45n -> 124n
    ("0.00000012354", 124 * NANO),  # 123.54n -> 124n
    ("0.1m", F(1, 10_000)),  # 100n exactly: no rounding (to_milli rounds it up to 1m)
    # Binary magnitudes cap at 2**63-1; decimal ones do not.
    ("9Ei", F(MAX_INT64)),  # 9 * 2**60 = 10376293541461622784 > 2**63-1
    ("9223372036854775807Ki", F(MAX_INT64)),
    ("12E", F(12 * 10**18)),  # above 2**63-1 but DecimalSI: kept
    # Fractional binary values.
    ("1.5Gi", F(3 * 2**29)),  # 1610612736
    ("100.035Ki", F(10_243_584, 100)),  # 100.035 * 1024 = 102435.84
    ("0.5Mi", F(2**19)),
    ("0.05Gi", F(536_870_912, 10)),  # 53687091.2
    ("0.025Ti", F(274_877_906_944, 10)),  # 27487790694.4
    # Things written by trolls.
    ("0.000000000001Ki", 2 * NANO),  # 1.024e-9 -> 2n
    (".001", F(1, 1000)),
    (".5", F(1, 2)),
    (".0001k", F(1, 10)),
    ("1.", F(1)),
    ("5.", F(5)),
    ("1.G", F(10**9)),
    ("007", F(7)),
]


@pytest.mark.parametrize(("text", "expected"), VALID, ids=[t for t, _ in VALID])
def test_parse_quantity(text: str, expected: Fraction) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(("text", "expected"), VALID, ids=[t for t, _ in VALID])
@pytest.mark.parametrize("sign", ["-", "+"])
def test_parse_quantity_signed(text: str, expected: Fraction, sign: str) -> None:
    # As in quantity_test.go: every valid case also parses with an explicit sign, and the
    # rounding and the cap apply to the magnitude ("-3.001n" -> -4n, "-9Ei" -> -(2**63-1)).
    assert parse_quantity(sign + text) == (-expected if sign == "-" else expected)


NUMBERS = [
    (2, F(2)),
    (0, F(0)),
    (-3, F(-3)),
    (0.5, F(1, 2)),
    (0.1, F(1, 10)),  # repr "0.1": one tenth, not the nearest double
    (1e20, F(10**20)),  # repr "1e+20" is valid quantity syntax
    (2.0, F(2)),
]


@pytest.mark.parametrize(("number", "expected"), NUMBERS, ids=[repr(n) for n, _ in NUMBERS])
def test_parse_quantity_numbers(number: int | float, expected: Fraction) -> None:
    assert parse_quantity(number) == expected


INVALID = [
    # From quantity_test.go.
    "1.1.M",
    "1+1.0M",
    "0.1mi",
    "0.1am",
    "aoeu",
    ".5i",
    "1i",
    "-3.01i",
    "-3.01e-",
    " 1",
    "1 ",
    # More malformed input.
    "",
    "1.1.1",
    "1Kib",
    "1 Ki",
    "1iK",
    "0x1",
    "1e",
    "1ee3",
    "1e3.5",
    "1_000",
    "1,5",
    "\t1",
    "1\n",
    "１",  # fullwidth digit: only ASCII digits count
    "nan",
    "inf",
    "1/7",  # the fraction form belongs to parse_fraction only
    "1e99999",  # exponent beyond our +-10000 bound
    # The Go scanner reads a digit-less number as 0 and accepts these; the documented
    # grammar (and the CRD OpenAPI pattern) does not, and neither do we.
    "e3",
    "Ki",
    "m",
    ".",
    "-",
    "+",
    "-.",
]


@pytest.mark.parametrize("text", INVALID, ids=[repr(t) for t in INVALID])
def test_parse_quantity_invalid(text: str) -> None:
    with pytest.raises(QuantityError) as info:
        parse_quantity(text)
    assert f'"{text}"' in str(info.value)
    assert info.value.value == text


@pytest.mark.parametrize("value", [True, False, float("inf"), float("nan"), None, b"1"], ids=repr)
def test_parse_quantity_invalid_types(value: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty string"),
        ("1 Ki", "whitespace is not allowed"),
        ("Ki", "the number has no digits"),
        ("1Kib", "expected <number><suffix>"),
        ("1iK", 'unknown suffix "iK"'),
        ("1e99999", "exponent 99999 is out of range"),
    ],
    ids=["empty", "space", "no-digits", "malformed", "suffix", "exponent"],
)
def test_quantity_error_message(text: str, reason: str) -> None:
    with pytest.raises(QuantityError) as info:
        parse_quantity(text)
    assert str(info.value).startswith(f'invalid quantity "{text}": ')
    assert reason in info.value.reason


def test_quantity_error_is_value_error_and_fairshare_error() -> None:
    error = QuantityError("x", "bad")
    assert isinstance(error, ValueError)
    assert isinstance(error, FairshareError)


@pytest.mark.parametrize(
    ("text", "milli"),
    [
        ("0", 0),
        ("1", 1000),
        ("100m", 100),
        ("1.5", 1500),
        ("0.1m", 1),  # 0.1m rounds up to 1m (MilliValue)
        ("1n", 1),  # 0.000001m -> 1m
        ("1001u", 2),  # 1.001m -> 2m
        ("1Ki", 1_024_000),
        ("-0.1m", -1),  # k8s rounds away from zero
        ("-1.5", -1500),
    ],
)
def test_to_milli(text: str, milli: int) -> None:
    assert quantities.to_milli(parse_quantity(text)) == milli


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("1.5", 2),  # Value() rounds up
        ("0.1", 1),
        ("100m", 1),
        ("1Ki", 1024),
        ("1.5Gi", 1_610_612_736),
        ("-1.5", -2),  # away from zero
        ("12E", 12 * 10**18),  # no int64 overflow in Python
    ],
)
def test_to_int(text: str, value: int) -> None:
    assert quantities.to_int(parse_quantity(text)) == value


@pytest.mark.parametrize(
    ("value", "milli"),
    [("2", 2000), ("250m", 250), ("0.1m", 1), (1, 1000), (0.5, 500), ("1e-3", 1)],
)
def test_parse_cpu_milli(value: str | int | float, milli: int) -> None:
    assert quantities.parse_cpu_milli(value) == milli


@pytest.mark.parametrize(
    ("value", "size"),
    [
        ("1Gi", 2**30),
        ("64Gi", 64 * 2**30),
        ("1.5k", 1500),
        ("1e3", 1000),
        ("0.5Ki", 512),
        ("1m", 1),  # a thousandth of a byte rounds up to one byte
        (4096, 4096),
    ],
)
def test_parse_bytes(value: str | int, size: int) -> None:
    assert quantities.parse_bytes(value) == size


FRACTIONS = [
    ("1/7", F(1, 7)),
    ("2/7", F(2, 7)),
    ("3/6", F(1, 2)),
    ("0.25", F(1, 4)),
    ("0.05", F(1, 20)),
    ("1", F(1)),
    (".5", F(1, 2)),
    ("5.", F(5)),
    ("-1/2", F(-1, 2)),  # sign allowed; callers check the range
    (1, F(1)),
    (0.25, F(1, 4)),
    (0.1, F(1, 10)),  # repr-based, exact tenth
]


@pytest.mark.parametrize(("value", "expected"), FRACTIONS, ids=[repr(v) for v, _ in FRACTIONS])
def test_parse_fraction(value: str | int | float, expected: Fraction) -> None:
    assert quantities.parse_fraction(value) == expected


BAD_FRACTIONS = ["", "1/0", "1 / 7", "1/7/2", "/7", "1/", "1.5/2", "0.5Gi", "1e3", "abc", "."]


@pytest.mark.parametrize("value", BAD_FRACTIONS, ids=repr)
def test_parse_fraction_invalid(value: str) -> None:
    with pytest.raises(QuantityError):
        quantities.parse_fraction(value)


FORMATS = [
    (F(3, 2), "cpu", "1500m"),
    (F(2), "cpu", "2"),
    (F(1, 10), "cpu", "100m"),
    (F(2000), "cpu", "2000"),  # whole cores stay plain, not "2k"
    (F(1, 10_000), "cpu", "100u"),
    (F(2 * 2**30), "bytes", "2Gi"),
    (F(1_610_612_736), "bytes", "1536Mi"),  # 1.5Gi: largest exact binary suffix
    (F(1000), "bytes", "1k"),  # not a multiple of 1024
    (F(512), "bytes", "512"),
    (F(12 * 10**18), "bytes", "12E"),  # shorter than "11444091796875Mi"
    (F(1, 2), "gpu", "0.5"),
    (F(1, 20), "gpu", "0.05"),
    (F(3, 7), "gpu", "3/7"),  # no finite decimal
    (F(2), "gpu", "2"),
    (F(0), "gpu", "0"),
    (F(0), "bytes", "0"),
    (F(-3, 2), "cpu", "-1500m"),
    (F(2000), "decimal", "2k"),
    (F(1500), "decimal", "1500"),  # canonical: no fractional digits, largest exponent
    (F(1, 10**9), "decimal", "1n"),
    (F(1, 3), "decimal", "1/3"),
    (F(1, 10**10), "decimal", "0.0000000001"),  # below a nano: exact digits
]


@pytest.mark.parametrize(
    ("value", "kind", "text"), FORMATS, ids=[f"{k}-{t}" for _, k, t in FORMATS]
)
def test_format_quantity(value: Fraction, kind: quantities.QuantityKind, text: str) -> None:
    assert quantities.format_quantity(value, kind) == text


@pytest.mark.parametrize("kind", ["cpu", "bytes", "decimal"])
@pytest.mark.parametrize(("text", "value"), VALID, ids=[t for t, _ in VALID])
def test_format_then_parse_round_trips(
    text: str, value: Fraction, kind: quantities.QuantityKind
) -> None:
    # Every parsed value is a whole number of nanos, so its canonical form parses back.
    assert parse_quantity(quantities.format_quantity(value, kind)) == value


@pytest.mark.parametrize(
    ("resource", "kind"),
    [
        ("cpu", "cpu"),
        ("memory", "bytes"),
        ("ephemeral-storage", "bytes"),
        ("storage", "bytes"),
        ("hugepages-2Mi", "bytes"),
        ("nvidia.com/gpu", "gpu"),
        ("nvidia.com/mig-1g.10gb", "gpu"),
        ("example.com/fpga", "decimal"),
    ],
)
def test_quantity_kind(resource: str, kind: str) -> None:
    assert quantities.quantity_kind(resource) == kind


def test_quantity_error_pickles() -> None:
    error = pickle.loads(pickle.dumps(QuantityError("1Kib", "bad suffix")))
    assert isinstance(error, QuantityError)
    assert str(error) == 'invalid quantity "1Kib": bad suffix'


def test_remembered_quantities_are_the_parsed_ones_and_errors_are_not_kept() -> None:
    for text in ("1500m", "32Gi", "1e3", "0.1", "12E-3"):
        first = quantities.parse_quantity(text)
        assert quantities.parse_quantity(text) == first == quantities._parse_quantity(text)
        assert quantities._PARSED.get(text) == first
    for _ in range(2):
        with pytest.raises(quantities.QuantityError):
            quantities.parse_quantity("12 Gi")
    assert "12 Gi" not in quantities._PARSED
    assert quantities.parse_quantity(2) == 2 and 2 not in quantities._PARSED  # numbers: not kept
