# cython: language_level=3
"""Candidate-name helpers of the extender's verbs, compiled twin of ``names_py.py``.

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

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_Check, PyUnicode_CheckExact
from libc.stdint cimport uint64_t
from libc.stdlib cimport free as c_free, malloc
from libc.string cimport memcmp, memcpy

__all__ = ["NameTable", "names_json", "rows_of", "scores_json"]

cdef extern from "Python.h":
    Py_ssize_t PyUnicode_GET_LENGTH(object)
    int PyUnicode_KIND(object)
    void* PyUnicode_DATA(object)
    int PyUnicode_1BYTE_KIND


def rows_of(names, dict index, int[::1] out):
    """``out[k] = index[names[k]]`` (int32), ``-1`` when absent or not a string; returns
    how many were found. ``names`` is a list or tuple."""
    cdef Py_ssize_t k, n = len(names), found = 0
    cdef PyObject* row
    for k in range(n):
        name = names[k]
        row = PyDict_GetItem(index, name) if PyUnicode_Check(name) else NULL
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


cdef inline uint64_t _fnv(const unsigned char* data, Py_ssize_t m) noexcept nogil:
    cdef uint64_t h = 14695981039346656037ULL
    cdef Py_ssize_t j
    for j in range(m):
        h = (h ^ data[j]) * 1099511628211ULL
    return h


cdef class NameTable:
    """The rows of ``names`` (row = position; a name listed twice keeps its last row, as
    a dict built in order would), in one flat open-addressing table: the bytes of every
    name in one buffer, FNV-1a hashes. Only names of one byte per character can be
    held; ``usable`` is False otherwise (use ``rows_of`` with a dict then)."""

    cdef char* arena
    cdef Py_ssize_t* start
    cdef Py_ssize_t* length
    cdef int* slots
    cdef Py_ssize_t mask, n
    cdef readonly bint usable
    cdef tuple names

    def __cinit__(self, names):
        cdef Py_ssize_t k, m, total = 0, cap = 8, at = 0
        cdef uint64_t h
        cdef int row
        self.names = tuple(names)
        self.n = len(names)
        self.usable = True
        for k in range(self.n):
            name = names[k]
            if not PyUnicode_CheckExact(name) or PyUnicode_KIND(name) != PyUnicode_1BYTE_KIND:
                self.usable = False
                return
            total += PyUnicode_GET_LENGTH(name)
        while cap < 2 * self.n:
            cap *= 2
        self.mask = cap - 1
        self.arena = <char*>malloc(total + 1)
        self.start = <Py_ssize_t*>malloc((self.n + 1) * sizeof(Py_ssize_t))
        self.length = <Py_ssize_t*>malloc((self.n + 1) * sizeof(Py_ssize_t))
        self.slots = <int*>malloc(cap * sizeof(int))
        if not self.arena or not self.start or not self.length or not self.slots:
            raise MemoryError()
        for k in range(cap):
            self.slots[k] = -1
        for k in range(self.n):
            name = names[k]
            m = PyUnicode_GET_LENGTH(name)
            memcpy(self.arena + at, PyUnicode_DATA(name), m)
            self.start[k] = at
            self.length[k] = m
            at += m
            h = _fnv(<const unsigned char*>(self.arena + self.start[k]), m) & self.mask
            while True:
                row = self.slots[h]
                if row < 0:
                    self.slots[h] = <int>k
                    break
                if self.length[row] == m and memcmp(self.arena + self.start[row], self.arena + at - m, m) == 0:
                    self.slots[h] = <int>k  # listed again: the last row wins
                    break
                h = (h + 1) & self.mask

    def __reduce__(self):
        return (NameTable, (self.names,))

    def __dealloc__(self):
        c_free(self.arena)
        c_free(self.start)
        c_free(self.length)
        c_free(self.slots)

    def rows_of(self, names, int[::1] out):
        """``out[k]`` = the row of ``names[k]`` (int32), ``-1`` when not held; returns how
        many were found. ``names`` is a list or tuple."""
        cdef Py_ssize_t k, m, n = len(names), found = 0
        cdef uint64_t h
        cdef int row
        cdef const char* data
        if not self.usable:
            raise ValueError("this NameTable holds no rows (a name of wide characters)")
        for k in range(n):
            name = names[k]
            out[k] = -1
            if not PyUnicode_Check(name) or PyUnicode_KIND(name) != PyUnicode_1BYTE_KIND:
                continue  # not a string, or wider characters: no name held (one form each)
            m = PyUnicode_GET_LENGTH(name)
            data = <const char*>PyUnicode_DATA(name)
            h = _fnv(<const unsigned char*>data, m) & self.mask
            while True:
                row = self.slots[h]
                if row < 0:
                    break
                if self.length[row] == m and memcmp(self.arena + self.start[row], data, m) == 0:
                    out[k] = row
                    found += 1
                    break
                h = (h + 1) & self.mask
        return found
