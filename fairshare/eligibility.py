"""Could a pending pod run on a node now? kube-scheduler's node-selection checks, as data.

The fair-share gate holds a tenant back only for a pod that is *waiting*: ``is_waiting``
(no scheduling gate left, a scheduler that calls the extender) and
``NodeConstraints.allows`` (the node passes the pod's ``nodeSelector``, required node
affinity and tolerations). The semantics are those of k8s.io/component-helpers
``scheduling/corev1/nodeaffinity`` and ``Toleration.ToleratesTaint``: ``matchFields``
knows ``metadata.name`` only, a requirement that cannot be parsed makes its term match
no node, and only ``NoSchedule`` / ``NoExecute`` taints keep a pod off a node. A spec
part of an unexpected shape reads as "matches no node" (``NOWHERE``); nothing raises.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

DEFAULT_SCHEDULER: Final = "default-scheduler"
BLOCKING_EFFECTS: Final = frozenset({"NoSchedule", "NoExecute"})
NODE_NAME_FIELD: Final = "metadata.name"

_INT64: Final = re.compile(r"[+-]?[0-9]+")
_INT64_MAX: Final = 2**63 - 1

Taint = tuple[str, str, str]
"""(key, value, effect) of a node taint."""


@dataclass(frozen=True)
class Requirement:
    """One parsed ``matchExpressions`` / ``matchFields`` entry."""

    key: str
    operator: str
    values: frozenset[str] = frozenset()
    number: int = 0  # the value of Gt / Lt

    def matches(self, present: bool, value: str) -> bool:
        """Does a label (``present``, ``value``) satisfy the requirement?"""
        op = self.operator
        if op == "In":
            return present and value in self.values
        if op == "NotIn":
            return not present or value not in self.values
        if op == "Exists":
            return present
        if op == "DoesNotExist":
            return not present
        have = _parse_int64(value) if present else None
        if have is None:
            return False
        return have > self.number if op == "Gt" else have < self.number


@dataclass(frozen=True)
class Term:
    """One ``nodeSelectorTerm``: label requirements and field requirements, ANDed."""

    labels: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        for req in self.labels:
            value = labels.get(req.key)
            if not req.matches(value is not None, value or ""):
                return False
        for req in self.fields:
            present = req.key == NODE_NAME_FIELD and bool(name)
            if not req.matches(present, name if present else ""):
                return False
        return True


@dataclass(frozen=True)
class Toleration:
    """A pod toleration (``operator`` "" means Equal)."""

    key: str = ""
    operator: str = ""
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        key, value, effect = taint
        if self.effect and self.effect != effect:
            return False
        if self.key and self.key != key:
            return False
        if self.operator == "Exists":
            return True
        if self.operator in ("", "Equal"):
            return self.value == value
        return False


@dataclass(frozen=True)
class NodeConstraints:
    """A pod's node-selection constraints, parsed once; ``allows`` is the per-node test.

    ``terms`` is None when the pod has no required node affinity; an empty tuple then
    means "matches no node". ``matches_nothing`` short-cuts a pod that no node can take.
    """

    selector: tuple[tuple[str, str], ...] = ()
    terms: tuple[Term, ...] | None = None
    tolerations: tuple[Toleration, ...] = ()
    matches_nothing: bool = False

    @property
    def selects_by_labels(self) -> bool:
        """Does anything but taints restrict the nodes (selector, affinity, nothing-matches)?"""
        return bool(self.selector) or self.terms is not None or self.matches_nothing

    def pinned_values(self, key: str) -> frozenset[str] | None:
        """The values of label ``key`` a node must have to pass, when the node selector
        or every required affinity term pins it to a list (``In``); None when some
        passing node may have another value or no such label."""
        pinned: frozenset[str] | None = None
        for k, value in self.selector:
            if k == key:
                pinned = frozenset({value}) if pinned is None else pinned & {value}
        if self.terms:
            union: set[str] = set()
            for term in self.terms:
                values: frozenset[str] | None = None
                for req in term.labels:
                    if req.key == key and req.operator == "In":
                        values = req.values if values is None else values & req.values
                if values is None:
                    return pinned  # this term lets other values through
                union |= values
            pinned = frozenset(union) if pinned is None else pinned & union
        return pinned

    def allows(self, name: str, labels: Mapping[str, str], taints: Sequence[Taint]) -> bool:
        """Would kube-scheduler's NodeAffinity and TaintToleration filters pass the node?"""
        if self.matches_nothing:
            return False
        for key, value in self.selector:
            if labels.get(key) != value:
                return False
        if self.terms is not None and not any(t.matches(name, labels) for t in self.terms):
            return False
        for taint in taints:
            if taint[2] in BLOCKING_EFFECTS and not any(
                tol.tolerates(taint) for tol in self.tolerations
            ):
                return False
        return True

    def why_not(self, name: str, labels: Mapping[str, str], taints: Sequence[Taint]) -> str:
        """Why ``allows`` refuses the node, in kube-scheduler's words; "" when it allows it.

        The slow twin of ``allows`` for explanations (``fairshare explain``, the status page);
        the scheduling path keeps ``allows``.
        """
        if self.matches_nothing:
            return "the pod's node affinity matches no node"
        for key, value in self.selector:
            if labels.get(key) != value:
                have = labels.get(key)
                return f"node didn't match Pod's node selector ({key}={value}; " + (
                    f"the node has {key}={have})" if have is not None else f"the node has no {key})"
                )
        if self.terms is not None and not any(t.matches(name, labels) for t in self.terms):
            return "node didn't match Pod's required node affinity"
        for taint in taints:
            if taint[2] in BLOCKING_EFFECTS and not any(
                tol.tolerates(taint) for tol in self.tolerations
            ):
                key, value, effect = taint[0], taint[1], taint[2]
                shown = f"{key}={value}" if value else key
                return f"node had untolerated taint {{{shown}:{effect}}}"
        return ""


UNCONSTRAINED: Final = NodeConstraints()
NOWHERE: Final = NodeConstraints(matches_nothing=True)


def _parse_int64(text: str) -> int | None:
    """Go's ``strconv.ParseInt(text, 10, 64)``: optional sign, digits, in range."""
    if not _INT64.fullmatch(text):
        return None
    n = int(text)
    return n if -_INT64_MAX - 1 <= n <= _INT64_MAX else None


class _Unreadable(Exception):
    """A constraint of an unexpected shape or an unparsable requirement."""


def _string_list(value: object) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _Unreadable
    return value


def _requirement(entry: object, *, fields: bool) -> Requirement:
    if not isinstance(entry, Mapping):
        raise _Unreadable
    key, op = entry.get("key"), entry.get("operator")
    values = _string_list(entry.get("values"))
    if not isinstance(key, str) or not isinstance(op, str):
        raise _Unreadable
    if fields:
        if op not in ("In", "NotIn") or len(values) != 1:
            raise _Unreadable
        return Requirement(key, op, frozenset(values))
    if op in ("In", "NotIn"):
        if not values:
            raise _Unreadable
        return Requirement(key, op, frozenset(values))
    if op in ("Exists", "DoesNotExist"):
        if values:
            raise _Unreadable
        return Requirement(key, op)
    if op in ("Gt", "Lt"):
        number = _parse_int64(values[0]) if len(values) == 1 else None
        if number is None:
            raise _Unreadable
        return Requirement(key, op, number=number)
    raise _Unreadable


def _term(term: object) -> Term | None:
    """A parsed term; None for a term that matches no node (empty or unparsable)."""
    if not isinstance(term, Mapping):
        return None
    exprs, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not isinstance(exprs, list) or not isinstance(fields, list) or not (exprs or fields):
        return None
    try:
        return Term(
            tuple(_requirement(e, fields=False) for e in exprs),
            tuple(_requirement(f, fields=True) for f in fields),
        )
    except _Unreadable:
        return None


def _required_terms(spec: Mapping[str, Any]) -> tuple[Term, ...] | None:
    affinity = spec.get("affinity")
    if affinity is None:
        return None
    if not isinstance(affinity, Mapping):
        raise _Unreadable
    node_affinity = affinity.get("nodeAffinity")
    if node_affinity is None:
        return None
    if not isinstance(node_affinity, Mapping):
        raise _Unreadable
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return None
    if not isinstance(required, Mapping):
        raise _Unreadable
    terms = required.get("nodeSelectorTerms") or []
    if not isinstance(terms, list):
        raise _Unreadable
    return tuple(t for t in map(_term, terms) if t is not None)


def _tolerations(spec: Mapping[str, Any]) -> tuple[Toleration, ...]:
    items = spec.get("tolerations") or []
    if not isinstance(items, list):
        raise _Unreadable
    out = []
    for item in items:
        if not isinstance(item, Mapping):
            raise _Unreadable
        parts = [item.get(k) or "" for k in ("key", "operator", "value", "effect")]
        if not all(isinstance(p, str) for p in parts):
            raise _Unreadable
        out.append(Toleration(*parts))
    return tuple(out)


def _selector(spec: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    selector = spec.get("nodeSelector") or {}
    if not isinstance(selector, Mapping):
        raise _Unreadable
    pairs = tuple(sorted(selector.items()))
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in pairs):
        raise _Unreadable
    return pairs


def parse_node_constraints(spec: Mapping[str, Any]) -> NodeConstraints:
    """The pod spec's node selector, required node affinity and tolerations.

    A pod with none of them (and so tolerating no blocking taint) gets ``UNCONSTRAINED``
    when it tolerates nothing, so most pods share one object. Unexpected shapes give
    ``NOWHERE`` (see the module docstring).
    """
    try:
        selector, terms, tolerations = _selector(spec), _required_terms(spec), _tolerations(spec)
    except _Unreadable:
        return NOWHERE
    if terms == ():
        return NOWHERE
    if not selector and terms is None and not tolerations:
        return UNCONSTRAINED
    return NodeConstraints(selector, terms, tolerations)


def served_schedulers(scheduler_name: str | None) -> frozenset[str]:
    """The ``schedulerName`` of the pods the extender is asked about: the config's
    ``schedulerName`` when set (pods routed to the fairshare-scheduler), else kube's
    default scheduler (the extender merged into the default scheduler)."""
    return frozenset({scheduler_name or DEFAULT_SCHEDULER})


def is_waiting(spec: Mapping[str, Any], served: Collection[str]) -> bool:
    """Is the pod in the queue of a scheduler in ``served``, with no scheduling gate left?"""
    gates = spec.get("schedulingGates")
    if gates:
        return False
    name = spec.get("schedulerName") or DEFAULT_SCHEDULER
    return name in served
