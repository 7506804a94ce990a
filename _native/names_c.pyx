# cython: language_level=3
"""Candidate-name helpers of the extender's verbs, compiled twin of ``names_py.py``.

Unlike the numeric kernels these take Python strings: kube-scheduler sends the
candidates as node names and reads the answer as JSON text, so the per-name steps at
both ends are the last per-candidate loops of a verb.

* ``names_json``: a list of names as the exact text ``json.dumps`` writes for it, as
  ASCII bytes; None when a name needs an escape or is not a ``str`` (as above).
* ``rows_of``: each name's row in the state (a ``dict`` lookup), ``-1`` when unknown.
* ``scores_json``: a ``HostPriorityList`` as the exact text ``json.dumps`` writes for
  ``[{"Host": h, "Score": s}, ...]``, as ASCII bytes; None when a host would need a
  JSON escape (anything but printable ASCII other than ``"`` and ``\\``), is not a
  ``str``, or a score is outside 0..99: the caller then uses the generic encoder.

Imports nothing from the project. Same results as the twin.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_CheckExact
from libc.string cimport memcpy

__all__ = ["names_json", "rows_of", "scores_json"]

cdef extern from "Python.h":
    Py_ssize_t PyUnicode_GET_LENGTH(object)
    int PyUnicode_KIND(object)
    void* PyUnicode_DATA(object)
    int PyUnicode_1BYTE_KIND


def rows_of(names, dict index, int[::1] out):
    """``out[k] = index[names[k]]`` (int32), ``-1`` when absent; returns how many were
    found. ``names`` is a list or tuple."""
    cdef Py_ssize_t k, n = len(names), found = 0
    cdef PyObject* row
    for k in range(n):
        row = PyDict_GetItem(index, names[k])
        if row == NULL:
            out[k] = -1
        else:
            out[k] = <int>(<object>row)
            found += 1
    return found


cdef bint _plain(object host):
    """Printable ASCII with nothing to escape (one byte per character)."""
    cdef Py_ssize_t j, m
    cdef unsigned char* data
    cdef unsigned char ch
    if not PyUnicode_CheckExact(host) or PyUnicode_KIND(host) != PyUnicode_1BYTE_KIND:
        return False
    m = PyUnicode_GET_LENGTH(host)
    data = <unsigned char*>PyUnicode_DATA(host)
    for j in range(m):
        ch = data[j]
        if ch < 0x20 or ch > 0x7E or ch == 0x22 or ch == 0x5C:
            return False
    return True


def scores_json(hosts, const long long[::1] scores, Py_ssize_t n):
    """``json.dumps([{"Host": hosts[k], "Score": scores[k]} ...]).encode()`` for the first
    ``n`` (``scores`` int64), or None (see the module docstring)."""
    cdef Py_ssize_t k, m, total = 2, at
    cdef long long s
    cdef char* buf
    cdef object host
    cdef const char* head = b'{"Host": "'
    cdef const char* mid = b'", "Score": '
    for k in range(n):
        host = hosts[k]
        s = scores[k]
        if not _plain(host) or s < 0 or s > 99:
            return None
        total += 10 + PyUnicode_GET_LENGTH(host) + 12 + (1 if s < 10 else 2) + 1
        if k:
            total += 2
    out = PyBytes_FromStringAndSize(NULL, total)
    buf = PyBytes_AS_STRING(out)
    buf[0] = b'['
    at = 1
    for k in range(n):
        host = hosts[k]
        s = scores[k]
        if k:
            buf[at] = b','
            buf[at + 1] = b' '
            at += 2
        memcpy(buf + at, head, 10)
        at += 10
        m = PyUnicode_GET_LENGTH(host)
        memcpy(buf + at, PyUnicode_DATA(host), m)
        at += m
        memcpy(buf + at, mid, 12)
        at += 12
        if s >= 10:
            buf[at] = <char>(48 + s // 10)
            at += 1
        buf[at] = <char>(48 + s % 10)
        buf[at + 1] = b'}'
        at += 2
    buf[at] = b']'
    return out


def names_json(names):
    """``json.dumps(list(names)).encode()``, or None (see the module docstring)."""
    cdef Py_ssize_t k, m, n = len(names), total = 2, at
    cdef char* buf
    cdef object host
    for k in range(n):
        host = names[k]
        if not _plain(host):
            return None
        total += PyUnicode_GET_LENGTH(host) + 2
        if k:
            total += 2
    out = PyBytes_FromStringAndSize(NULL, total)
    buf = PyBytes_AS_STRING(out)
    buf[0] = b'['
    at = 1
    for k in range(n):
        host = names[k]
        if k:
            buf[at] = b','
            buf[at + 1] = b' '
            at += 2
        buf[at] = b'"'
        at += 1
        m = PyUnicode_GET_LENGTH(host)
        memcpy(buf + at, PyUnicode_DATA(host), m)
        at += m
        buf[at] = b'"'
        at += 1
    buf[at] = b']'
    return out
