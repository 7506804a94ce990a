"""The extender's one-pass kernels (``fit.fit_rows``, ``scoring.flag_scores``,
``scoring.sigmoid_scores``, ``scoring.combine_scores``): the compiled module and its
pure-Python twin agree exactly on random inputs (ints equal, floats bit for bit), and
``fit_rows`` answers as ``fit_nodes`` does on the rows it is given."""

from __future__ import annotations

import math
import random
from array import array
from typing import Any

import pytest

from .conftest import (
    NO_EXTENSIONS_ENV,
    KernelImplementation,
    c_import_error,
    extensions_disabled,
    load_implementation,
)

_C_ERROR = c_import_error()
if _C_ERROR is not None and extensions_disabled():
    pytest.skip(
        f"compiled kernels do not import ({_C_ERROR}) and {NO_EXTENSIONS_ENV} is set: "
        "nothing to compare the twins with",
        allow_module_level=True,
    )

pytestmark = pytest.mark.native


@pytest.fixture(scope="module")
def pair() -> tuple[KernelImplementation, KernelImplementation]:
    if _C_ERROR is not None:
        pytest.fail(f"compiled kernels do not import ({_C_ERROR})", pytrace=False)
    return load_implementation("py"), load_implementation("c")


def _cluster(rng: random.Random, n: int, r: int, d: int) -> dict[str, Any]:
    free = array("d", [float(rng.choice([0, 500, 1000, 4000, 64000, -1000])) for _ in range(n * r)])
    dev = array("d", [float(rng.choice([-1, 0, 250, 500, 1000])) for _ in range(n * d)])
    healthy = array("b", [rng.choice([0, 1, 1, 1]) for _ in range(n)])
    return {"free": free, "dev_free": dev, "healthy": healthy}


def _fit_rows(impl: KernelImplementation, c: dict[str, Any], **kw: Any) -> tuple[Any, ...]:
    k, n = len(kw["rows"]), len(c["healthy"])
    out, ok, mask = array("i", bytes(4 * k)), array("b", bytes(k)), array("b", bytes(n))
    got = impl.fit.fit_rows(
        c["free"], c["dev_free"], kw["demand"], c["healthy"], kw["rows"], k, kw["r"], kw["d"],
        kw["milli"], kw["count"], kw["health"], out, ok, mask,
    )  # fmt: skip
    return tuple(got), out.tolist(), ok.tolist(), mask.tolist()


@pytest.mark.parametrize("seed", range(30))
def test_fit_rows_twins_agree_and_match_fit_nodes(
    seed: int, pair: tuple[KernelImplementation, KernelImplementation]
) -> None:
    rng = random.Random(seed)
    n, r, d = rng.randrange(1, 40), rng.randrange(1, 5), rng.randrange(1, 9)
    c = _cluster(rng, n, r, d)
    rows = array("i", [rng.randrange(-1, n) for _ in range(rng.randrange(0, 3 * n))])
    kw = {
        "rows": rows,
        "demand": array("d", [float(rng.choice([0, 500, 1000, 8000])) for _ in range(r)]),
        "r": r,
        "d": d,
        "milli": float(rng.choice([0, 250, 1000, 1500])),
        "count": rng.choice([0, 1, 2, 8]),
        "health": rng.choice([0, 1]),
    }
    py, cc = (_fit_rows(impl, c, **kw) for impl in pair)
    assert py == cc
    (n_fit, n_dup), out, ok, mask = py
    every = array("i", bytes(4 * n))
    pair[0].fit.fit_nodes(
        c["free"], c["dev_free"], kw["demand"], n, r, d, kw["milli"], kw["count"], every
    )
    seen: set[int] = set()
    dups = 0
    for k, i in enumerate(rows):
        if i < 0:
            assert out[k] == -2
        elif kw["health"] and not c["healthy"][i]:
            assert out[k] == r + 1
        else:
            assert out[k] == every[i]
        assert ok[k] == (out[k] == -1)
        if ok[k]:
            dups += i in seen
            seen.add(i)
    assert n_fit == sum(ok) and n_dup == dups
    assert [i for i in range(n) if mask[i]] == sorted(seen)


@pytest.mark.parametrize("seed", range(20))
def test_score_kernels_twins_agree(
    seed: int, pair: tuple[KernelImplementation, KernelImplementation]
) -> None:
    rng = random.Random(seed)
    n = rng.randrange(1, 60)
    mask = array("b", [rng.choice([0, 1, 1]) for _ in range(n)])
    flags = array("b", [rng.choice([0, 1, 3]) for _ in range(n)])
    pool = [-math.inf, math.nan, 0.0, -0.0, 1e-9, -2500.0, 700.5, 12000.0]
    delta = array("d", [rng.choice([*pool, rng.uniform(-9000, 9000)]) for _ in range(n)])
    outs = []
    for impl in pair:
        a, b = array("d", bytes(8 * n)), array("d", bytes(8 * n))
        impl.scoring.flag_scores(flags, mask, n, a)
        impl.scoring.sigmoid_scores(delta, mask, n, 1000.0, b)
        outs.append((a.tobytes(), b.tobytes()))
    assert outs[0] == outs[1]
    a = array("d", outs[0][0])
    assert all(a[i] == (-1.0 if not mask[i] else float(flags[i] != 0)) for i in range(n))
    b = array("d", outs[0][1])
    for i in range(n):
        if mask[i] and delta[i] > -math.inf:
            assert b[i] == 1.0 / (1.0 + math.exp(-delta[i] / 1000))
        else:
            assert b[i] == -1.0


@pytest.mark.parametrize("seed", range(40))
def test_combine_scores_twins_agree_and_round_half_to_even(
    seed: int, pair: tuple[KernelImplementation, KernelImplementation]
) -> None:
    rng = random.Random(seed)
    n, t = rng.randrange(1, 30), rng.randrange(0, 5)
    # Scores that land on halves (x.5 / 10) as well as arbitrary ones and negatives.
    pool = [-1.0, 0.0, -0.0, 0.05, 0.15, 0.25, 0.35, 0.45, 0.5, 0.65, 0.85, 0.95, 1.0, 1.5]
    terms = array("d", [rng.choice([*pool, rng.random()]) for _ in range(t * n)])
    weights = array("d", [rng.choice([1.0, 0.02, 0.5, 2.0, rng.random()]) for _ in range(t)])
    k = rng.randrange(0, 2 * n)
    rows = array("i", [rng.randrange(-1, n) for _ in range(k)])
    ok = array("b", [int(i >= 0 and rng.random() < 0.8) for i in rows])
    total = rng.choice([0.0, -1.0, sum(weights), 1.0, 3.0])
    lo, hi = rng.choice([(0, 10), (2, 8)])
    outs = []
    for impl in pair:
        raw, ints = array("d", bytes(8 * k)), array("q", bytes(8 * k))
        impl.scoring.combine_scores(
            terms, weights, t, n, rows, ok, k, total, 10.0, lo, hi, raw, ints
        )
        outs.append((raw.tobytes(), ints.tolist()))
    assert outs[0] == outs[1]
    raw = array("d", outs[0][0])
    for j in range(k):
        if not ok[j]:
            assert (raw[j], outs[0][1][j]) == (0.0, 0)
            continue
        acc = 0.0
        for s in range(t):
            acc += weights[s] * max(0.0, terms[s * n + rows[j]])
        want = acc / total if total > 0 else 0.0
        assert raw[j] == want
        assert outs[0][1][j] == min(hi, max(lo, round(want * 10)))


@pytest.mark.parametrize("seed", range(20))
def test_names_twins_agree_with_json_and_dict(
    seed: int, pair: tuple[KernelImplementation, KernelImplementation]
) -> None:
    import json

    names_py, names_c = (impl.names for impl in pair)
    rng = random.Random(seed)
    alphabet = ["a", "-", ".", "7", "~", " "] + (['"', "\\", "\x7f", "\x1f", "é", "☃"] * (seed % 2))
    names = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 8))) for _ in range(25)]
    index = {name: k for k, name in enumerate(rng.sample(names, 10))}
    scores = array("q", [rng.choice([0, 5, 10, 42, 99, 100, -1]) for _ in names])
    rows = []
    for mod in (names_py, names_c):
        out = array("i", bytes(4 * len(names)))
        found = mod.rows_of(names, index, out)
        rows.append((found, out.tolist()))
        assert mod.names_json(names) == mod.names_json(tuple(names))
    assert rows[0] == rows[1]
    assert rows[0][1] == [index.get(n, -1) for n in names]
    assert rows[0][0] == sum(n in index for n in names)

    def plain(some: list[str]) -> bool:
        return all(" " <= ch <= "~" and ch not in '"\\' for n in some for ch in n)

    for k in (0, 1, len(names)):
        got = [mod.scores_json(names, scores, k) for mod in (names_py, names_c)]
        assert got[0] == got[1]
        if plain(names[:k]) and all(0 <= s <= 99 for s in scores[:k]):
            items = [{"Host": h, "Score": s} for h, s in zip(names[:k], scores[:k], strict=True)]
            assert got[0] == json.dumps(items).encode()
        else:
            assert got[0] is None
    got_names = [mod.names_json(names) for mod in (names_py, names_c)]
    assert got_names[0] == got_names[1] == (json.dumps(names).encode() if plain(names) else None)
    assert names_c.names_json([*names[:3], 5]) is None is names_py.names_json([*names[:3], 5])


@pytest.mark.parametrize("seed", range(25))
def test_name_table_answers_as_a_dict(
    seed: int, pair: tuple[KernelImplementation, KernelImplementation]
) -> None:
    rng = random.Random(seed)
    alphabet = ["a", "b", "-", ".", "1", "\u00e9", "\xff"] + ["\u2603"] * (seed % 5 == 0)
    held = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 6))) for _ in range(40)]
    held += rng.sample(held, 5)  # listed twice: the last row wins, as in a dict
    index = {name: k for k, name in enumerate(held)}

    class Sub(str):
        pass

    asked: list[Any] = [*rng.sample(held, 20), "zz", "", "a" * 40, "\u2603", Sub("a"), 7]
    rng.shuffle(asked)
    got = []
    for impl in pair:
        table = impl.names.NameTable(held)
        if not table.usable:
            with pytest.raises(ValueError, match="wide characters"):
                table.rows_of(asked, array("i", bytes(4 * len(asked))))
            got.append((False, []))
            continue
        out = array("i", bytes(4 * len(asked)))
        found = table.rows_of(asked, out)
        want = [index.get(a, -1) if isinstance(a, str) else -1 for a in asked]
        assert out.tolist() == want
        assert found == sum(w >= 0 for w in want)
        got.append((True, out.tolist()))
    assert got[0] == got[1]
    assert got[0][0] == all(max(map(ord, n), default=0) < 256 for n in held)
