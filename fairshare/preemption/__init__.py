"""Which running pods go to make room for a pending pod, and the room kept for it.

fairshare's reclaim evicts borrowed pods for a tenant under its guarantee (or, opt-in,
under its fair share), keeping every victim's tenant at or above its own:
``reclaim`` (the planner), ``ledger`` (a planning round's figures and the victim search
on one node), ``nodesim`` (one node copied, to try releases and fits on), and ``holds``
(the hold on the room a plan makes and the no-take-back records, as pod annotations,
read back at a given time). The reclaim controller (``extender.reclaimer``) is the
adapter that acts on its plans.
"""
