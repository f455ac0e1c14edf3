"""Scheduling decisions: one placement attempt for a gang, and the bounded pass over the queue.

An attempt for a guaranteed gang tries, chain by chain in configuration order, a plan that
needs nobody to leave; then a plan that evicts only opportunistic gangs; then one that also
preempts lower-priority guaranteed gangs. The middle pass is HiveD's first (reference/hived.md
1.4): its VC view does not see opportunistic pods, so a gang that fits the tenant's free quota
goes there and evicts only them, never a guaranteed gang of the tenant. When the victims
include gangs of the same tenant that allow lazy preemption, it first tries downgrading them to
opportunistic instead (they keep running) and placing the gang without preemption; if that
fails the downgrade is rolled back; before victims of which one is guaranteed are preempted,
downgrading instead one willing gang of the tenant that is not among them and ranks no higher
than they do is tried (a few, lowest priority first), and only then are the victims preempted
normally. Opportunistic gangs never preempt. From rules version 4 (`LEAST_VICTIMS`) a plan
that preempts is the one, of every eligible chain and every cell the search tries, whose
victims' highest priority is lowest, then that evicts the fewest GPUs and gangs, then the
first found (packing, chains in configuration order); before, the first that fit won.

The pass walks the queue in order and tries at most `schedule_attempts_max` gangs, and stops
early once its attempts would look at more than `SCHEDULE_LOOKS_MAX` cells (a guaranteed gang's
searches are charged for all its tenant's bound cells, though they look only at those holding a
GPU they could take; the gang it stops at says so in its "why pending"). After most commands it
only looks for free GPUs, skipping gangs whose last attempt saw the current capacity epoch
(nothing was freed since, so the answer would be the same); on Tick it also preempts, skipping
gangs whose last such attempt saw the current change epoch (nothing freed and nobody newly
placed who could be a victim). Preemption searches scan GPUs, so they run at the pace of Ticks,
not of every release. A failed attempt with preemption (at submission and on Tick) leaves a
deterministic "why pending", as of that attempt.

A Tick's pass that runs out of budget keeps the queue key of the first gang it did not try
(`schedule_resume`); the next Tick's pass starts there, goes to the end of the queue and wraps
around to its head, under the same budgets, and a pass that does not run out clears it. While
the budget suffices every pass walks the queue from its head; under a backlog every pending
gang is tried within ceil(pending / attempts) Ticks (more when the looks stop passes first),
even when gangs placed and released between Ticks make the stuck gangs at the head worth
retrying at every Tick (they had used up each Tick's budget, and a gang behind them that could
preempt was never tried). The passes after other commands always start at the head, so freed
GPUs go to the highest priorities first; the Tick's passes, whose attempts look for free GPUs
first too, bound how long any gang waits.
"""

from __future__ import annotations

from collections.abc import Callable

from statemachine.bound_index import FREE_CEILING
from statemachine.fit import FreeView, PreemptView
from statemachine.groups import Group
from statemachine.lifecycle import allocate, downgrade, start_preemption
from statemachine.limits import FIT_SCAN_MAX, OPPORTUNISTIC_PRIORITY, SCHEDULE_LOOKS_MAX
from statemachine.pending import QueueKey
from statemachine.results import GroupPhase
from statemachine.rules import LEAST_VICTIMS
from statemachine.search import Cheapest, Plan, Request, plan_guaranteed, plan_opportunistic
from statemachine.state import Configured, State
from statemachine.topology import Chain


def eligible_chains(config: Configured, group: Group) -> list[Chain]:
    """The chains a gang may use, in configuration order: its GPU model (any when empty),
    and for a guaranteed gang only chains where its VC has guaranteed cells."""
    chains = []
    for chain in config.topology.chains:
        if group.gpu_model and chain.gpu_model != group.gpu_model:
            continue
        if group.guaranteed and not any(config.topology.quota[group.vc][chain.index]):
            continue
        chains.append(chain)
    return chains


def _request(group: Group) -> Request:
    return Request(vc=group.vc, pods=tuple(pod.gpus for pod in group.pods))


def _plan(config: Configured, group: Group, view: FreeView, *,
          least: bool = False) -> Plan | None:
    """The first chain's plan; with `least`, the chains' plan that evicts least (the first
    of equals: in a view of free GPUs only, which evicts nothing, the first)."""
    request = _request(group)
    cheapest: Cheapest[Plan] | None = Cheapest(view) if least else None
    for chain in eligible_chains(config, group):
        if type(view) is FreeView and not _may_fit(config, group, chain, request.gpus):
            continue
        if group.guaranteed:
            plan = plan_guaranteed(config.topology, config.buddy, view, chain, request,
                                   least=least)
        else:
            plan = plan_opportunistic(config.buddy, config.cells, view, chain, request)
        if plan is not None:
            if cheapest is None:
                return plan
            if cheapest.offer(plan.pods, plan):
                break
    return None if cheapest is None else cheapest.result()


def _may_fit(config: Configured, group: Group, chain: Chain, need: int) -> bool:
    """A cheap necessary condition for a plan without preemption: enough free GPUs in the
    VC's bound cells plus its unbound quota (guaranteed), or on the chain (opportunistic)."""
    cells = config.cells
    if group.guaranteed:
        buddy = config.buddy
        unbound = buddy.unbound[group.vc][chain.index]
        room = sum(count * chain.size[level] for level, count in enumerate(unbound))
        bound = buddy.bound.below(group.vc, chain.index, FREE_CEILING)
        return room + sum(cells.free[cell] for cell in bound) >= need
    return cells.chain_free[chain.index] >= need


def _add_victims(config: Configured, plan: Plan) -> None:
    cells = config.cells
    leaves = [leaf for pod in plan.pods for leaf in pod]
    plan.victims = sorted({cells.holder[leaf] for leaf in leaves if cells.holder[leaf]})
    plan.cancelled = sorted({cells.reserver[leaf] for leaf in leaves if cells.reserver[leaf]})


def try_place(state: State, group: Group, *, preempt: bool) -> bool:
    """One placement attempt for a pending gang, with preemption if `preempt`; True when it
    was allocated or started preempting. A failure leaves its "why pending" with `preempt`,
    and always for an opportunistic gang (from counters only: it never preempts, and would
    otherwise keep the one its submission left)."""
    assert group.phase is GroupPhase.PENDING
    config = state.configured()
    plan = _plan(config, group, FreeView(config.cells))
    if plan is not None:
        allocate(state, group, plan)
        return True
    if preempt and group.guaranteed:
        plan = _plan_preempting(config, group, least=state.rules_version >= LEAST_VICTIMS,
                                gang_gpus=lambda name: state.groups[name].gpus)
        if plan is not None:
            if not plan.victims and not plan.cancelled:
                allocate(state, group, plan)
                return True
            if _try_lazy(state, group, plan) or _try_lazy_instead(state, group, plan):
                return True
            start_preemption(state, group, plan)
            return True
    state.set(group, "attempt_epoch", state.capacity_epoch)
    if preempt:
        state.set(group, "preempt_epoch", state.change_epoch)
    if preempt or not group.guaranteed:
        state.set(group, "why_pending", explain(config, group))
    return False


def _plan_preempting(config: Configured, group: Group, *, least: bool,
                     gang_gpus: Callable[[str], int]) -> Plan | None:
    """A plan taking free and opportunistic GPUs only, else one that may also take those of
    lower-priority guaranteed gangs; with its victims and cancelled preemptors. With `least`,
    each is the plan that evicts least, its victims' GPUs counted whole by `gang_gpus`."""
    for priority in sorted({OPPORTUNISTIC_PRIORITY + 1, group.priority}):
        view = PreemptView(config.cells, priority, gang_gpus)
        plan = _plan(config, group, view, least=least)
        if plan is not None:
            _add_victims(config, plan)
            return plan
    return None


def _try_lazy(state: State, group: Group, plan: Plan) -> bool:
    """Downgrade the lazily preemptible victims and place the gang without preemption; on
    failure undo the downgrades (the journal makes that exact)."""
    lazy = [name for name in plan.victims if _lazily_preemptible(state.groups[name], group)]
    if not lazy:
        return False
    mark = state.journal.mark()
    for name in lazy:
        downgrade(state, state.groups[name], group.group)
    config = state.configured()
    retry = _plan(config, group, FreeView(config.cells))
    if retry is None:
        state.journal.rollback(mark)
        return False
    allocate(state, group, retry)
    return True


LAZY_INSTEAD_MAX = 4  # willing gangs tried, one at a time, instead of killing a guaranteed one


def _try_lazy_instead(state: State, group: Group, plan: Plan) -> bool:
    """The plan would kill a guaranteed gang: downgrading, instead, one lazily preemptible gang
    of the tenant that is not among its victims (lowest priority first, a few at most) may
    place the gang with nobody killed. Each try that does not is undone."""
    killed = [state.groups[name].effective_priority for name in plan.victims
              if state.groups[name].guaranteed]
    if not killed:
        return False
    config = state.configured()
    victims = set(plan.victims)
    # Never one above every guaranteed victim: it would lose its guarantee (any tenant may
    # then preempt it) so that a gang of lower priority keeps one (HiveD downgrades only the
    # gangs in the preemptor's way, reference/hived.md 1.8).
    ceiling = max(killed)
    # A willing gang is a guaranteed one of the tenant, so in its bound cells: found among
    # the gangs (at most GROUPS_MAX), not by a scan of every GPU the tenant has bound.
    willing = sorted((other.effective_priority, other.submit_index, other.group)
                     for other in state.groups.values()
                     if other.group not in victims and other.phase is GroupPhase.ALLOCATED
                     and other.effective_priority <= ceiling and _lazily_preemptible(other, group))
    for _, _, name in willing[:LAZY_INSTEAD_MAX]:
        mark = state.journal.mark()
        downgrade(state, state.groups[name], group.group)
        retry = _plan(config, group, FreeView(config.cells))
        if retry is not None:
            allocate(state, group, retry)
            return True
        state.journal.rollback(mark)
    return False


def _lazily_preemptible(victim: Group, preemptor: Group) -> bool:
    return (victim.lazy_preemption and victim.guaranteed and victim.vc == preemptor.vc
            and victim.effective_priority < preemptor.priority and not victim.evicting)


def schedule(state: State, *, preempt: bool = False) -> None:
    """One bounded pass over the pending queue; with `preempt` (on Tick) guaranteed gangs may
    preempt, and the pass starts where the last Tick's pass ran out of budget."""
    if state.config is None:
        return
    config = state.configured()
    budget = state.policy.schedule_attempts_max
    looks = 0
    stopped: QueueKey | None = None
    for key in _pass_order(state, preempt=preempt):
        group = state.groups.get(key[2])
        if group is None or group.phase is not GroupPhase.PENDING:
            continue
        full = preempt and group.guaranteed
        if full and group.preempt_epoch == state.change_epoch:
            continue
        if not full and group.attempt_epoch == state.capacity_epoch:
            continue
        if budget <= 0:
            stopped = key
            break
        cost = attempt_looks(config, group, preempt=full)
        if looks and looks + cost > SCHEDULE_LOOKS_MAX:
            later = "tried first at the next Tick" if preempt else "tried at a later pass"
            state.set(group, "why_pending", (
                f"not tried yet: the scheduling pass had looked at {looks} cells, and trying it "
                f"looks at {cost} (at most {SCHEDULE_LOOKS_MAX} a pass); {later}"))
            stopped = key
            break
        looks += cost
        budget -= 1
        try_place(state, group, preempt=full)
    if preempt:
        state.set(state, "schedule_resume", stopped)


def _pass_order(state: State, *, preempt: bool) -> list[QueueKey]:
    """The queue in order; for a Tick's pass, from the first key at or after where the last one
    stopped, around to the head and on to just before it."""
    keys = state.queue.keys
    if not preempt or state.schedule_resume is None:
        return list(keys)
    start = state.queue.position(state.schedule_resume)
    return keys[start:] + keys[:start]


def attempt_looks(config: Configured, group: Group, *, preempt: bool) -> int:
    """The cells one attempt looks at, at most: per eligible chain, each search of a guaranteed
    gang looks at its tenant's bound cells there (only those holding a GPU it could take, but
    it is charged for all), and with preemption it runs one per
    preemption priority and explains a failure from them too; an opportunistic gang's search
    looks at up to FIT_SCAN_MAX cells a level, and spreading several pods, at the chain's
    nodes (its explanation reads counters only)."""
    cells = 0
    for chain in eligible_chains(config, group):
        if group.guaranteed:
            cells += len(config.buddy.bound_cells[group.vc][chain.index])
        else:
            nodes = chain.level_count[chain.node_level]
            cells += nodes if len(group.pods) > 1 else min(nodes, FIT_SCAN_MAX)
    searches = 1
    if preempt and group.guaranteed:
        searches += len({OPPORTUNISTIC_PRIORITY + 1, group.priority}) + 1
    return searches * max(cells, 1)


def explain(config: Configured, group: Group) -> str:
    """Why a gang is pending, per eligible chain, from counters only (cheap, deterministic)."""
    pods = [pod.gpus for pod in group.pods]
    need = f"needs {sum(pods)} GPUs as {len(pods)} pods of up to {max(pods)}"
    parts = []
    for chain in eligible_chains(config, group):
        if group.guaranteed:
            parts.append(_explain_guaranteed(config, group, chain))
        else:
            parts.append(_explain_opportunistic(config, chain))
    tail = "" if not group.guaranteed else (
        f"; no gangs below priority {group.priority} to preempt in the way")
    return f"{need}; " + "; ".join(parts) + tail


def _explain_guaranteed(config: Configured, group: Group, chain: Chain) -> str:
    buddy, cells = config.buddy, config.cells
    bound = buddy.bound_cells[group.vc][chain.index]
    with_free = buddy.bound.below(group.vc, chain.index, FREE_CEILING)
    free = sum(cells.free[cell] for cell in with_free)
    unbound = buddy.unbound[group.vc][chain.index]
    spare = ", ".join(f"{unbound[level]} {chain.type_names[level]}"
                      for level in range(chain.top_level, 0, -1) if unbound[level])
    return (f"{chain.name}: VC {group.vc} has {free} free GPUs in {len(bound)} bound cells"
            f" and {spare or 'no'} unbound cells")


def _explain_opportunistic(config: Configured, chain: Chain) -> str:
    cells = config.cells
    free = cells.chain_free[chain.index]
    largest = cells.indexes[chain.index].largest(chain.node_level)
    return f"{chain.name}: {free} free GPUs, at most {largest} on one node"
