"""The reservation handoff's pure decisions: reservation pods, ConfigMaps, the sweep."""

from __future__ import annotations

from extender import handoff
from extender.handoff import Member, Reservation, plan_sweep
from fairshare.config.schema import ReservationHandoff

POLICY = ReservationHandoff()


def member(uid: str, uuid: str = "") -> Member:
    return Member(uid, f"pod-{uid}", "lab", f"cm-{uid}", uuid)


def res(name: str, group: str, node: str = "n1", uuid: str = "", **kw: object) -> Reservation:
    return Reservation(f"uid-{name}", name, POLICY.namespace, node, group, uuid, **kw)  # type: ignore[arg-type]


def sweep(**kw: object) -> handoff.SweepPlan:
    args: dict[str, object] = {
        "groups": {},
        "reservations": [],
        "pending_create": {},
        "waiting_since": {},
        "warned": (),
        "done": (),
        "now": 100.0,
        "timeout": 60.0,
    }
    args.update(kw)
    return plan_sweep(**args)  # type: ignore[arg-type]


def test_the_reservation_pod_holds_one_gpu_on_its_node_and_says_its_group():
    pod = handoff.reservation_pod("gpu-abc", "node-1", POLICY)
    assert pod["spec"]["nodeName"] == "node-1"
    container = pod["spec"]["containers"][0]
    assert container["resources"] == {
        "requests": {"nvidia.com/gpu": "1", "cpu": "10m", "memory": "64Mi"},
        "limits": {"nvidia.com/gpu": "1", "memory": "128Mi"},
    }
    assert container["command"] == ["fairshare", "gpu-reporter"]
    assert pod["metadata"]["labels"] == {
        "app": "fairshare-gpu-reservation",
        "runai-gpu-group": "gpu-abc",
    }
    assert handoff.is_reservation_pod(pod, POLICY)
    assert handoff.reservation_of(pod).group == "gpu-abc"
    # A pod of the same namespace without the app label is not a reservation.
    other = {"metadata": {"namespace": POLICY.namespace, "labels": {"app": "x"}}}
    assert not handoff.is_reservation_pod(other, POLICY)


def test_a_reported_uuid_is_written_for_every_waiting_member():
    groups = {"g": ("n1", [member("a"), member("b", uuid="GPU-1"), member("c")])}
    plan = sweep(groups=groups, reservations=[res("r", "g", uuid="GPU-1")], done={"c"})
    assert [(m.uid, u) for m, u, _ in plan.write] == [("a", "GPU-1")]
    assert not plan.delete and not plan.create


def test_empty_finished_misplaced_and_duplicate_reservations_go():
    groups = {"g": ("n1", [member("a")])}
    rs = [
        res("gone", "nobody"),
        res("done", "g", terminal=True),
        res("elsewhere", "g", node="n2"),
        res("second", "g", created="2026-12-03T10:00:01Z"),
        res("first", "g", created="2026-12-03T10:00:00Z"),
    ]
    plan = sweep(groups=groups, reservations=rs)
    assert sorted(r.name for r in plan.delete) == ["done", "elsewhere", "gone", "second"]


def test_a_missing_reservation_is_recreated_only_while_no_pod_runs_on_its_gpu():
    groups = {"new": ("n1", [member("a")]), "running": ("n2", [member("b", uuid="GPU-9")])}
    plan = sweep(groups=groups)
    assert plan.create == [("new", "n1")]
    assert plan.lost == ["running"]
    # One this process just created is not recreated while the watch catches up.
    assert sweep(groups=groups, pending_create={"new": 95.0}).create == []


def test_a_report_that_never_comes_is_overdue_once():
    groups = {"g": ("n1", [member("a"), member("b")])}
    rs = [res("r", "g")]
    assert sweep(groups=groups, reservations=rs, waiting_since={"a": 50.0}).overdue == []
    late = sweep(groups=groups, reservations=rs, waiting_since={"a": 30.0, "b": 30.0}, warned={"b"})
    assert [m.uid for m, _ in late.overdue] == ["a"]


def test_configmap_is_owned_by_the_pod():
    cm = handoff.configmap_body(
        name="p-1a2b3-gpu", namespace="lab", pod_name="p", pod_uid="u1", uuid="GPU-1", portion="0.5"
    )
    assert cm["data"] == {"NVIDIA_VISIBLE_DEVICES": "GPU-1", "GPU_PORTION": "0.5"}
    assert cm["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u1"}
    ]


def test_the_tracker_keeps_reservation_pods_out_of_the_ledger_even_slimmed():
    from fairshare.config.loading import config_from_mapping
    from fairshare.state import objects
    from tests.extender_side import Side

    config = config_from_mapping({"apiVersion": "fairshare.io/v1alpha1", "kind": "FairShareConfig"})
    tracker = Side(lambda: config)
    tracker.on_event(
        "Node",
        "ADDED",
        {
            "metadata": {"name": "n1"},
            "status": {"allocatable": {"cpu": "8", "memory": "8Gi", "nvidia.com/gpu": "2"}},
        },
    )
    pod = handoff.reservation_pod("gpu-abc", "n1", POLICY)
    pod["metadata"]["uid"] = "r1"
    pod["metadata"]["annotations"][handoff.ANN_RESERVED_UUID] = "GPU-1"
    changes: list[int] = []
    tracker.cache.on_change = lambda: changes.append(1)
    # The informers hand the tracker slim pods: the labels and the report must survive.
    tracker.on_resync("Pod", [objects.slim_pod(pod)])
    assert "r1" not in tracker.state.pods and "r1" not in tracker.pods
    assert tracker.reservations["r1"].group == "gpu-abc"
    assert tracker.reservations["r1"].uuid == "GPU-1" and changes
    tracker.on_event("Pod", "DELETED", pod)
    assert not tracker.reservations
