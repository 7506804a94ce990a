"""A tenant's weighted dominant share if it held a given row (``cluster_shares.
dominant_share``): the figure the gate, reclaim and preemption compare with fair shares."""

from __future__ import annotations

from fractions import Fraction as F

import pytest

from fairshare import cluster_shares, fairness, tenancy
from fairshare.config.loading import config_from_mapping
from fairshare.resources import CPU, GPU, MEMORY
from fairshare.simulator.engine import Simulation

GI = 1024**3
HEAD = {"apiVersion": "fairshare.io/v1alpha1", "kind": "FairShareConfig"}
TREE = config_from_mapping(
    {
        **HEAD,
        "tenants": [
            {"name": "ml", "weight": 3},
            {"name": "vision", "parent": "ml", "weight": 1, "namespaces": ["v"]},
            {"name": "nlp", "parent": "ml", "weight": 2, "namespaces": ["n"]},
            {"name": "web", "namespaces": ["w"]},
        ],
    }
)


def state():
    sim = Simulation(TREE)
    sim.add_node("n1", {GPU: F(8), CPU: F(64), MEMORY: F(512 * GI)}, {})
    return sim.state


@pytest.mark.parametrize("tenant", ["vision", "nlp", "ml", "web", "unlisted"])
def test_one_tenant_share_is_the_kernel_on_that_tenant_alone(tenant: str) -> None:
    st = state()
    used = [0.0] * st.n_res
    used[st.gpu_col] = 2000.0
    weights = tenancy.tenant_weights(TREE)
    expect = fairness.dominant_shares(
        used={tenant: list(used)},
        capacity=st.total_capacity(),
        res_weights=TREE.resource_weights(),
        tenant_weights={tenant: weights.get(tenant, 1.0)},
    )[tenant]
    assert cluster_shares.dominant_share(st, TREE, tenant, used) == expect
    assert cluster_shares.dominant_share(st, TREE, tenant, used, weights) == expect


def test_the_share_after_a_row_adds_it_to_what_the_tenant_holds() -> None:
    st = state()
    row = [0.0] * st.n_res
    row[st.gpu_col] = 1000.0
    after = cluster_shares.usage_after(st, "web", row)
    assert after == row
    assert cluster_shares.dominant_share(st, TREE, "web", after) == pytest.approx(1 / 8)
