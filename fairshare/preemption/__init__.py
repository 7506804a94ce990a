"""Which running pods go to make room for a pending pod, and the room kept for it. Both
paths keep every tenant at or above its ``guaranteed`` amounts (and, where the policy
says so, its fair share):

* kube-scheduler's preemption, through the extender's ``/preempt``: ``victims`` (the
  rules a victim must pass) and ``proposal`` (the proposal judged node by node);
* fairshare's reclaim for a tenant under its guarantee (opt-in: under its fair share):
  ``reclaim`` (the planner), ``ledger`` (a round's figures, victims on one node),
  ``nodesim`` (one node copied) and ``holds`` (the room kept, the no-take-back records).
"""
