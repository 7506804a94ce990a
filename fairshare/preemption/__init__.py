"""Which running pods go to make room for a pending pod, and the room kept for it.

Two paths evict for a pending pod, and both keep every tenant at or above its
``guaranteed`` amounts (and, where the policy says so, its fair share):

* kube-scheduler's preemption, through the extender's ``/preempt`` verb: ``victims``
  (the rules a proposed victim must pass) and ``proposal`` (kube-scheduler's proposal
  judged node by node: substitutes, pod groups, room);
* fairshare's own reclaim, which evicts borrowed pods for a tenant under its guarantee
  (or, opt-in, under its fair share): ``reclaim`` (the planner), ``ledger`` (a planning
  round's figures and the victim search on one node), ``nodesim`` (one node copied,
  to try releases and fits on), and ``holds`` (the hold on the room a plan makes and
  the no-take-back records, as pod annotations, read back at a given time).

The extender's verb (``extender.verbs.preempt_answer``) and the reclaim controller
(``extender.reclaimer``) are the adapters that call these.
"""
