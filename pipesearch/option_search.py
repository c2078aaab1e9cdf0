"""The exact split when stages choose among chains of memory options.

With every recompute level x optimizer offload (:func:`pipesearch.stage_options.
mixed_offload_options`) each stage takes one of two chains, offload-first or
device-first, and within it the first option that fits. For fixed chains the
split search (:func:`pipesearch.split_search.exact_split`) is exact; over the
``2^S`` choices of chains this module runs a branch and bound whose nodes fix
the chains of a prefix of the stages and leave the others on the relaxed
chain (:data:`pipesearch.stage_options.RELAXED`: the least recompute level
that fits either way, without the host step), whose exact split is a lower
bound on every completion of the node (docs/offload.md). A node whose relaxed
optimum runs only on-device options on its free stages is solved: those
stages' device-first chains give the same times. Every other node completes
its chains three ways on its relaxed optimum's split (the chains that
optimum points to, all offload-first, all device-first): achievable plans
that tighten the cutoff. A stage whose one chain is nowhere slower on the
ranges that could still beat the best plan found is not branched on
(:func:`dominant_chains`). The result is exact whenever every split search
it ran was and the nodes stayed within :data:`MAX_POLICY_NODES`; otherwise
its lower bound is the least bound of the nodes left open (the plan's
``split_search`` reports it and the gap).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .costs import PipelineCosts
from .split_search import ExactSplit, exact_split
from .stage_options import DEVICE_FIRST, OFFLOAD_FIRST, RELAXED
from .timemodel import iteration_time_s
from .units import format_gib_pair


MAX_POLICY_NODES = 24
"""Branch-and-bound nodes (split searches) over the stages' chains per
point; past it the open nodes' bounds become the reported lower bound
(a deterministic count: the same answer on any machine)."""


def has_policies(costs: PipelineCosts | None) -> bool:
    """Whether the stages of ``costs`` choose among chains of options."""
    return costs is not None and costs.options is not None and costs.options.policy_chains is not None


def with_policies(costs: PipelineCosts, policies) -> PipelineCosts:
    """``costs`` with stage ``s`` on chain ``policies[s]`` (``(S,)`` ints of
    :data:`pipesearch.stage_options.POLICIES`)."""
    return replace(costs, options=costs.options.with_policies(policies))


def exact_split_over_policies(costs: PipelineCosts, schedule: str, pp: int, vp: int = 1, *,
                              cutoff_s: float = np.inf, value_above_cutoff: bool = False, cache: dict | None = None
                              ) -> tuple[ExactSplit | None, PipelineCosts]:
    """The best split and chains of ``costs``: ``(found, costs of the chosen
    chains)``, as :func:`pipesearch.split_search.exact_split` returns for one
    chain per stage (``found`` None when no split fits; ``best_time_s >=
    cutoff_s`` when none beats the cutoff). ``costs`` without chains is
    passed through to ``exact_split``, with ``cache`` (its ``cache``: the
    point's work kept from an earlier call on the same costs; not used with
    chains, whose calls are on other costs).

    ``lower_bound_s`` is the least bound of the nodes left open by an
    inexact split search (the optimum when all were exact); ``exact`` says
    whether all were.
    """
    if not has_policies(costs):
        found = exact_split(costs, schedule, pp, vp, cutoff_s=cutoff_s, value_above_cutoff=value_above_cutoff,
                            cache=cache)
        if found is not None and found.exact and not np.isfinite(found.best_time_s) and not np.isfinite(cutoff_s):
            found = None  # every split fails a whole-device check (Mobius, stage_options.swap_device_bytes)
        return found, costs
    S = costs.pp
    best: list = [None, costs, cutoff_s]  # found, its costs, its time (the cutoff until one is found)
    stats = {"exact": True, "open_bound": np.inf, "splits": 0, "nodes": 0, "calls": 0}
    forced: list = []  # per stage, its chain when one dominates on every range that can still win (else None)

    def visit(fixed: tuple[int, ...]) -> None:
        policies = fixed + (RELAXED,) * (S - len(fixed))
        node = with_policies(costs, policies)
        found = exact_split(node, schedule, pp, vp, cutoff_s=best[2])
        stats["calls"] += 1
        if found is None:
            return
        stats["splits"] += found.splits_evaluated
        stats["nodes"] += found.nodes
        if not found.exact:
            stats["exact"] = False
            stats["open_bound"] = min(stats["open_bound"], found.lower_bound_s)
        if not np.isfinite(found.best_time_s) or found.best_time_s >= best[2]:
            return
        if len(fixed) < S and _free_stages_on_device(node, found.bounds, len(fixed)):
            fixed = fixed + (DEVICE_FIRST,) * (S - len(fixed))  # same times: the node's bound is reached
            node = with_policies(costs, fixed)
        if len(fixed) == S:
            best[:] = [found, node, found.best_time_s]
            return
        hint = _relaxed_hint(node, found.bounds, len(fixed))
        _try_incumbent(costs, fixed, hint, found.bounds, schedule, pp, vp, best)
        if not forced:  # once, at the root: later incumbents only shrink the ranges that can win
            forced.extend(dominant_chains(costs, best[2]))
        first = hint[0]
        choices = (forced[len(fixed)],) if forced[len(fixed)] is not None else (
            first, DEVICE_FIRST if first == OFFLOAD_FIRST else OFFLOAD_FIRST)
        if len(choices) > 1 and stats["calls"] >= MAX_POLICY_NODES:  # the work limit: this node stays open
            stats["exact"] = False
            stats["open_bound"] = min(stats["open_bound"], found.lower_bound_s)
            return
        for policy in choices:
            visit(fixed + (policy,))

    visit(())
    found, chosen, _ = best
    if found is None:  # nothing beats the cutoff: the plain chains' answer says so
        default = with_policies(costs, (OFFLOAD_FIRST,) * S)
        return exact_split(default, schedule, pp, vp, cutoff_s=cutoff_s, value_above_cutoff=value_above_cutoff), \
            default
    bound = min(found.best_time_s, stats["open_bound"])
    return replace(found, lower_bound_s=bound, exact=stats["exact"], splits_evaluated=stats["splits"],
                   nodes=stats["nodes"]), chosen


def dominant_chains(costs: PipelineCosts, below_s: float) -> list[int | None]:
    """Per stage, the chain that is at least as fast on every range the
    stage could hold in a plan faster than ``below_s``, or None when the
    chains trade places there.

    A range can only be in such a plan when the stage's own work on it,
    ``m`` forwards and backwards at the relaxed chain's times (at most
    either chain's), is below ``below_s`` (its rank runs at least that).
    On such a range the two chains' first fitting options are compared
    term by term (forward, backward, input-gradient, host step): a chain
    whose option is nowhere slower there can be fixed for the stage, as the
    time model is monotone in every stage's terms.
    """
    S, L, m = costs.pp, costs.num_layers, costs.num_micro_batches
    both = [with_policies(costs, (p,) * S) for p in (OFFLOAD_FIRST, DEVICE_FIRST)]
    relaxed = with_policies(costs, (RELAXED,) * S)
    out: list[int | None] = []
    for s in range(S):
        i, j = np.meshgrid(np.arange(s, L - S + s + 1), np.arange(s + 1, L - S + s + 2), indexing="ij")
        keep = j > i
        i, j = i[keep], j[keep]
        useful = relaxed.fits(s, i, j) & (m * relaxed.compute_s(s, i, j) < below_s)
        i, j = i[useful], j[useful]
        terms = [np.stack([c.fwd_s(s, i, j), c.bwd_s(s, i, j), c.bwd_input_s(s, i, j),
                           c.host_step_s(s, i, j) + c.device_step_s(s, i, j)])
                 for c in both]
        tol = 1e-12 * np.maximum(1.0, np.abs(terms[0]))
        if np.all(terms[1] <= terms[0] + tol):
            out.append(DEVICE_FIRST)
        elif np.all(terms[0] <= terms[1] + tol):
            out.append(OFFLOAD_FIRST)
        else:
            out.append(None)
    return out


def _relaxed_hint(node: PipelineCosts, bounds, first_free: int) -> tuple[int, ...]:
    """For the free stages of a node, the chain its relaxed optimum points
    to on ``bounds``: device-first where the relaxed option is on the
    device, offload-first where it is an offload (bound) option."""
    names = node.options.names
    return tuple(OFFLOAD_FIRST if _off_device(names[int(node.option_index(s, bounds[s], bounds[s + 1]))])
                 else DEVICE_FIRST for s in range(first_free, node.pp))


def _try_incumbent(costs: PipelineCosts, fixed, hint, bounds, schedule: str, pp: int, vp: int, best: list) -> None:
    """Complete the node's chains three ways on its relaxed optimum's split
    (the hint, all offload-first, all device-first) and keep the fastest
    that fits if it beats ``best`` (an achievable plan: a tighter cutoff for
    the rest of the branch and bound)."""
    n = len(hint)
    for free in (hint, (OFFLOAD_FIRST,) * n, (DEVICE_FIRST,) * n):
        cand = with_policies(costs, tuple(fixed) + tuple(free))
        if not cand.split_fits(bounds):
            continue
        t = float(iteration_time_s(schedule, pp, costs.num_micro_batches, vp, cand.stage_times(np.asarray(bounds))))
        if t < best[2]:
            best[:] = [ExactSplit(tuple(int(x) for x in bounds), t, t, t, True, 1, 0), cand, t]


def _off_device(name: str) -> bool:
    """Whether option ``name`` is on a chain's off-device side: its
    optimizer offloaded or its weights streamed, relaxed or not
    (:func:`pipesearch.stage_options.mixed_offload_options`,
    :func:`pipesearch.stage_options.mixed_stream_options`)."""
    return "offload" in name or "stream" in name


def _free_stages_on_device(node: PipelineCosts, bounds, first_free: int) -> bool:
    """Whether every stage from ``first_free`` runs an on-device option
    (no offload, relaxed or not) on the split ``bounds``."""
    names = node.options.names
    return all(not _off_device(names[int(node.option_index(s, bounds[s], bounds[s + 1]))])
               for s in range(first_free, node.pp))


def best_policies_for_split(costs: PipelineCosts, bounds, schedule: str, pp: int, vp: int = 1) -> PipelineCosts:
    """``costs`` on the chains that make the fixed split ``bounds`` fastest
    (a pinned ``--split``): every combination of the two chains over the
    stages where their first fitting options differ, each simulated
    (:func:`pipesearch.timemodel.iteration_time_s`); ties keep the earlier
    (offload-first) combination. ``costs`` without chains is returned as is.
    """
    if not has_policies(costs):
        return costs
    S = costs.pp
    s, i, j = np.arange(S), np.asarray(bounds[:-1]), np.asarray(bounds[1:])
    first = [with_policies(costs, (p,) * S) for p in (OFFLOAD_FIRST, DEVICE_FIRST)]
    chosen = [c.option_index(s, i, j) for c in first]
    fits = [c.fits(s, i, j) for c in first]
    differ = [k for k in range(S) if fits[0][k] and fits[1][k] and chosen[0][k] != chosen[1][k]]
    base = [OFFLOAD_FIRST if fits[0][k] else DEVICE_FIRST for k in range(S)]
    best, best_t = with_policies(costs, base), np.inf
    for mask in range(1 << len(differ)):
        policies = list(base)
        for bit, k in enumerate(differ):
            policies[k] = DEVICE_FIRST if mask >> bit & 1 else OFFLOAD_FIRST
        cand = with_policies(costs, policies)
        if not cand.split_fits(bounds):
            continue
        t = float(iteration_time_s(schedule, pp, costs.num_micro_batches, vp, cand.stage_times(np.asarray(bounds))))
        if t < best_t:
            best, best_t = cand, t
    return best


def host_plan_info(costs: PipelineCosts, bounds, job, dp: int, tp: int = 1) -> tuple:
    """What a plan keeps in host memory and moves over PCIe, as plan-file
    options (``()`` when no stage uses the host):

    * ``("host", {...})``: per stage, over its ``dp x tp`` GPUs (each
      holding its shard), ``host_memory_bytes`` (its option's host bytes per
      parameter byte x its parameter bytes, an offloaded tied copy's
      included, :meth:`PipelineCosts.host_param_bytes`) and
      ``pcie_bytes_per_iteration``: an offloaded optimizer moves the
      gradients out and weights back for the parameters the device updates
      (:func:`_optimizer_copy_bytes`, ZeRO-Offload, Ren et al. ATC'21 Fig.
      2); streamed weights come in for
      every micro-batch's forward and backward and the gradients go out
      (:func:`pipesearch.stage_options.stream_options`); a Mobius stage comes
      in once per stay (twice, unless it is its rank's last stage) and its
      gradients go out once (:func:`pipesearch.timemodel.mobius_residencies`);
      offloaded activations (``act-host`` options) add, per stage,
      ``activation_host_memory_bytes`` (every in-flight micro-batch's kept
      bytes) and ``activation_pcie_bytes_per_iteration`` (``2 m`` copies of
      a micro-batch's kept bytes: out after its forward, back before its
      backward), included in the two lists above; and their sums;
    * ``("optimizer_step", "delayed")`` and ``("optimizer_staleness_steps", 1)``
      with ``job.delayed_optimizer_step``;
    * ``("mobius", {...})`` for Mobius: per stage its copy seconds, each
      rank's PCIe queue and each GPU's peak bytes over its stays
      (:meth:`pipesearch.costs.PipelineCosts.mobius_device_peak_bytes`, the
      figure the memory check uses), so that the plan file replays
      (:func:`pipesearch.timemodel.stage_times_of`).
    """
    o = costs.options
    s, i, j = np.arange(costs.pp), np.asarray(bounds[:-1]), np.asarray(bounds[1:])
    if o is None:
        return ()
    names = [o.names[int(k)] for k in costs.option_index(s, i, j)]
    if not any(("offload" in n or "stream" in n or n.startswith("swap") or "act-host" in n) for n in names):
        return ()
    k = costs.option_index(s, i, j)
    moved, act_moved = stage_pcie_bytes(costs, bounds, job, dp, tp)
    act_host = costs.activation_offload_bytes(s, i, j)[1] * dp * tp
    host = costs.host_param_bytes(s, i, j, k) * o.host_bytes_per_param_byte[k] * dp * tp + act_host
    info = {"host_memory_bytes": [float(x) for x in host], "pcie_bytes_per_iteration": [
        float(x) for x in moved], "total_host_memory_bytes": float(host.sum()),
        "total_pcie_bytes_per_iteration": float(moved.sum())}
    if np.any(act_moved > 0):
        info.update(activation_host_memory_bytes=[float(x) for x in act_host],
                    activation_pcie_bytes_per_iteration=[float(x) for x in act_moved])
    info.update(_copy_seconds(costs, bounds, names, job, dp))
    out: tuple = (("host", info),)
    if costs.delayed_host_step:
        out += (("optimizer_step", "delayed"), ("optimizer_staleness_steps", 1))
    if o.swap_in_s_per_param_byte is not None:
        times = costs.stage_times(np.asarray(bounds))
        out += (("mobius", {"swap_in_s": [float(x) for x in times.swap_in_s],
                            "swap_out_s": [float(x) for x in times.swap_out_s],
                            "pcie_queue": [int(q) for q in o.swap_queue],
                            "device_peak_bytes": [float(x) for x in costs.mobius_device_peak_bytes(bounds)],
                            **({"act_copy_s": [float(x) for x in times.act_copy_s],
                                "act_host": [bool(x) for x in times.act_host]}
                               if times.act_copy_s is not None else {})}),)
    return out


def _copy_seconds(costs: PipelineCosts, bounds, names, job, dp: int) -> dict:
    """Per stage, the seconds of one GPU's copies the time model counts
    inside its stage times (plan ``options.host``; the timeline draws them,
    :func:`pipesearch.timemodel.host_copy_spans`): ``activation_copy_s`` one
    micro-batch's kept activations each way (``act-host``),
    ``weight_copy_s`` a streamed stage's weights (``w / bw`` per forward;
    its backward copies them in and the gradients out, ``2 w / bw``) and
    ``optimizer_copy_s`` an offloaded optimizer step's gradients out (its
    weights back take as long where the device keeps weights and gradients
    in one dtype; :func:`_optimizer_copy_bytes`, ZeRO-Offload, Ren et al.
    ATC'21 Fig. 2), not with a delayed step. Only the keys some stage uses;
    none for Mobius (its copies are graph nodes, ``options.mobius``)."""
    o, bw = costs.options, costs.pcie_bandwidth_bytes_per_s
    if o.swap_in_s_per_param_byte is not None or bw is None:
        return {}
    s, i, j = np.arange(costs.pp), np.asarray(bounds[:-1]), np.asarray(bounds[1:])
    params = costs.param_prefix_bytes[j] - costs.param_prefix_bytes[i]
    streamed = np.array(["stream" in n for n in names])
    offloaded = np.array(["offload" in n for n in names]) & ~streamed & (not costs.delayed_host_step)
    grads_out = _optimizer_copy_bytes(costs, bounds, job, dp)[0]
    out = {"activation_copy_s": costs.activation_copy_s(s, i, j),
           "weight_copy_s": np.where(streamed, params / bw, 0.0),
           "optimizer_copy_s": np.where(offloaded, grads_out / bw, 0.0)}
    return {k: [float(x) for x in v] for k, v in out.items() if np.any(np.asarray(v) > 0)}


def _optimizer_copy_bytes(costs: PipelineCosts, bounds, job, dp: int) -> tuple[np.ndarray, np.ndarray]:
    """``(out, in)`` ``(S,)``: bytes one GPU of each stage of the split
    ``bounds`` copies for an offloaded optimizer step (whatever its option):
    the share of its parameters (its layers' and an offloaded tied copy's,
    :meth:`PipelineCosts.host_param_bytes`) the device updates, times the
    gradient bytes out and the weight bytes in per parameter
    (:func:`pipesearch.memory.offload_copy_bytes_per_param`)."""
    from .memory import offload_copy_bytes_per_param, param_state_of

    s, i, j = np.arange(costs.pp), np.asarray(bounds[:-1]), np.asarray(bounds[1:])
    state = param_state_of(job)
    share = state.update_share(dp)
    params = share * costs.host_param_bytes(s, i, j) * costs.params_per_param_byte
    out_bytes, in_bytes = offload_copy_bytes_per_param(state)
    return params * out_bytes, params * in_bytes


def stage_pcie_bytes(costs: PipelineCosts, bounds, job, dp: int, tp: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """``(total, activations)``: bytes each stage of the split ``bounds``
    moves over PCIe per iteration under its option, over its ``dp x tp``
    GPUs (``(S,)`` each; :func:`host_plan_info` states the terms: an
    offloaded optimizer's gradients out and weights back,
    :func:`_optimizer_copy_bytes`, ZeRO-Offload Fig. 2; streamed weights 3
    copies per micro-batch; a Mobius stage once per stay in and its
    gradients out once; offloaded activations ``2 m`` copies of a
    micro-batch's kept bytes, included in ``total``). Zeros without
    options."""
    S = costs.pp
    s, i, j = np.arange(S), np.asarray(bounds[:-1]), np.asarray(bounds[1:])
    o = costs.options
    if o is None:
        return np.zeros(S), np.zeros(S)
    names = [o.names[int(k)] for k in costs.option_index(s, i, j)]
    params = costs.param_prefix_bytes[j] - costs.param_prefix_bytes[i]
    ranks = len(o.swap_queue) if o.swap_queue is not None else S
    last_local = s >= S - ranks
    copied = params + o.stream_tied_bytes  # one streamed stage copies a tied matrix in for its head too
    moved = np.select([np.array(["stream" in n for n in names]), np.array([n.startswith("swap") for n in names]),
                       np.array(["offload" in n for n in names])],
                      [3.0 * costs.num_micro_batches * copied, np.where(last_local, 2.0, 3.0) * params,
                       sum(_optimizer_copy_bytes(costs, bounds, job, dp))], 0.0)
    act_moved = 2.0 * costs.num_micro_batches * costs.activation_offload_bytes(s, i, j)[0] * dp * tp
    return moved * dp * tp + act_moved, act_moved


TERM_TIE_REL = 1e-9
"""Relative tolerance under which two options' stage terms count as equal
(floating-point rounding of the same sums): the tie rule of
:func:`prefer_device_state` never makes a plan slower than this."""


def prefer_device_state(costs: PipelineCosts, bounds, job, dp: int, tp: int = 1) -> PipelineCosts:
    """``costs`` with, stage by stage, the other chain where that keeps
    more state on the GPU at no cost in time: on the split ``bounds``, a
    stage moves to the other chain (:data:`pipesearch.stage_options.
    OFFLOAD_FIRST` / ``DEVICE_FIRST``) when that chain's first fitting
    option fits, none of its forward, backward, input-gradient, after-
    backward and host-step times exceeds the current option's (relative
    :data:`TERM_TIE_REL`), and it moves fewer bytes over PCIe per iteration
    (:func:`stage_pcie_bytes`), or as many with less device memory.

    Exact for time: the makespan is a longest path with non-negative
    weights (:mod:`pipesearch.timemodel`), so no stage term growing means no
    path growing, and the choice of one stage changes no other stage's
    terms. So an offloading option is kept only where no option without
    that offload fits, or where the offload is faster (docs/offload.md, "Only
    where memory requires it"). ``costs`` without chains is returned as is.
    """
    if not has_policies(costs):
        return costs
    o = costs.options
    S = costs.pp
    rows = [OFFLOAD_FIRST, DEVICE_FIRST]
    policies = [next((p for p in rows if np.array_equal(o.policy_chains[p], o.allowed[:, k])), None)
                for k in range(S)]
    if any(p is None for p in policies):
        return costs  # a stage on the relaxed chain: not a plan
    i, j = np.asarray(bounds[:-1]), np.asarray(bounds[1:])
    for k in range(S):
        cand = with_policies(costs, policies[:k] + [rows[1 - rows.index(policies[k])]] + policies[k + 1:])
        if not bool(cand.fits(k, i[k], j[k])):
            continue
        now, alt = (np.array([float(c.fwd_s(k, i[k], j[k])), float(c.bwd_s(k, i[k], j[k])),
                              float(c.bwd_input_s(k, i[k], j[k])), float(c.after_backward_s(k, i[k], j[k])),
                              float(c.host_step_s(k, i[k], j[k]))]) for c in (costs, cand))
        if np.any(alt > now * (1 + TERM_TIE_REL) + 1e-15):
            continue
        bytes_now, bytes_alt = (float(stage_pcie_bytes(c, bounds, job, dp, tp)[0][k]) for c in (costs, cand))
        mem_now, mem_alt = (float(c.memory_bytes(k, i[k], j[k])) for c in (costs, cand))
        if bytes_alt < bytes_now or (bytes_alt == bytes_now and mem_alt < mem_now):
            costs, policies = cand, policies[:k] + [rows[1 - rows.index(policies[k])]] + policies[k + 1:]
    return costs


def pin_mobius_activations(costs: PipelineCosts, bounds) -> PipelineCosts:
    """``costs`` with each Mobius stage held to the option the split
    ``bounds`` gives it (:func:`pipesearch.stage_options.mobius_activation_choice`:
    activations in host memory where its GPU requires it), so that the
    plan's per-stage options, memory and host bytes name that choice;
    ``costs`` itself without Mobius' activation options."""
    o = costs.options
    if o is None or o.swap_act_copy_prefix_s is None:
        return costs
    act = np.asarray(costs.stage_times(np.asarray(bounds)).act_host, dtype=bool)
    allowed = np.stack([~act, act])
    if o.allowed is not None and np.array_equal(o.allowed, allowed):
        return costs
    return replace(costs, options=replace(o, allowed=allowed))


def host_overflow_note(costs: PipelineCosts, schedule: str, pp: int, vp: int = 1) -> str | None:
    """Why a point with host-memory options has no plan when host memory is
    the reason: the best split with the host unlimited, its first stage
    whose option needs more host memory than its share
    (:func:`pipesearch.host.host_memory_share_bytes`), as one line; None
    when no split fits even then or the host is not what refuses it."""
    o = costs.options
    if o is None or not np.any(o.host_bytes_per_param_byte > 0) and o.act_resident_micro_batches is None:
        return None
    free = replace(costs, options=replace(o, host_capacity_bytes=np.full_like(o.host_capacity_bytes, np.inf),
                                          **({} if o.node_host_memory_bytes is None else {
                                              "node_host_memory_bytes": np.full_like(o.node_host_memory_bytes,
                                                                                     np.inf)})))
    found, chosen = exact_split_over_policies(free, schedule, pp, vp)
    if found is None or not np.isfinite(found.best_time_s):
        return None
    bounds = np.asarray(found.bounds)
    s, i, j = np.arange(costs.pp), bounds[:-1], bounds[1:]
    chosen = pin_mobius_activations(chosen, bounds)  # Mobius: the stages' activation choice on this split
    k = chosen.option_index(s, i, j)
    host = np.take_along_axis(chosen._option_memory(s, i, j)[1], k[None], axis=0)[0]
    act = chosen.activation_offload_bytes(s, i, j)[1]
    gib = 2.0 ** 30
    if o.node_host_memory_bytes is not None:  # Mobius: all stages of a node together (costs.mobius_node_host_bytes)
        node = chosen.mobius_node_host_bytes(bounds)
        n = int(np.argmax(node / o.node_host_memory_bytes))
        if node[n] <= o.node_host_memory_bytes[n]:
            return None
        need, have = format_gib_pair(node[n], o.node_host_memory_bytes[n])
        acts = np.any(act > 0) or any("act-host" in o.names[int(x)] for x in k)  # activations kept on the host
        return (f"host memory: the best split with the host unlimited ({','.join(str(int(x)) for x in j - i)}) "
                f"would keep {need} in the host memory of node {n} (its GPUs' stages' 16-bit weights"
                + (", optimizer state and offloaded activations" if acts else " and optimizer state")
                + f") against its {have}; use a host with more memory ([host] memory_GB)"
                + (" or fewer micro-batches in flight" if acts else ""))
    over = np.flatnonzero(host > o.host_capacity_bytes)
    if not len(over):
        return None
    q = int(over[0])
    need, have = format_gib_pair(host[q], o.host_capacity_bytes[q])
    acts = f" (offloaded activations {act[q] / gib:.1f} GiB)" if act[q] > 0 else ""
    return (f"host memory: stage {q} (layers {int(i[q])}..{int(j[q]) - 1}, option {o.names[int(k[q])]}) would keep "
            f"{need} in host memory per GPU{acts} against its {have} share (the node's host memory over the plan's "
            "GPUs on it); use a host with more memory ([host] memory_GB)"
            + (" or fewer micro-batches in flight" if act[q] > 0 else ""))
