"""Quota for pod groups (gangs) at admission: a group is admitted whole or not at all.

A member (``fairshare.gangs.group_of``) is judged for its whole group: the first one is
admitted only if ``min_count`` members of its shape fit the limits of the tenant and its
ancestors, and its admission then **holds** the room of the members still to come, so a
group is never refused half-way. ``GangBook`` keeps each group's account, fed by the
watch and by the webhook's own admissions: its known members, its ``min_count`` (the
PodGroup's ``spec.minMember``, else ``fairshare.io/gang-min-members``) and its hold,
``(min_count - known members) × per-member demand``, until the group first has
``min_count`` members. ``GangHoldView`` adds every hold to its tenant's usage, and a
member is judged on what it adds beyond the hold it replaces (``judge_member``). A group
of unknown size is judged pod by pod, with a warning.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from fairshare import gangs
from fairshare.config.schema import FairShareConfig
from fairshare.resources import DemandError, add_amounts, pod_usage
from fairshare.state import objects
from webhook.view import TenantUsageView

__all__ = [
    "GangBook",
    "GangHoldView",
    "GroupAccount",
    "MemberJudgement",
    "judge_member",
]

Amounts = dict[str, Fraction]


def _scaled(amounts: Mapping[str, Fraction], k: int) -> Amounts:
    return {r: v * k for r, v in amounts.items() if v and k}


def _name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata")
    return str(meta.get("name") or "") if isinstance(meta, Mapping) else ""


@dataclass
class _Group:
    min_count: int | None = None
    per_member: Amounts | None = None
    """The demand one missing member is held at (from the member that opened the account)."""
    watched: dict[str, Amounts] = field(default_factory=dict)
    """Members the watch has, by pod name: what each counts in usage (a finished one: {})."""
    admitted: dict[str, tuple[float, Amounts]] = field(default_factory=dict)
    """Members admitted here, not watched yet: (expiry, demand)."""
    complete: bool = False

    def known(self, *, exclude: str = "") -> set[str]:
        return (set(self.watched) | set(self.admitted)) - {exclude}

    def held_per_member(self) -> Amounts:
        if self.per_member is not None:
            return dict(self.per_member)
        biggest: Amounts = {}
        for amounts in [*self.watched.values(), *(a for _, a in self.admitted.values())]:
            for r, v in amounts.items():
                biggest[r] = max(biggest.get(r, Fraction(0)), v)
        return biggest


@dataclass(frozen=True)
class GroupAccount:
    """A group's account as one member's admission sees it (that member left out)."""

    key: gangs.GroupKey
    min_count: int | None
    known: int
    """Members known besides the one judged."""
    members: Amounts
    """What those known members count in usage (watched) or reserve (admitted here)."""
    hold: Amounts
    """The room held for the members still to come (in the tenant's usage already)."""
    complete: bool


@dataclass
class GangBook:
    """The accounts of the groups the webhook knows (see the module's text).

    A state-source sink for ``Pod`` (``on_resync``/``on_event``); other kinds are ignored.
    ``config`` and ``device_memory`` give the rule pods count by (``pod_usage``, as the
    usage tracker counts them before they are bound)."""

    config: Callable[[], FairShareConfig]
    device_memory: Callable[[], int | None] = lambda: None
    groups: dict[gangs.GroupKey, _Group] = field(default_factory=dict)
    _now: float = 0.0

    # -- sink ------------------------------------------------------------------------

    def on_resync(self, kind: str, items: list[dict[str, Any]]) -> None:
        if kind != "Pod":
            return
        for group in self.groups.values():
            group.watched.clear()
        for pod in items:
            self._pod(pod, deleted=False)
        self._forget_empty()

    def on_event(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        if kind != "Pod":
            return
        self._pod(obj, deleted=event_type == "DELETED")
        self._forget_empty()

    def _pod(self, pod: Mapping[str, Any], *, deleted: bool) -> None:
        key = gangs.group_of(pod)
        name = _name(pod)
        if key is None or not name:
            return
        group = self.groups.get(key)
        if deleted:
            if group is not None:
                group.watched.pop(name, None)
                group.admitted.pop(name, None)
            return
        if group is None:
            group = self.groups[key] = _Group()
        group.admitted.pop(name, None)
        group.watched[name] = {} if objects.is_terminal(pod) else self._counted(pod)
        if group.min_count is None:
            group.min_count = gangs.annotated_min_count(pod)
        self._note_complete(group)

    def _counted(self, pod: Mapping[str, Any]) -> Amounts:
        try:
            demand = pod_usage(
                pod, mig=self.config().mig_fractions(), largest_memory=self.device_memory()
            )
        except DemandError:
            return {}
        return dict(demand.amounts)

    @staticmethod
    def _note_complete(group: _Group) -> None:
        if group.min_count is not None and len(group.known()) >= group.min_count:
            group.complete = True

    def _forget_empty(self) -> None:
        for key in [k for k, g in self.groups.items() if not g.watched and not g.admitted]:
            del self.groups[key]

    # -- admissions ------------------------------------------------------------------

    def expire(self, now: float) -> None:
        """Drop admitted members not watched by their expiry (their create failed later)."""
        self._now = max(self._now, now)
        for group in self.groups.values():
            for name in [n for n, (t, _) in group.admitted.items() if t <= now]:
                del group.admitted[name]
        self._forget_empty()

    def admitted(
        self,
        key: gangs.GroupKey,
        name: str,
        *,
        min_count: int | None,
        demand: Mapping[str, Fraction],
        expires: float,
    ) -> None:
        """Record the admission of member ``name`` (its group's account opens with it)."""
        group = self.groups.setdefault(key, _Group())
        if min_count is not None:
            group.min_count = min_count
        if group.per_member is None and not group.known(exclude=name):
            group.per_member = {r: v for r, v in demand.items() if v}
        if name not in group.watched:
            group.admitted[name] = (expires, dict(demand))
        self._note_complete(group)

    # -- reading ---------------------------------------------------------------------

    def learn(self, key: gangs.GroupKey, min_count: int) -> None:
        """The group's ``min_count`` as read now (its PodGroup), for an open account."""
        group = self.groups.get(key)
        if group is not None:
            group.min_count = min_count
            self._note_complete(group)

    def account(
        self, key: gangs.GroupKey, *, exclude: str = "", min_count: int | None = None
    ) -> GroupAccount:
        """Group ``key`` without member ``exclude`` (the one being judged); ``min_count``:
        the one to judge by when the book has none yet (the first member's)."""
        group = self.groups.get(key) or _Group()
        n = group.min_count if group.min_count is not None else min_count
        names = group.known(exclude=exclude)
        members: Amounts = {}
        for nm in names:
            got = group.watched.get(nm)
            add_amounts(members, got if got is not None else group.admitted[nm][1])
        return GroupAccount(
            key,
            n,
            len(names),
            members,
            self._hold(group, n, exclude=exclude),
            group.complete,
        )

    def _hold(self, group: _Group, n: int | None, *, exclude: str = "") -> Amounts:
        if group.complete or n is None or not (group.watched or group.admitted):
            return {}
        missing = n - len(group.known(exclude=exclude))
        return _scaled(group.held_per_member(), missing) if missing > 0 else {}

    def holds(
        self, namespaces: Iterable[str], *, exclude: tuple[gangs.GroupKey, str] | None = None
    ) -> Amounts:
        """The rooms held for missing members of the groups in ``namespaces``; the group
        of ``exclude`` (group, member) counted without that member."""
        wanted = set(namespaces)
        total: Amounts = {}
        for key, group in self.groups.items():
            if key.namespace in wanted:
                left_out = exclude[1] if exclude is not None and exclude[0] == key else ""
                add_amounts(total, self._hold(group, group.min_count, exclude=left_out))
        return total

    def incomplete(self) -> tuple[tuple[gangs.GroupKey, int, int], ...]:
        """Groups holding room: (key, known members, min_count), sorted."""
        out = []
        for key, group in sorted(self.groups.items()):
            if self._hold(group, group.min_count):
                assert group.min_count is not None
                out.append((key, len(group.known()), group.min_count))
        return tuple(out)


@dataclass(frozen=True)
class GangHoldView:
    """A ``TenantUsageView`` whose usage also holds the room of every incomplete group
    (its missing members) in the tenant's namespaces; ``exclude`` (group, member): the
    member being judged, left out of its group's account."""

    base: TenantUsageView
    book: GangBook
    exclude: tuple[gangs.GroupKey, str] | None = None

    def namespace_labels(self, namespace: str) -> Mapping[str, str]:
        return self.base.namespace_labels(namespace)

    def tenant_usage(self, tenant: str) -> Mapping[str, Fraction]:
        usage = dict(self.base.tenant_usage(tenant))
        add_amounts(
            usage, self.book.holds(self.base.tenant_namespaces(tenant), exclude=self.exclude)
        )
        return usage

    def tenant_namespaces(self, tenant: str) -> Sequence[str]:
        return self.base.tenant_namespaces(tenant)

    def max_device_memory(self) -> int | None:
        return self.base.max_device_memory()


@dataclass(frozen=True)
class MemberJudgement:
    """What one member's admission adds to its tenant's usage, and why."""

    account: GroupAccount
    demand: Amounts
    """The member's own demand."""
    after: Amounts
    """The group's whole demand once this member is admitted: its known members, this
    one, and the members still missing after it at this member's demand."""
    added: Amounts
    """``after`` less what the group counts now (known members and hold): the amounts to
    check against the limits (only positive ones are)."""

    @property
    def still_missing(self) -> int:
        n = self.account.min_count or 0
        return max(0, n - self.account.known - 1)


def judge_member(account: GroupAccount, demand: Mapping[str, Fraction]) -> MemberJudgement:
    """The member's addition to its tenant's usage (see the module's text)."""
    own = {r: v for r, v in demand.items() if v}
    n = account.min_count or 0
    missing_after = 0 if account.complete else max(0, n - account.known - 1)
    after = dict(account.members)
    add_amounts(after, own)
    add_amounts(after, _scaled(own, missing_after))
    now = dict(account.members)
    add_amounts(now, account.hold)
    added = dict(after)
    add_amounts(added, now, -1)
    return MemberJudgement(account, own, after, added)
