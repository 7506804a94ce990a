"""`fairshare status` and the metrics per level of a tree of tenants."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from fairshare import metrics, report
from fairshare.config.loading import config_from_mapping
from fairshare.state.snapshot import Snapshot
from tests.unit.test_report import explain, gpu_row, namespace, status, tenant
from tests.unit.test_state_objects import node, pod

TREE = config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [
            {"name": "ml", "limit": {"nvidia.com/gpu": "6"}},
            {"name": "a1", "parent": "ml", "namespaces": ["a1"]},
            {"name": "a2", "parent": "ml", "namespaces": ["a2"]},
            {"name": "b1", "namespaces": ["b1"]},
        ],
    }
)


def snapshot() -> Snapshot:
    pods: list[dict[str, Any]] = [
        pod("a1-1", ns="a1", gpu=1, node_name="n1"),
        pod("a2-1", ns="a2", gpu=1, node_name="n1"),
        pod("a2-2", ns="a2", gpu=1, phase="Pending"),
        pod("b1-1", ns="b1", gpu=1, node_name="n1"),
    ]
    spaces = [namespace(n) for n in ("a1", "a2", "b1")]
    return Snapshot(TREE, {"Namespace": spaces, "Node": [node("n1", gpus=8)], "Pod": pods})


def test_status_shows_each_level_with_its_subtree():
    data = status(snapshot())
    names = [t["name"] for t in data["tenants"]]
    # Depth first: an organisation, then its teams.
    assert names[names.index("ml") + 1 : names.index("ml") + 3] == ["a1", "a2"]
    ml, a2 = tenant(data, "ml"), tenant(data, "a2")
    assert (ml["level"], ml["parent"]) == ("organisation", None)
    assert (a2["level"], a2["parent"]) == ("tenant", "ml")
    assert ml["pods"] == {"running": 2, "pending": 1, "held": 0}
    assert gpu_row(ml)["used"] == "2"  # bound in the subtree
    assert gpu_row(ml)["quotaUsed"] == "3"  # with the pending pod
    assert gpu_row(ml)["limit"] == "6"
    assert ml["namespaces"] == ["a1", "a2"]
    # The organisation holds 2 of 8 GPUs with weight 1 among {ml, b1, default}.
    assert ml["dominantShare"] == 0.25
    # a2 holds 1/8 with weight 1/2 in the whole tree.
    assert a2["dominantShare"] == 0.25
    text = report.render_status_text(data)
    assert "ORGANISATION ml  weight 1" in text
    # Its configured weight (among its siblings), then its weight in the whole tree.
    assert "TENANT a2  in ml  weight 1 (0.5 in the whole tree)" in text
    assert (a2["configuredWeight"], a2["weight"]) == (1.0, 0.5)
    page = report.render_status_html(data)
    assert (
        "<b>a2</b> <span class=muted>tenant, in ml, weight 1 (0.5 in the whole tree)</span>" in page
    )
    assert "<b>ml</b> <span class=muted>organisation, weight 1</span>" in page


def test_parent_gauge_describes_the_tree():
    m = metrics.Metrics(CollectorRegistry())
    m.set_tenant_tree({t.name: t.parent for t in TREE.tenants})
    body = generate_latest(m.registry).decode()
    assert 'fairshare_tenant_parent{parent="ml",tenant="a1"} 1.0' in body
    assert 'fairshare_tenant_parent{parent="ml",tenant="a2"} 1.0' in body
    assert 'tenant="b1"' not in body
    m.set_tenant_tree({"a1": None})
    assert "fairshare_tenant_parent{" not in generate_latest(m.registry).decode()


def test_explain_shows_headroom_against_every_ancestors_limit():
    snap = snapshot()
    # ml's subtree already counts a1-1, a2-1 and a2-2 (3 of its 6 GPUs); a new pod of
    # a1 asking 4 GPUs fits a1 (no limit of its own) but not its organisation.
    target = pod("a1-new", ns="a1", gpu=4, phase="Pending")
    data = explain(snap, target)
    assert data["webhook"]["allowed"] is False
    assert "organisation ml" in data["webhook"]["message"]
    quota = data["webhook"]["quota"]
    own = [q for q in quota if q["tenant"] == "a1"]
    assert own and all(q["level"] == "tenant" and q["fits"] for q in own)
    (org,) = [q for q in quota if q["tenant"] == "ml"]
    assert org == {
        "tenant": "ml",
        "level": "organisation",
        "resource": "nvidia.com/gpu",
        "used": "3",
        "requested": "4",
        "limit": "6",
        "headroom": "3",
        "fits": False,
    }
    text = report.render_explain_text(data)
    assert "LEVEL" in text and "organisation ml" in text
