"""kube-scheduler extender v1 wire types (``k8s.io/kube-scheduler/extender/v1``).

The Go types have no json tags, so the wire keys are the Go field names (``NodeNames``,
``FailedNodes``, ``Host``), and the encoders write every field as Go's ``json.Marshal``
does (nil → ``null``). Decoding follows Go's ``encoding/json``: keys match
case-insensitively, the last match wins, unknown keys are ignored, and types are strict
(``NumPDBViolations`` must be an integer). Any problem raises ``WireFormatError`` naming
the field (a 400, never a 500). Pods and Nodes inside stay raw API JSON dicts. Plain
frozen dataclasses, not pydantic: a case-insensitive, last-wins lookup is simpler written
directly.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Final

from _native import names as native_names
from fairshare.errors import WireFormatError

MIN_EXTENDER_PRIORITY: Final = 0
MAX_EXTENDER_PRIORITY: Final = 10
"""Prioritize scores are integers in MIN..MAX_EXTENDER_PRIORITY (ks extender/v1 types.go)."""

RawObject = Mapping[str, Any]


# -- decoding helpers ------------------------------------------------------------------


def loads(body: bytes | str | Mapping[str, Any], what: str) -> Mapping[str, Any]:
    """The request body as a JSON object; anything else is a ``WireFormatError``."""
    if isinstance(body, Mapping):
        return body
    try:
        value = json.loads(body, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise WireFormatError(f"{what}: invalid JSON: {exc}") from None
    if not isinstance(value, Mapping):
        raise WireFormatError(f"{what}: expected a JSON object, got {_kind(value)}")
    return value


def _no_constant(name: str) -> Any:
    # Go's decoder has no NaN or Infinity; Python's would accept them.
    raise ValueError(f"{name} is not JSON")


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _fields(obj: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """Go-style lookup: each key matches a field name case-insensitively; last one wins."""
    folded = {n.casefold(): n for n in names}
    out: dict[str, Any] = {}
    for key, value in obj.items():
        name = folded.get(str(key).casefold())
        if name is not None:
            out[name] = value
    return out


def _object(value: object, path: str, *, nullable: bool) -> RawObject | None:
    if value is None and nullable:
        return None
    if not isinstance(value, Mapping):
        raise WireFormatError(f"{path}: expected an object, got {_kind(value)}")
    return value


def _string(value: object, path: str) -> str:
    if value is None:
        return ""  # Go leaves a string field empty for null
    if not isinstance(value, str):
        raise WireFormatError(f"{path}: expected a string, got {_kind(value)}")
    return value


def _int(value: object, path: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireFormatError(f"{path}: expected an integer, got {value!r}")
    return value


def _array(value: object, path: str) -> list[Any] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise WireFormatError(f"{path}: expected an array, got {_kind(value)}")
    return value


# -- requests --------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeList:
    """``*v1.NodeList`` as sent: ``{"metadata": {}, "items": [...]}`` (items kept raw)."""

    items: tuple[RawObject, ...]
    raw: RawObject

    def names(self) -> tuple[str, ...]:
        """``metadata.name`` of every item, in order (checked non-empty when decoded)."""
        return tuple(str((n.get("metadata") or {}).get("name", "")) for n in self.items)


@dataclass(frozen=True)
class ExtenderArgs:
    """Filter and prioritize request: ``Pod``, ``Nodes`` (or null), ``NodeNames`` (or null)."""

    pod: RawObject
    nodes: NodeList | None
    node_names: tuple[str, ...] | None

    def candidate_names(self) -> tuple[str, ...]:
        """The nodes asked about: ``NodeNames`` when sent, else the ``Nodes`` items."""
        if self.node_names is not None:
            return self.node_names
        return self.nodes.names() if self.nodes is not None else ()


def _pod(value: object, path: str) -> RawObject:
    """A Pod object, checked where the core reads it, so a hostile shape is a 400."""
    pod = _object(value, path, nullable=False)
    assert pod is not None
    meta = _object(pod.get("metadata"), f"{path}.metadata", nullable=True) or {}
    for key in ("name", "namespace", "uid"):
        if meta.get(key) is not None:
            _string(meta[key], f"{path}.metadata.{key}")
    _string_map(meta.get("annotations"), f"{path}.metadata.annotations")
    spec = _object(pod.get("spec"), f"{path}.spec", nullable=True) or {}
    for key in ("containers", "initContainers"):
        for k, c in enumerate(_array(spec.get(key), f"{path}.spec.{key}") or ()):
            where = f"{path}.spec.{key}[{k}]"
            container = _object(c, where, nullable=False)
            assert container is not None
            res = _object(container.get("resources"), f"{where}.resources", nullable=True) or {}
            for part in ("requests", "limits"):
                _quantity_map(res.get(part), f"{where}.resources.{part}")
    _quantity_map(spec.get("overhead"), f"{path}.spec.overhead")
    for k, v in enumerate(_array(spec.get("volumes"), f"{path}.spec.volumes") or ()):
        _object(v, f"{path}.spec.volumes[{k}]", nullable=False)
    return pod


def _string_map(value: object, path: str) -> None:
    for key, v in (_object(value, path, nullable=True) or {}).items():
        _string(v, f"{path}[{key}]")


def _quantity_map(value: object, path: str) -> None:
    # The API server sends quantities as strings; numbers are accepted as Go's
    # resource.Quantity unmarshaller accepts them.
    for key, v in (_object(value, path, nullable=True) or {}).items():
        if isinstance(v, bool) or not isinstance(v, str | int | float):
            raise WireFormatError(f"{path}[{key}]: expected a quantity, got {_kind(v)}")


def _node_list(value: object) -> NodeList | None:
    raw = _object(value, "Nodes", nullable=True)
    if raw is None:
        return None
    items = _array(_fields(raw, ("items",)).get("items"), "Nodes.items") or []
    nodes = []
    for k, item in enumerate(items):
        node = _object(item, f"Nodes.items[{k}]", nullable=False)
        assert node is not None
        meta = node.get("metadata") if isinstance(node, Mapping) else None
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if not isinstance(name, str) or not name:
            raise WireFormatError(f"Nodes.items[{k}].metadata.name: expected a non-empty string")
        nodes.append(node)
    return NodeList(tuple(nodes), raw)


def _names(value: object, path: str) -> tuple[str, ...] | None:
    items = _array(value, path)
    if items is None:
        return None
    try:
        "".join(items)  # the usual case: every item a string, checked at C speed
    except TypeError:
        pass
    else:
        return tuple(items)
    return tuple(_string(v, f"{path}[{k}]") for k, v in enumerate(items))


def decode_extender_args(body: bytes | str | Mapping[str, Any]) -> ExtenderArgs:
    """Decode a filter/prioritize body; raises ``WireFormatError``."""
    f = _fields(loads(body, "ExtenderArgs"), ("Pod", "Nodes", "NodeNames"))
    return ExtenderArgs(
        pod=_pod(f.get("Pod"), "Pod"),
        nodes=_node_list(f.get("Nodes")),
        node_names=_names(f.get("NodeNames"), "NodeNames"),
    )


@dataclass(frozen=True)
class MetaVictims:
    """``MetaVictims``: victim pod UIDs on one node and the PDB violations they cause."""

    pod_uids: tuple[str, ...]
    num_pdb_violations: int


@dataclass(frozen=True)
class Victims:
    """``Victims``: full victim pods on one node (``nodeCacheCapable: false``)."""

    pods: tuple[RawObject, ...]
    num_pdb_violations: int

    def meta(self) -> MetaVictims:
        """The same victims by UID (what the answer always uses)."""
        uids = tuple(str((p.get("metadata") or {}).get("uid", "")) for p in self.pods)
        return MetaVictims(uids, self.num_pdb_violations)


@dataclass(frozen=True)
class ExtenderPreemptionArgs:
    """Preempt request: ``Pod`` and one of ``NodeNameToVictims`` / ``NodeNameToMetaVictims``."""

    pod: RawObject
    node_name_to_victims: Mapping[str, Victims] | None
    node_name_to_meta_victims: Mapping[str, MetaVictims] | None

    def meta_victims(self) -> dict[str, MetaVictims]:
        """Victims by UID per node, whichever form was sent (meta wins if both are)."""
        if self.node_name_to_meta_victims is not None:
            return dict(self.node_name_to_meta_victims)
        return {n: v.meta() for n, v in (self.node_name_to_victims or {}).items()}


def _victim_map(value: object, path: str, *, meta: bool) -> dict[str, Any] | None:
    raw = _object(value, path, nullable=True)
    if raw is None:
        return None
    out: dict[str, Any] = {}
    for node, entry in raw.items():
        where = f"{path}[{node}]"
        obj = _object(entry, where, nullable=False)
        assert obj is not None
        f = _fields(obj, ("Pods", "NumPDBViolations"))
        pods = _array(f.get("Pods"), f"{where}.Pods") or []
        pdb = _int(f.get("NumPDBViolations"), f"{where}.NumPDBViolations")
        if meta:
            uids = []
            for k, p in enumerate(pods):
                mp = _object(p, f"{where}.Pods[{k}]", nullable=False)
                assert mp is not None
                uids.append(_string(_fields(mp, ("UID",)).get("UID"), f"{where}.Pods[{k}].UID"))
            out[str(node)] = MetaVictims(tuple(uids), pdb)
        else:
            full = tuple(_pod(p, f"{where}.Pods[{k}]") for k, p in enumerate(pods))
            out[str(node)] = Victims(full, pdb)
    return out


def decode_preemption_args(body: bytes | str | Mapping[str, Any]) -> ExtenderPreemptionArgs:
    """Decode a preempt body; raises ``WireFormatError``."""
    names = ("Pod", "NodeNameToVictims", "NodeNameToMetaVictims")
    f = _fields(loads(body, "ExtenderPreemptionArgs"), names)
    return ExtenderPreemptionArgs(
        pod=_pod(f.get("Pod"), "Pod"),
        node_name_to_victims=_victim_map(f.get("NodeNameToVictims"), names[1], meta=False),
        node_name_to_meta_victims=_victim_map(f.get("NodeNameToMetaVictims"), names[2], meta=True),
    )


@dataclass(frozen=True)
class ExtenderBindingArgs:
    """Bind request: ``PodName``, ``PodNamespace``, ``PodUID``, ``Node``."""

    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


def decode_binding_args(body: bytes | str | Mapping[str, Any]) -> ExtenderBindingArgs:
    """Decode a bind body; raises ``WireFormatError`` (name and node are required)."""
    names = ("PodName", "PodNamespace", "PodUID", "Node")
    f = _fields(loads(body, "ExtenderBindingArgs"), names)
    values = [_string(f.get(n), n) for n in names]
    for n, v in zip(names, values, strict=True):
        if n != "PodUID" and not v:
            raise WireFormatError(f"{n}: required")
    return ExtenderBindingArgs(*values)


# -- responses -------------------------------------------------------------------------


@dataclass(frozen=True)
class ExtenderFilterResult:
    """Filter answer. ``failed``/``failed_and_unresolvable`` map node → reason."""

    nodes: NodeList | None = None
    node_names: tuple[str, ...] | None = None
    failed_nodes: Mapping[str, str] | None = None
    failed_and_unresolvable_nodes: Mapping[str, str] | None = None
    error: str = ""

    def encode(self) -> dict[str, Any]:
        """Exact Go JSON: all five keys; absent forms are ``null``; maps sorted by node."""
        nodes: dict[str, Any] | None = None
        if self.nodes is not None:
            nodes = {k: v for k, v in self.nodes.raw.items() if k.casefold() != "items"}
            nodes["items"] = list(self.nodes.items)
        return {
            "Nodes": nodes,
            "NodeNames": list(self.node_names) if self.node_names is not None else None,
            "FailedNodes": _sorted_map(self.failed_nodes),
            "FailedAndUnresolvableNodes": _sorted_map(self.failed_and_unresolvable_nodes),
            "Error": self.error,
        }

    def body(self) -> bytes:
        """``json.dumps(self.encode())`` as UTF-8 bytes; the node names in one pass."""
        out = self.encode()
        names = out["NodeNames"]
        text: bytes | None = native_names.names_json(names) if names is not None else None
        if text is None:
            return json.dumps(out).encode()
        rest = {k: v for k, v in out.items() if k != "NodeNames"}
        head = json.dumps({"Nodes": rest.pop("Nodes")})[:-1].encode()
        tail = json.dumps(rest)[1:].encode()
        return head + b', "NodeNames": ' + text + b", " + tail


def _sorted_map(m: Mapping[str, str] | None) -> dict[str, str] | None:
    return None if m is None else {k: m[k] for k in sorted(m)}


@dataclass(frozen=True)
class HostPriority:
    """One node's score; ``score`` is an int (Go int64), 0..MAX_EXTENDER_PRIORITY."""

    host: str
    score: int

    def encode(self) -> dict[str, Any]:
        """``{"Host": ..., "Score": n}``; a non-int score is a bug, not a wire value."""
        if isinstance(self.score, bool) or not isinstance(self.score, int):
            raise TypeError(f"Score must be an int, got {self.score!r}")
        return {"Host": self.host, "Score": self.score}


class HostPriorityList(list[dict[str, Any]]):
    """A ``HostPriorityList`` as built by the encoders below: every item is
    ``{"Host": str, "Score": int}``, so ``dumps`` may write it without looking."""


def encode_host_priority_list(items: Sequence[HostPriority]) -> HostPriorityList:
    """``HostPriorityList``: a bare JSON array of ``{"Host", "Score"}``."""
    return HostPriorityList(h.encode() for h in items)


def encode_scores(hosts: Sequence[str], scores: Sequence[int]) -> HostPriorityList:
    """``encode_host_priority_list`` of ``HostPriority(h, s)`` pairs, without the
    per-node objects (the prioritize answer has one item per candidate)."""
    if len(hosts) != len(scores):
        raise ValueError("one score per host")
    if not set(map(type, scores)) <= {int}:
        bad = next(s for s in scores if type(s) is not int)
        raise TypeError(f"Score must be an int, got {bad!r}")
    if not set(map(type, hosts)) <= {str}:
        bad_host = next(h for h in hosts if type(h) is not str)
        raise TypeError(f"Host must be a string, got {bad_host!r}")
    return HostPriorityList([{"Host": h, "Score": s} for h, s in zip(hosts, scores, strict=True)])


_encode_str = json.encoder.encode_basestring_ascii


def dumps(value: Any) -> str:
    """``json.dumps(value)``, text for text; a ``HostPriorityList`` is written directly
    (the generic encoder spends most of a 5,000-node prioritize answer on it)."""
    if type(value) is HostPriorityList:
        enc, tails = _encode_str, _SCORE_TAILS
        hosts = map(enc, map(_HOST, value))
        ends = [tails.get(s) or f', "Score": {int.__repr__(s)}}}' for s in map(_SCORE, value)]
        body = ", ".join([f'{{"Host": {h}{t}' for h, t in zip(hosts, ends, strict=True)])
        return f"[{body}]"
    return json.dumps(value)


@dataclass(frozen=True)
class Scores:
    """A ``HostPriorityList`` as hosts and their scores, written by ``dumps_scores``."""

    hosts: Sequence[str]
    scores: Sequence[int]

    def body(self) -> bytes:
        """``dumps_scores(hosts, scores)`` as UTF-8 bytes (one pass when it can)."""
        scores = self.scores
        if isinstance(scores, array) and scores.typecode == "q" and len(scores) == len(self.hosts):
            hosts = self.hosts if isinstance(self.hosts, list | tuple) else list(self.hosts)
            text: bytes | None = native_names.scores_json(hosts, scores, len(scores))
            if text is not None:
                return text
        return dumps_scores(self.hosts, scores).encode()


def dumps_scores(hosts: Sequence[str], scores: Sequence[int]) -> str:
    """``dumps(encode_scores(hosts, scores))`` without the per-node dicts in between
    (the prioritize answer has one item per candidate). ``scores`` may be an int64
    ``array`` (ints by construction)."""
    ints = isinstance(scores, array) and scores.typecode == "q"
    if len(hosts) != len(scores) or not (ints or set(map(type, scores)) <= {int}):
        return dumps(encode_scores(hosts, scores))  # the checks and their errors
    if not hosts:
        return "[]"
    try:
        tails = map(_SCORE_TAILS.__getitem__, scores)
        items = _ITEM_SEP.join(map(str.__add__, map(_encode_str, hosts), tails))
    except (KeyError, TypeError):  # a score outside 0..10, or a host not a string
        return dumps(encode_scores(hosts, list(scores)))
    return '[{"Host": ' + items + "]"


_ITEM_SEP = ', {"Host": '


_HOST = itemgetter("Host")
_SCORE = itemgetter("Score")
_SCORE_TAILS = {
    s: f', "Score": {s}}}' for s in range(MIN_EXTENDER_PRIORITY, MAX_EXTENDER_PRIORITY + 1)
}
_SCORE_TAIL_KEYS = frozenset(_SCORE_TAILS)


@dataclass(frozen=True)
class ExtenderPreemptionResult:
    """Preempt answer: always by UID, whatever form the request used."""

    node_name_to_meta_victims: Mapping[str, MetaVictims]

    def encode(self) -> dict[str, Any]:
        """``{"NodeNameToMetaVictims": {node: {"Pods": [{"UID"}], "NumPDBViolations"}}}``."""
        out = {}
        for node in sorted(self.node_name_to_meta_victims):
            v = self.node_name_to_meta_victims[node]
            out[node] = {
                "Pods": [{"UID": uid} for uid in v.pod_uids],
                "NumPDBViolations": int(v.num_pdb_violations),
            }
        return {"NodeNameToMetaVictims": out}


@dataclass(frozen=True)
class ExtenderBindingResult:
    """Bind answer: ``Error`` empty on success."""

    error: str = ""

    def encode(self) -> dict[str, Any]:
        """``{"Error": "..."}``."""
        return {"Error": self.error}
