"""The search's pins and knobs, and the model's layer tables it searches over."""

from __future__ import annotations

from dataclasses import dataclass, field


from .types import ModelProfile, SCHEDULES


ANALYTIC_SCHEDULES = ("gpipe", "1f1b")


#: every schedule the search knows; the first two have an exact analytic split
ALL_SCHEDULES = SCHEDULES


DEFAULT_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1")


MULTI_STAGE_SCHEDULES = ("interleaved-1f1b", "looped-bfs", "mobius", "roundpipe")
#: multi-stage schedules whose vp 1 no other schedule of the search runs (interleaved 1F1B's vp 1 is 1F1B,
#: looped BFS's GPipe): without --vp they are searched at vp 1 as well as at the default vp
OWN_VP1_SCHEDULES = ("mobius", "roundpipe")


@dataclass(frozen=True)
class SearchOptions:
    """Pins and knobs of a search. ``None`` means "search over it".

    Attributes:
        pp, dp, micro_batch_size, num_micro_batches: pinned degrees.
        schedules: schedules to consider (see :data:`ALL_SCHEDULES`).
        vps: virtual stages per device to try for interleaved 1F1B and
            looped breadth-first.
        split: layers per stage to score instead of searching (implies pp).
        top: number of plans to return.
        placements: device placement orders to try when pp > 1 and dp > 1
            (see :func:`pipesearch.costs.pipeline_placement`).
        exhaustive: evaluate every point instead of skipping those whose
            lower bound cannot enter the top plans (for plots of the space).
        mapping_time_limit_s: work limit of the CP-SAT device-order search on
            mixed clusters, in CP-SAT's deterministic time (about seconds; the
            same limit gives the same answer on every machine under any
            load; there is no wall-clock limit): the closed-form order that
            the order search (:mod:`pipesearch.order_search`) splits first
            when a cluster has more orders than it visits, used only when
            neither order enumeration nor the device-class DP applies.
        enumerate_layouts_up_to: on mixed clusters, a (pp, dp) group with at
            most this many layouts (up to swaps inside a node,
            :func:`pipesearch.placement.count_layouts`) tries every one of
            them, so its best plan is exact over placements too.
        replicate_stages: also search per-stage replication (PipeDream /
            DAPPLE: stage ``k`` on its own ``r_k`` replicas, each one
            tensor-parallel slot, :mod:`pipesearch.replication`), every
            replica vector of ``pp`` up to
            :data:`pipesearch.replication.MAX_REPLICATED_PP` stages, on
            every placement when there are at most
            ``enumerate_layouts_up_to`` of them.
        split_replicas: replicas per stage of ``split`` (``--split
            17x15,6x1``): score that replicated point only.
        vp_pinned: ``vps`` was pinned (``--vp``): every plan has one of
            them, so a single-stage schedule or ``pp`` 1 (both vp 1) is
            searched only when 1 is among them (:func:`vp_choices`).
        placement_pinned: ``placements`` was pinned (``--placement``): on a
            cluster of several groups too, only those patterns
            (:func:`placement_names`).
        min_dp: the least data-parallel degree searched: 2 when the
            optimizer state is sharded over replicas at the user's request
            (``--sharding``, ``--zero1``), which one replica would not
            honour; the smaller degrees are counted as ``one_replica``.
        runtime: ``--runtime``: the points whose every plan it refuses
            (:func:`pipesearch.runtimes.point_refusal`, torch's schedule
            rules) are ``schedule_refused``, so the ranked plans are among
            those it runs.
    """

    pp: int | None = None
    dp: int | None = None
    micro_batch_size: int | None = None
    num_micro_batches: int | None = None
    schedules: tuple[str, ...] = DEFAULT_SCHEDULES
    vps: tuple[int, ...] = (2,)
    split: tuple[int, ...] | None = None
    top: int = 5
    placements: tuple[str, ...] = ("pipeline", "data")
    exhaustive: bool = False
    mapping_time_limit_s: float = 0.5
    enumerate_layouts_up_to: int = 24
    replicate_stages: bool = False
    split_replicas: tuple[int, ...] | None = None
    vp_pinned: bool = field(default=False, repr=False)  # in the fingerprint only when set (search)
    placement_pinned: bool = field(default=False, repr=False)  # likewise
    min_dp: int = field(default=1, repr=False)  # likewise
    runtime: str | None = field(default=None, repr=False)  # likewise


def vp_choices(schedule: str, pp: int, options: SearchOptions) -> tuple[int, ...]:
    """The virtual stages per device a point of ``schedule`` at ``pp``
    takes: ``options.vps`` for a multi-stage schedule over ``pp > 1`` ranks
    (and vp 1 for :data:`OWN_VP1_SCHEDULES` when ``--vp`` is not pinned),
    else vp 1 (one rank runs all its stages as one; a single-stage schedule
    runs one), or none when ``options.vp_pinned`` excludes 1."""
    if schedule in MULTI_STAGE_SCHEDULES and pp > 1:
        if schedule in OWN_VP1_SCHEDULES and not options.vp_pinned:
            return tuple(sorted({1, *options.vps}))
        return tuple(options.vps)
    return (1,) if not options.vp_pinned or 1 in options.vps else ()


#: the schedules whose backward runs as two passes, input gradients then (later) weight gradients
SPLIT_BACKWARD_SCHEDULES = ("zb-h1",)


@dataclass(frozen=True)
class ModelVariant:
    """A layer table of the model under one (tp, recompute) choice."""

    profile: ModelProfile
    tp: int = 1
    recompute: str = "none"
    extra: tuple[tuple[str, object], ...] = ()
    #: per-stage recompute: ``(mode, layer table)`` pairs, fastest first, from
    #: which each stage takes the first that fits (``recompute = "per-stage"``;
    #: :func:`pipesearch.stage_options.stage_options`); empty: ``profile`` alone
    stage_tables: tuple[tuple[str, ModelProfile], ...] = ()
    #: offer stages the optimizer state in host memory (``Job.optimizer_offload``)
    offload: bool = False
    #: offer stages their weights streamed from host memory (``Job.weight_streaming``)
    stream: bool = False
    #: the tables of the schedules that split each backward into an input-gradient
    #: pass and a later weight-gradient pass (:data:`SPLIT_BACKWARD_SCHEDULES`),
    #: ``(profile, stage_tables)``, where they differ: a tensor-parallel collective
    #: that the whole backward hides under a GEMM's weight gradient runs alone in
    #: the input pass, the weight gradient later (docs/transformer_costs.md); None:
    #: ``profile`` and ``stage_tables`` serve every schedule
    split_backward: tuple[ModelProfile, tuple[tuple[str, ModelProfile], ...]] | None = None

    def tables(self, schedule: str) -> tuple[ModelProfile, tuple[tuple[str, ModelProfile], ...]]:
        """``(profile, stage_tables)`` of the points of ``schedule``."""
        if self.split_backward is not None and schedule in SPLIT_BACKWARD_SCHEDULES:
            return self.split_backward
        return self.profile, self.stage_tables
