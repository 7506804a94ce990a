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
