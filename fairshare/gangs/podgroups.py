"""The PodGroup objects that size pod groups, as read from the API: one group's object
(``PodGroupReader``, each read reused a few seconds), the whole list for a snapshot
(``list_podgroups``), and each object's group and ``min_count``. The caller passes the API
calls in; this module decides what is read, when a read is reused and what a failed read
means.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final

from fairshare.gangs.identity import ANN_MIN_MEMBERS, NATIVE_GROUP, GroupKey, group_of
from fairshare.gangs.plan import podgroup_min_count

KIND: Final = "PodGroup"
"""The kind a snapshot keeps the listed PodGroups under: coscheduling
(``scheduling.x-k8s.io/v1alpha1``) and native (``scheduling.k8s.io/v1alpha2``), told
apart by their ``apiVersion``."""

FetchPodGroup = Callable[[GroupKey], Awaitable[Mapping[str, Any] | None]]
"""Read one group's PodGroup (``GroupKey.api`` names its API; None: not found); raises
when it cannot be read."""

TTL: Final = 5.0
"""Seconds a read PodGroup (or its absence) is reused."""

ListObjects = Callable[[str, str, str], Awaitable[Mapping[str, Any]]]
"""List every object of (group, version, plural) in the cluster: the list's JSON. Raises
when the list fails, with the HTTP status as the exception's ``status`` (404: no such
API in the cluster)."""


class PodGroupReader:
    """Each group's PodGroup as read last through a fetch function, reused for ``ttl``
    seconds (an object that was not found too: None). A read that fails keeps nothing,
    so the next one asks again. ``max_entries``: past that many groups, the answers
    older than ``ttl`` are forgotten at the next read (None: all are kept, for
    ``last`` and ``min_counts``)."""

    def __init__(self, *, ttl: float = TTL, max_entries: int | None = None) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._held: dict[GroupKey, tuple[float, Mapping[str, Any] | None]] = {}
        self.version = 0
        """Counts the reads that asked ``fetch`` (what is known may have changed)."""

    async def read(
        self, key: GroupKey, fetch: FetchPodGroup, *, now: float
    ) -> Mapping[str, Any] | None:
        """``key``'s PodGroup (None: there is none): the answer read at most ``ttl``
        seconds before ``now``, else ``fetch(key)``, whose exception is raised."""
        held = self._held.get(key)
        if held is not None and now - held[0] < self.ttl:
            return held[1]
        obj = await fetch(key)
        self._held[key] = (now, obj)
        self.version += 1
        if self.max_entries is not None and len(self._held) > self.max_entries:
            for old in [k for k, (t, _) in self._held.items() if now - t >= self.ttl]:
                del self._held[old]
        return obj

    def last(self, key: GroupKey) -> Mapping[str, Any] | None:
        """``key``'s PodGroup as read last, however long ago (None: none or never read)."""
        held = self._held.get(key)
        return held[1] if held is not None else None

    def objects(self) -> dict[GroupKey, Mapping[str, Any] | None]:
        """Each group's PodGroup as read last (None: not found)."""
        return {key: obj for key, (_, obj) in self._held.items()}

    def min_counts(self) -> dict[GroupKey, int | None]:
        """``min_count`` of every PodGroup read and found (None: it has none)."""
        return {
            key: podgroup_min_count(obj) for key, (_, obj) in self._held.items() if obj is not None
        }


def _status_of(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


async def list_podgroups(
    list_objects: ListObjects, pods: Iterable[Mapping[str, Any]]
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every PodGroup (each tagged ``kind: PodGroup`` and its ``apiVersion``), listed only
    when one of ``pods`` is a gang member, and warnings. A cluster without the CRD has
    none; one whose PodGroups cannot be read (RBAC) adds a warning: the groups are then
    sized by their annotation, as if they had no PodGroup."""
    if not any(group_of(p) for p in pods):
        return [], []
    found: list[dict[str, Any]] = []
    warnings: list[str] = []
    for native in (False, True):
        group, version, plural = GroupKey("", "", native).api
        try:
            listed = await list_objects(group, version, plural)
        except Exception as exc:
            status = _status_of(exc)
            if status == 404:
                continue
            warnings.append(
                f"PodGroups {plural}.{group} cannot be listed ({status or exc}): "
                f"their gangs are sized by their {ANN_MIN_MEMBERS} annotation"
            )
            continue
        items = listed.get("items") if isinstance(listed, Mapping) else None
        found += [
            {**i, "kind": KIND, "apiVersion": f"{group}/{version}"}
            for i in items or []
            if isinstance(i, dict)
        ]
    return found, warnings


def key_of(podgroup: Mapping[str, Any]) -> GroupKey:
    """The group a listed PodGroup sizes (native when its ``apiVersion`` says so)."""
    meta = podgroup.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    native = str(podgroup.get("apiVersion", "")).startswith(NATIVE_GROUP + "/")
    return GroupKey(str(meta.get("namespace") or "default"), str(meta.get("name") or ""), native)


def min_counts(podgroups: Iterable[Mapping[str, Any]]) -> dict[GroupKey, int | None]:
    """``min_count`` of each listed PodGroup, by group (None: it has none)."""
    return {key_of(pg): podgroup_min_count(pg) for pg in podgroups}
