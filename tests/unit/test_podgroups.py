"""The PodGroup objects that size pod groups (``fairshare.gangs.podgroups``): the list a
snapshot takes, and each object's group and size."""

from __future__ import annotations

from typing import Any

from fairshare import gangs
from fairshare.gangs import podgroups
from fairshare.state.snapshot import Snapshot
from fairshare_cli import live
from tests.unit.test_gangs import CONFIG

MEMBER = {"metadata": {"namespace": "ml", "name": "p0", "labels": {gangs.POD_GROUP_LABEL: "job"}}}
LONER = {"metadata": {"namespace": "ml", "name": "solo"}}


class Failed(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


def lister(answers: dict[str, Any], calls: list[str]) -> podgroups.ListObjects:
    async def list_all(group: str, version: str, plural: str) -> dict[str, Any]:
        calls.append(f"{group}/{version}")
        got = answers[group]
        if isinstance(got, Exception):
            raise got
        return {"items": got}

    return list_all


COSCHED = {"metadata": {"namespace": "ml", "name": "job"}, "spec": {"minMember": 3}}
NATIVE = {
    "metadata": {"namespace": "ml", "name": "n"},
    "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}},
}


async def test_listed_only_when_a_pod_is_a_gang_member() -> None:
    calls: list[str] = []
    found, warnings = await podgroups.list_podgroups(lister({}, calls), [LONER])
    assert (found, warnings, calls) == ([], [], [])


async def test_both_apis_are_listed_and_tagged() -> None:
    calls: list[str] = []
    answers = {gangs.PODGROUP_GROUP: [COSCHED, "junk"], gangs.NATIVE_GROUP: [NATIVE]}
    found, warnings = await podgroups.list_podgroups(lister(answers, calls), [LONER, MEMBER])
    assert warnings == []
    assert calls == ["scheduling.x-k8s.io/v1alpha1", "scheduling.k8s.io/v1alpha2"]
    assert [(pg["kind"], pg["apiVersion"]) for pg in found] == [
        ("PodGroup", "scheduling.x-k8s.io/v1alpha1"),
        ("PodGroup", "scheduling.k8s.io/v1alpha2"),
    ]
    assert podgroups.min_counts(found) == {
        gangs.GroupKey("ml", "job"): 3,
        gangs.GroupKey("ml", "n", native=True): 2,
    }


async def test_a_missing_api_is_no_podgroup_and_a_refused_list_a_warning() -> None:
    answers = {gangs.PODGROUP_GROUP: Failed(403), gangs.NATIVE_GROUP: Failed(404)}
    found, warnings = await podgroups.list_podgroups(lister(answers, []), [MEMBER])
    assert found == []
    assert warnings == [
        "PodGroups podgroups.scheduling.x-k8s.io cannot be listed (403): their gangs are "
        "sized by their fairshare.io/gang-min-members annotation"
    ]


async def test_the_cli_adds_the_list_to_its_snapshot(monkeypatch: Any) -> None:
    from fairshare.state import informers

    answers = {gangs.PODGROUP_GROUP: [COSCHED], gangs.NATIVE_GROUP: Failed(500)}
    monkeypatch.setattr(informers, "custom_object_lister", lambda _client: lister(answers, []))
    snap = Snapshot(CONFIG, {"Pod": [MEMBER]}, warnings=["first"])
    await live.list_podgroups(object(), snap)
    assert [pg["metadata"]["name"] for pg in snap.objects[podgroups.KIND]] == ["job"]
    assert snap.warnings[0] == "first" and "(500)" in snap.warnings[1]
    assert live.podgroup_sizes(snap) == {gangs.GroupKey("ml", "job"): 3}


# --- one group's PodGroup, read by the webhook and the extender --------------------------

KEY = gangs.GroupKey("ml", "job")


def fetcher(answers: dict[gangs.GroupKey, Any], calls: list[gangs.GroupKey]) -> Any:
    async def fetch(key: gangs.GroupKey) -> Any:
        calls.append(key)
        got = answers.get(key)
        if isinstance(got, Exception):
            raise got
        return got

    return fetch


async def test_a_read_is_reused_for_the_ttl_absence_included() -> None:
    calls: list[gangs.GroupKey] = []
    answers: dict[gangs.GroupKey, Any] = {KEY: COSCHED}
    fetch = fetcher(answers, calls)
    reader = podgroups.PodGroupReader()
    assert await reader.read(KEY, fetch, now=100.0) is COSCHED
    answers[KEY] = None
    assert await reader.read(KEY, fetch, now=100.0 + podgroups.TTL - 0.1) is COSCHED
    assert calls == [KEY]
    assert await reader.read(KEY, fetch, now=100.0 + podgroups.TTL) is None
    assert await reader.read(KEY, fetch, now=101.0 + podgroups.TTL) is None
    assert calls == [KEY, KEY]


async def test_a_failed_read_keeps_nothing_and_the_last_answer_stays_known() -> None:
    calls: list[gangs.GroupKey] = []
    answers: dict[gangs.GroupKey, Any] = {KEY: COSCHED}
    fetch = fetcher(answers, calls)
    reader = podgroups.PodGroupReader()
    await reader.read(KEY, fetch, now=0.0)
    answers[KEY] = Failed(403)
    try:
        await reader.read(KEY, fetch, now=60.0)
    except Failed:
        pass
    else:
        raise AssertionError("the fetch's exception is raised")
    assert reader.last(KEY) is COSCHED and reader.min_counts() == {KEY: 3}
    assert reader.last(gangs.GroupKey("ml", "other")) is None


async def test_past_max_entries_the_stale_reads_are_forgotten() -> None:
    keys = [gangs.GroupKey("ml", f"g{i}") for i in range(3)]
    fetch = fetcher({k: COSCHED for k in keys}, [])
    reader = podgroups.PodGroupReader(max_entries=2)
    await reader.read(keys[0], fetch, now=0.0)
    await reader.read(keys[1], fetch, now=10.0)
    await reader.read(keys[2], fetch, now=10.0 + podgroups.TTL - 1)
    assert set(reader.min_counts()) == {keys[1], keys[2]}
    unbounded = podgroups.PodGroupReader()
    for i, k in enumerate(keys):
        await unbounded.read(k, fetch, now=100.0 * i)
    assert set(unbounded.min_counts()) == set(keys)


async def test_the_extender_sizes_a_group_by_its_podgroup_read_once() -> None:
    from extender.cache import Cache
    from extender.ganging import GangCoordinator

    native = gangs.GroupKey("ml", "n", native=True)
    topo = {
        **NATIVE,
        "spec": {**NATIVE["spec"], "schedulingConstraints": {"topology": [{"key": "rack"}]}},
    }
    calls: list[gangs.GroupKey] = []
    answers: dict[gangs.GroupKey, Any] = {KEY: {"spec": {}}, native: topo}
    coord = GangCoordinator(Cache(lambda: CONFIG), fetch=fetcher(answers, calls))
    coord.clock = lambda: 50.0
    assert await coord.min_count(native, MEMBER) == 2
    assert await coord.min_count(native, MEMBER) == 2
    assert coord.topology_key(native, MEMBER) == "rack"
    assert (
        await coord.min_count(KEY, MEMBER)
        == "gang ml/job: its PodGroup has no positive spec.minMember"
    )
    assert calls == [native, KEY]
    assert coord.sizes() == {native: 2, KEY: None}
    answers[gangs.GroupKey("ml", "x")] = Failed(403)
    got = await coord.min_count(gangs.GroupKey("ml", "x"), MEMBER)
    assert got == "gang ml/x: its PodGroup cannot be read: HTTP 403"
