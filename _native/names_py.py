"""Candidate-name helpers of the extender's verbs, pure-Python twin of ``names_c.pyx``.

kube-scheduler sends the candidates as node names and reads the answers as JSON text, so
these take Python strings:

* ``names_json`` / ``scores_json``: a list of names, or a ``HostPriorityList``
  (``[{"Host": h, "Score": s}, ...]``), as the exact ASCII bytes ``json.dumps`` writes;
  None when a name is not a ``str`` or needs a JSON escape (anything but printable ASCII
  other than ``"`` and ``\\``), or a score is outside 0..99: the caller then uses the
  generic encoder.
* ``rows_of``: each name's row in the state (``-1`` when unknown); ``NameTable`` does the
  same for a fixed list of names without Python's hashing.

Same results in both twins.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

__all__ = ["NameTable", "names_json", "rows_of", "scores_json"]


class _Ints(Protocol):
    def __getitem__(self, index: int, /) -> int: ...


class _IntsOut(_Ints, Protocol):
    def __setitem__(self, index: int, value: int, /) -> None: ...


def rows_of(names: Sequence[str], index: Mapping[str, int], out: _IntsOut) -> int:
    """``out[k] = index[names[k]]`` (int32), ``-1`` when absent or not a string; returns
    how many were found. ``names`` is a list or tuple."""
    found = 0
    for k in range(len(names)):
        name = names[k]
        row = index.get(name) if isinstance(name, str) else None
        if row is None:
            out[k] = -1
        else:
            out[k] = row
            found += 1
    return found


def _plain(host: object) -> bool:
    if type(host) is not str:
        return False
    return all(" " <= ch <= "~" and ch != '"' and ch != "\\" for ch in host)


def scores_json(hosts: Sequence[str], scores: _Ints, n: int) -> bytes | None:
    """``json.dumps([{"Host": hosts[k], "Score": scores[k]} ...]).encode()`` for the first
    ``n`` (``scores`` int64), or None (see the module docstring)."""
    parts = []
    for k in range(n):
        host, score = hosts[k], scores[k]
        if not _plain(host) or not 0 <= score <= 99:
            return None
        parts.append(f'{{"Host": "{host}", "Score": {score}}}')
    return ("[" + ", ".join(parts) + "]").encode("ascii")


def names_json(names: Sequence[str]) -> bytes | None:
    """``json.dumps(list(names)).encode()``, or None (see the module docstring)."""
    for host in names:
        if not _plain(host):
            return None
    return ("[" + ", ".join(f'"{host}"' for host in names) + "]").encode("ascii")


class NameTable:
    """The rows of ``names`` (row = position; a name listed twice keeps its last row, as
    a dict built in order would), in one flat open-addressing table: the bytes of every
    name in one buffer, FNV-1a hashes. Only names of one byte per character can be
    held; ``usable`` is False otherwise (use ``rows_of`` with a dict then)."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)
        self.usable = all(type(n) is str and max(map(ord, n), default=0) < 256 for n in names)
        self._index = {n: k for k, n in enumerate(names)} if self.usable else {}

    def __reduce__(self) -> tuple[type[NameTable], tuple[tuple[str, ...]]]:
        return (NameTable, (self.names,))

    def rows_of(self, names: Sequence[str], out: _IntsOut) -> int:
        """``out[k]`` = the row of ``names[k]`` (int32), ``-1`` when not held; returns how
        many were found. ``names`` is a list or tuple."""
        if not self.usable:
            raise ValueError("this NameTable holds no rows (a name of wide characters)")
        return rows_of(names, self._index, out)
