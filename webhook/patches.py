"""RFC 6902 JSON Patch operations for the mutating webhook, built against the object as sent.

kube-apiserver rejects the whole request when a patch does not apply (even with
``failurePolicy: Ignore``), so ``PatchBuilder`` creates a missing map whole, with its first
entry. Map entries are set with ``add`` (which also replaces), and a value already right
gives no op, so the webhook stays idempotent under ``reinvocationPolicy: IfNeeded``.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "PatchBuilder",
    "PatchOp",
    "add",
    "encode_patch",
    "escape_pointer",
    "pointer",
    "remove",
    "replace",
    "set_annotation",
    "set_label",
]

OpName = Literal["add", "replace", "remove"]


@dataclass(frozen=True, slots=True)
class PatchOp:
    """One JSON Patch operation; ``value`` is unused by ``remove``."""

    op: OpName
    path: str
    value: Any = None

    def as_json(self) -> dict[str, Any]:
        """The operation as the JSON object RFC 6902 describes."""
        if self.op == "remove":
            return {"op": self.op, "path": self.path}
        return {"op": self.op, "path": self.path, "value": self.value}


def escape_pointer(token: str) -> str:
    """Escape one JSON Pointer reference token: ``~`` → ``~0`` first, then ``/`` → ``~1``."""
    return token.replace("~", "~0").replace("/", "~1")


def pointer(*tokens: str) -> str:
    """A JSON Pointer from raw tokens: ``pointer("metadata", "a/b")`` → ``/metadata/a~1b``."""
    return "".join("/" + escape_pointer(token) for token in tokens)


def add(path: str, value: Any) -> PatchOp:
    """``add``: create a member, or replace an existing one."""
    return PatchOp("add", path, value)


def replace(path: str, value: Any) -> PatchOp:
    """``replace``: the member must exist."""
    return PatchOp("replace", path, value)


def remove(path: str) -> PatchOp:
    """``remove``: the member must exist."""
    return PatchOp("remove", path)


class PatchBuilder:
    """Collects operations against one object, tracking the maps the patch itself creates.

    ``obj`` is never modified. Use one builder per response::

        builder = PatchBuilder(pod)
        builder.set_entry(("metadata", "labels"), "fairshare.io/tenant", "nlp")
        ops = builder.ops
    """

    def __init__(self, obj: Mapping[str, Any]) -> None:
        self._obj = obj
        self._created: dict[tuple[str, ...], dict[str, Any]] = {}
        self._ops: list[PatchOp] = []

    @property
    def ops(self) -> tuple[PatchOp, ...]:
        """The operations so far, in application order."""
        return tuple(self._ops)

    def _lookup(self, path: Sequence[str]) -> Any:
        """The value at ``path`` in the object as the patch so far leaves it (None if absent)."""
        node: Any = self._obj
        for i, token in enumerate(path):
            created = self._created.get(tuple(path[: i + 1]))
            if created is not None:
                node = created
            elif isinstance(node, Mapping):
                node = node.get(token)
            else:
                return None
        return node

    def set_entry(self, parent: Sequence[str], key: str, value: Any) -> None:
        """Make ``obj[parent...][key] == value``, creating missing parent maps whole."""
        where = tuple(parent)
        current = self._lookup(where)
        if isinstance(current, Mapping):
            if key in current and current[key] == value:
                return
            self._ops.append(add(pointer(*where, key), value))
            if where in self._created:
                self._created[where][key] = value
            return
        # Some maps on the way are missing (or null): find the deepest one that exists and
        # add the rest in one op, e.g. {"op":"add","path":"/metadata/labels","value":{k: v}}.
        exists = max(d for d in range(len(where)) if isinstance(self._lookup(where[:d]), Mapping))
        tree: dict[str, Any] = {key: value}
        for token in reversed(where[exists + 1 :]):
            tree = {token: tree}
        # A copy in the op: later entries mutate the tracked map, never an emitted value.
        self._ops.append(add(pointer(*where[: exists + 1]), copy.deepcopy(tree)))
        node = tree
        self._created[where[: exists + 1]] = node
        for i in range(exists + 1, len(where)):
            node = node[where[i]]
            self._created[where[: i + 1]] = node

    def extend(self, ops: Iterable[PatchOp]) -> None:
        """Append ops built elsewhere (list entries, which ``set_entry`` does not cover)."""
        self._ops.extend(ops)

    def set_field(self, path: Sequence[str], value: Any) -> None:
        """Make the field at ``path`` equal ``value`` (its parent map must exist)."""
        self.set_entry(path[:-1], path[-1], value)


def set_label(obj: Mapping[str, Any], key: str, value: str) -> tuple[PatchOp, ...]:
    """Ops that set label ``key`` to ``value`` on ``obj`` (creating ``metadata.labels``)."""
    builder = PatchBuilder(obj)
    builder.set_entry(("metadata", "labels"), key, value)
    return builder.ops


def set_annotation(obj: Mapping[str, Any], key: str, value: str) -> tuple[PatchOp, ...]:
    """Ops that set annotation ``key`` on ``obj`` (creating ``metadata.annotations``)."""
    builder = PatchBuilder(obj)
    builder.set_entry(("metadata", "annotations"), key, value)
    return builder.ops


def encode_patch(ops: Iterable[PatchOp]) -> str:
    """The JSON Patch array, compact JSON, base64 (the ``patch`` field's ``[]byte``)."""
    document = [op.as_json() for op in ops]
    text = json.dumps(document, separators=(",", ":"), ensure_ascii=False)
    return base64.b64encode(text.encode("utf-8")).decode("ascii")
