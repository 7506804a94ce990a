"""Hierarchical weighted DRF (H-DRF): ``hierarchical_allocation``.

Three steps on a ``tree.Tree`` of the tenants: every leaf starts from its guarantees
(``start_from_guarantees``), the whole tree is filled event by event
(``filling.fill``), and the tree reads out each tenant's allocation and share
(``Tree.result``).
"""

from __future__ import annotations

from collections.abc import Sequence

from fairshare.fairness.filling import fill
from fairshare.fairness.shares import MIN_LEVEL, FairShare, TenantDemand, _dom, _level
from fairshare.fairness.tree import Tree


def hierarchical_allocation(
    tenants: Sequence[TenantDemand],
    *,
    capacity: Sequence[float],
    res_weights: Sequence[float],
) -> dict[str, FairShare]:
    """Hierarchical weighted DRF (H-DRF), computed exactly by event-driven filling.

    Bhattacharya et al., "Hierarchical Scheduling for Diverse Datacenter Workloads"
    (SoCC 2013). This is the fluid limit of the paper's *dynamic* H-DRF, the algorithm it
    proposes for a running scheduler (its "naive" version starves a child whose dominant
    resource differs from its siblings'; its static version is defined over all demands
    at once): at every node, the next bit of capacity goes to the non-blocked child of
    lowest weighted dominant share, so those children grow together, level. The rules:

    * a node's dominant share is measured on its children's usage summed, over the
      resources not saturated for it; a resource is saturated for a node when it is used
      up in the cluster or at the ``limit`` of the node or of an ancestor (the paper's
      "ignore saturated resources");
    * a leaf is blocked once its demand (capped by its own ``limit``) is met or a
      resource it needs is saturated for it (so the other leaves of that subtree that
      need it are blocked too); a node is blocked when all its leaves are. Blocked
      children count in the sum as they are and take no part in the comparison; a
      non-blocked child above its lowest non-blocked siblings counts scaled down to
      their level (the paper's "rescaling to the minimum node"), but not below its
      guaranteed start (fairshare's guarantees are not in the paper: a guarantee is
      held inside the parent's share, it does not enlarge it).

    Shares are divided by the node's own weight among its siblings, so weights divide a
    parent's share among its children. An idle child has nothing to grow, so its share
    goes to its siblings, and what a subtree cannot use goes up the tree (work
    conservation: every leaf ends met or blocked). When a node's share stops rising as
    its lowest children grow (its dominant resource is held by a blocked child), those
    children catch up first, as in the paper's task-by-task scheduler.

    The filling moves from event to event in closed form (everything is linear in
    between): a leaf met, a resource used up in the cluster or at a limit, a child
    reaching its lowest siblings or its guaranteed floor, a node's dominant resource
    changing. The flat case (no ``parent``) is ``allocation._fill``'s weighted DRF, which is what
    this gives for the children of a single node.

    ``guaranteed`` sets starting allocations: a leaf starts at its guaranteed level of
    its demand; an inner node's guarantee is then filled by the same rules among its
    subtree's leaves that ask for a guaranteed column, as far as it goes; starts are
    scaled down where they exceed a limit or the cluster. A node on such a plateau
    waits until its siblings' level reaches it. Shares in the result are divided by the
    tenant's weight in the whole tree (``effective_weights``). A tenant whose parent is
    not among ``tenants`` counts as top-level; so do the members of a parent cycle.
    """
    tree = Tree(tenants, capacity, res_weights)
    start_from_guarantees(tree)
    fill(tree, -1, {}, None)
    return tree.result()


def start_from_guarantees(tree: Tree) -> None:
    """Every leaf's starting level from the guarantees, bottom-up.

    A leaf starts at its guaranteed level of its demand (under its limit); an inner
    node scales its children's starts down when they overflow its guarantee, then fills
    the rest of it among its subtree's leaves that ask for a guaranteed column. Starts
    are then scaled down where they exceed a limit on the way up, or the cluster; each
    node's guaranteed floor (``Tree.floor``) is the weighted share it starts at.
    """
    n = len(tree.names)
    for i in range(n - 1, -1, -1):
        g = tree.by_name[tree.names[i]].guaranteed
        if not g:
            continue
        if tree.leaf[i]:
            level = min(_level(g, tree.demand[i]), tree.xmax[i])
            tree.x[i] = level if level >= MIN_LEVEL else 0.0
            continue
        got = tree.usage()[i]
        factor = min(
            (max(0.0, a) / got[r] for r, a in g.items() if got[r] > a and got[r] > 0),
            default=1.0,
        )
        if factor < 1.0:  # the children's guarantees overflow this one's
            tree.scale(i, tree.end[i], factor)
        cols = sum(1 << r for r in g)
        eligible = {k for k in range(i, tree.end[i]) if tree.need[k] & cols}
        fill(tree, i, dict(g), eligible)
    # Starts never exceed a limit on the way up, nor the cluster.
    for i in range(n):
        if tree.limit[i]:
            got = tree.usage()[i]
            factor = min(
                (max(0.0, a) / got[r] for r, a in tree.limit[i].items() if got[r] > a),
                default=1.0,
            )
            if factor < 1.0:
                tree.scale(i, tree.end[i], factor)
    used = [sum(col) for col in zip(*(tree.usage()[t] for t in tree.top), strict=True)]
    factor = min(
        (c / u for c, u in zip(tree.cap, used, strict=False) if c > 0 and u > c),
        default=1.0,
    )
    if factor < 1.0:
        tree.scale(0, n, factor)
    use = tree.usage()
    tree.floor = [
        _dom(use[i], tree.cap, tree.rw) / tree.w[i] if tree.w[i] > 0 else 0.0 for i in range(n)
    ]
