"""Lower bounds of the simulated time over every device order and split at
once, by dynamic programming over device classes.

One pipeline (``dp = 1``, one stage per rank: GPipe, 1F1B, ZB-H1) runs rank
``k`` on a slot of class ``c_k`` (:func:`pipesearch.placement.slot_classes`:
the slots of one node are interchangeable). A stage's cost terms depend only
on its index ``k``, its layers ``[i, j)``, its class ``c_k`` and, through
the transfer after it, the next class ``c_{k+1}``. Every family below is a
path of the schedule's dependency graph (the families of
:func:`pipesearch.split_bounds.bound_families`, docs/schedules.md), written
with per-stage terms ``alpha0 + ka * c`` and ``beta0 + kb * c``, ``c`` the
stage's own outgoing transfer:

* ``F0`` micro-batch 0 down and its gradient back up: ``sum_k (F_k + G_k +
  2 c_k)`` (``G = I`` for ZB-H1, else ``B``; the gradient of boundary ``k``
  crosses the same link with the same bytes as the activation, so the
  incoming transfer ``c_in`` of stage ``k + 1`` is counted as ``c_k``);
* ``F1`` rank ``k`` starts when micro-batch 0 reaches it and then runs its
  whole work: ``max_k (sum_{k'<k} (F + c)_k' + m (f_k + b_k) + r_k)``;
* ``F2`` rank ``q``'s work up to its last forward
  (:func:`pipesearch.schedules.work_until_last_forward`), then micro-batch
  ``m - 1``'s gradient up to stage ``k`` and ``k``'s last backward and
  all-reduce: ``max_q work_q + max_k (B_k + r_k + c_k + sum_{k'>k} (G + c)_k')``;
* ``T6`` rank ``q``'s work up to its last forward, micro-batch ``m - 1``
  down to the last stage, its gradient back up to stage 0, then rank 0's
  last weight gradient (ZB-H1) and all-reduce: ``sum_k (F + G + 2 c)_k +
  W_0 + r_0 + max_q (work_q - f_q)`` (the last forward and its transfer
  counted once);
* ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, sec. 3:
  the ``W`` of a micro-batch may wait until after the ``I`` of later ones):
  ``sum_k (F + c)_k + max_k ((m-1) F + w I + max(m-S, 0) W)_k + max_k (B_k +
  r_k + c_k + sum_{k'>k} (I + c)_k')`` and ``sum_k (F + c)_k + max_k (m B +
  w F + r + c)_k + ...`` (``w = m - S + k``);
* ZB-H1 with ``m > S``, two round trips: micro-batch 0 down and up, rank
  0's ``W`` of it and forward of micro-batch ``S`` (rank 0 runs ``I_0, W_0,
  F_S`` one after another), that forward down to stage ``k``, rank ``k``'s
  actions from its forward of micro-batch ``S`` to that of ``m - 1`` (steps
  ``j = k+1 .. m-S+k`` of :func:`pipesearch.schedules.zb_h1`'s order: ``m -
  S`` forwards and the ``m - S - 1`` pairs ``I, W`` between them),
  micro-batch ``m - 1`` from ``k`` down to the last stage and back up to
  stage 0, then rank 0's last ``W`` and all-reduce. Every stage but ``k`` is
  crossed twice down and twice up, ``k`` once each way plus its steady
  work, so the path is ``sum_k (2 (F + I) + 4 c)_k + 2 W_0 + r_0 + (m - S -
  1) max_k (F + B)_k``: the fill and drain of both round trips plus the
  bottleneck rank's steady state (the critical path of the best 16-rank
  plans of docs/heterogeneous.md);
* the same ending on rank ``q`` instead of rank 0: micro-batch ``m - 1``
  back up to stage ``q`` only, then the ``q + 1`` ``W`` rank ``q`` runs
  after its last ``I`` (in :func:`pipesearch.schedules.zb_h1`'s order the
  ``W`` of micro-batch ``j`` follows the ``I`` of ``j + q``) and its
  all-reduce: ``sum_k (2 F + I + 3 c)_k + W_0 + (m - S - 1) max_k (F +
  B)_k + max_q (I_q + (q + 1) W_q + r_q + c_q + sum_{k > q} (I + c)_k)``
  (a later rank's optimizer step can end the iteration); for the same
  reason ``F2`` and the first ZB-H1 family above count ``B_k + k W_k`` on
  stage ``k``, not ``B_k``;
* 1F1B: ``max_k (sum_{k'<k} (f + b)_k' + m (f + b)_k)``; ``sum_k f_k +
  max_k ((m-1) f + w b)_k + max_k (b_k + r_k + c_k + sum_{k'>k} (B + c)_k')``;
  ``sum_k f_k + max_k (m b + w f + r + c)_k + ...``; and ``sum_k (f + b +
  c)_k`` plus either term of ``max_k max((m-1) b + w f, (m-1) f + w b)``.

``f = F + c`` and ``b = B`` under 1F1B's blocking sends, ``f = F``, ``b =
B`` otherwise; a stage's incoming transfer where the split search's family
has one inside a maximum is left out (every term is non-decreasing in it,
``m >= S``), so each family here is at most its split-search counterpart,
which is at most the simulated time.

:class:`ClassBounds` holds these terms for every (stage, class, range) and
the suffix minima of every component over the classes still free
(:meth:`ClassBounds.suffix`, a backward DP over ``(slots left per class,
class of the stage, first layer)``, the states of :mod:`pipesearch.class_dp`);
:meth:`ClassBounds.extend` appends one class to a prefix of ranks and
bounds every order and split that starts with it (the prefix's stages by a
forward DP over their splits, the rest by the suffix minima), so that
:func:`pipesearch.order_search.best_order` can branch on the class of each
rank.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Callable, Sequence

import numpy as np

from . import schedules as schedule_lib
from .costs import PipelineCosts
from .split_fits import fit_ends
from .timemodel import send_overlap

#: schedules the class bounds cover (one stage per rank)
CLASS_BOUND_SCHEDULES = ("gpipe", "1f1b", "zb-h1")
#: floats of the term tables (classes x stages x components x layer ranges) above which they are not built
MAX_TABLE_FLOATS = 2**24
#: floats per array of one numpy pass of the suffix-minimum DP (memory, not answers: every pass is exact)
MAX_PASS_FLOATS = 2**22

# component kinds: "sum" sum_k alpha; "max" max_k beta; "prefix" max_k (sum_{k'<k} alpha + beta_k);
# "suffix" max_k (beta_k + sum_{k'>k} alpha)
_KINDS = ("sum", "max", "prefix", "suffix")
#: the max part of an empty set of stages (finite, so that it plus an infinite sum stays infinite, never nan)
NEG = -1e300


def families(schedule: str, pp: int, m: int):
    """The families of the module docstring as lists of ``(kind, name)``
    component names; :func:`stage_terms` gives their per-stage terms."""
    fams = [[("sum", "f0")], [("prefix", "f1")], [("max", "f2w"), ("suffix", "f2s")],
            [("sum", "t6s"), ("max", "t6m")]]
    if schedule == "zb-h1" and m >= pp:
        fams += [[("sum", "fc"), ("max", "z3m"), ("suffix", "z3s")], [("sum", "fc"), ("suffix", "z4s")]]
    if schedule == "zb-h1" and m > pp:
        fams += [[("sum", "z6s"), ("max", "z6m")], [("sum", "z7s"), ("max", "z6m"), ("suffix", "z7q")]]
    if schedule == "1f1b" and m >= pp:
        fams += [[("prefix", "o5")], [("sum", "fc"), ("max", "o1m"), ("suffix", "o1s")],
                 [("sum", "fc"), ("suffix", "o2s")], [("sum", "o3"), ("max", "o3x")], [("sum", "o3"), ("max", "o3y")]]
    return fams


def stage_terms(costs: PipelineCosts, schedule: str, pp: int, s: int, i, j) -> dict:
    """Per-stage terms of stage ``s`` over the ranges ``[i, j)``: ``{name:
    (alpha0, ka, beta0, kb)}`` (``alpha0``, ``beta0`` arrays shaped like
    ``i``, ``j`` or None; ``ka``, ``kb`` the coefficients of the stage's own
    outgoing transfer). ``costs`` must have stage ``s`` on the class whose
    terms are wanted (its speed, capacity, all-reduce)."""
    m, S = costs.num_micro_batches, costs.pp
    F, B, I = costs.fwd_s(s, i, j), costs.bwd_s(s, i, j), costs.bwd_input_s(s, i, j)
    r = costs.after_backward_s(s, i, j)
    blocking = not send_overlap(schedule)
    G = I if schedule == "zb-h1" else B
    w = m - S + s
    after_i = schedule_lib.zb_h1_weight_grads_after_last_input_grad(s)  # ZB-H1: W after the last I
    tail_w = (after_i - 1) * (B - I) if schedule == "zb-h1" else 0.0  # beyond the one in B
    counts = _until_last_forward(schedule, pp, m)
    nF, nB, nI, nW = (counts[k][s] for k in "FBIW")
    out = {"f0": (F + G, 2.0, None, 0.0),
           "f1": (F, 1.0, m * (F + B) + r, float(m) if blocking else 0.0),
           "f2w": (None, 0.0, nF * F + nB * B + nI * I + nW * (B - I), float(nF) if blocking else 0.0),
           "f2s": (G, 1.0, B + tail_w + r, 1.0),
           "t6s": (F + G + ((B - I if schedule == "zb-h1" else 0.0) + r if s == 0 else 0.0), 2.0, None, 0.0),
           "t6m": (None, 0.0, nF * F + nB * B + nI * I + nW * (B - I) - F, float(nF - 1) if blocking else 0.0)}
    if schedule == "zb-h1" and m >= S:
        out["fc"] = (F, 1.0, None, 0.0)
        out["z3m"] = (None, 0.0, (m - 1) * F + w * I + max(m - S, 0) * (B - I), 0.0)
        out["z3s"] = (I, 1.0, B + tail_w + r, 1.0)
        out["z4s"] = (I, 1.0, m * B + w * F + r, 1.0)
    if schedule == "zb-h1" and m > S:
        out["z6s"] = (2.0 * (F + I) + ((2.0 * (B - I) + r) if s == 0 else 0.0), 4.0, None, 0.0)
        out["z6m"] = (None, 0.0, (m - S - 1) * (F + B), 0.0)
        out["z7s"] = (2.0 * F + I + ((B - I) if s == 0 else 0.0), 3.0, None, 0.0)
        out["z7q"] = (I, 1.0, I + after_i * (B - I) + r, 1.0)
    if schedule == "1f1b" and m >= S:
        out["o5"] = (F + B, 1.0, m * (F + B), float(m))
        out["fc"] = (F, 1.0, None, 0.0)
        out["o1m"] = (None, 0.0, (m - 1) * F + w * B, float(m - 1))
        out["o1s"] = (B, 1.0, B + r, 1.0)
        out["o2s"] = (B, 1.0, m * B + w * F + r, float(w + 1))
        out["o3"] = (F + B, 2.0, None, 0.0)
        out["o3x"] = (None, 0.0, (m - 1) * B + w * F, float(w))
        out["o3y"] = (None, 0.0, (m - 1) * F + w * B, float(m - 1))
    return out


def _until_last_forward(schedule: str, pp: int, m: int):
    return schedule_lib.work_until_last_forward(schedule, pp, m, 1)


@dataclass(frozen=True)
class Prefix:
    """A prefix of ranks with fixed classes: the forward DP over its splits.

    ``classes``: class of ranks ``0 .. r-1``; ``left``: slots left per class;
    ``fwd``: per component row, arrays ``(L+1,)`` over the first layer of rank
    ``r - 1`` for the stages ``0 .. r-2`` (``sum``: least sum of alpha;
    ``max``: least max of beta; ``prefix``: least alpha sum and least max;
    ``suffix``: least alpha sum and least ``max_k (beta_k + sum_{k<k'} alpha)``).
    """

    classes: tuple[int, ...]
    left: tuple[int, ...]
    fwd: np.ndarray  # (R, 2, L+1): row per component, [0] alpha sum, [1] max part
    bound_s: float


class ClassBounds:
    """Term tables per (class, stage) and the suffix minima over the classes
    left (module docstring).

    Args:
        class_costs: for each class ``c`` and stage ``s``, a
            :class:`PipelineCosts` with stage ``s`` on a slot of class ``c``
            (a list per class, indexed by stage).
        send: ``send(c, c2)``: per boundary layer ``j`` (shape ``(L+1,)``) the
            transfer after a stage on class ``c`` ending at ``j`` when the
            next stage is on class ``c2`` (0 at ``j = L``).
        sizes: slots per class; ``schedule``, ``pp``: the point's.
        cutoff_s: stages whose own work alone (``m (F + B)``) reaches it are
            left out (no split faster than the cutoff has one).
        only: the families to use, by component names (default: all of
            :func:`families`); fewer make a quicker, weaker bound.
        relax_links: a quicker, weaker bound: each stage's outgoing
            transfer is its least over the classes the next stage may have
            (:meth:`_relax_links`), so the suffix DP combines a stage with
            the least over the next class of the minima after it, one
            pass per class instead of one per pair of classes
            (:meth:`_suffix_class`). Every term and DP step is
            non-decreasing in the transfer and in the minima it reads, so
            the bound stays at most the exact one.
    """

    def __init__(self, class_costs: Sequence[Sequence[PipelineCosts]], send: Callable[[int, int], np.ndarray],
                 sizes: Sequence[int], schedule: str, pp: int, cutoff_s: float = np.inf,
                 only: Sequence[str] | None = None, relax_links: bool = False):
        costs0 = class_costs[0][0]
        L, S, m = costs0.num_layers, pp, costs0.num_micro_batches
        self.L, self.S, self.C, self.sizes = L, S, len(sizes), tuple(int(z) for z in sizes)
        self.extra = sum(self.sizes) - S  # slots that stay unused
        self.fams = [fam for fam in families(schedule, pp, m) if only is None or all(n in only for _, n in fam)]
        self._stages: dict = {}
        self.kind = {n: k for fam in self.fams for k, n in fam}
        # the rows of one kind next to each other (slices in :meth:`_combine`)
        names = sorted(dict.fromkeys(n for fam in self.fams for _, n in fam), key=lambda n: _KINDS.index(self.kind[n]))
        self.names = names
        self.row = {n: q for q, n in enumerate(names)}
        self._fam_rows = None  # _family_rows
        R = len(names)
        ii, jj = np.meshgrid(np.arange(L + 1), np.arange(L + 1), indexing="ij")
        ok = np.zeros((self.C, S, L + 1, L + 1), dtype=bool)
        users: dict[int, list] = {}  # the (class, stage) pairs of each cost object: their fit tests at once
        for c, s in itertools.product(range(self.C), range(S)):
            users.setdefault(id(class_costs[c][s]), []).append((c, s))
        for pairs in users.values():
            cs = class_costs[pairs[0][0]][pairs[0][1]]
            # stage s starts at a layer in [s, L - S + s] and leaves a layer to each later stage
            for (c, s), can in zip(pairs, stage_fit_masks(cs, [s for _, s in pairs], S, ii, jj)):
                i, j = ii[can], jj[can]  # the work test on the ranges that fit only
                ok[c, s][can] = m * (cs.fwd_s(s, i, j) + cs.bwd_s(s, i, j)) < cutoff_s
        # band: the longest stage any (class, stage) can hold; arrays (.., L+1 starts, W lengths)
        lengths = np.where(ok, (jj - ii)[None, None], 0)
        self.W = W = max(1, int(lengths.max()))
        #: per class the longest stage it can hold on any rank (0: none)
        self.band = tuple(int(x) for x in lengths.max(axis=(1, 2, 3)))
        d = np.arange(1, W + 1)
        self.J = J = np.minimum(np.arange(L + 1)[:, None] + d[None, :], L)  # (L+1, W) end layer
        inband = (np.arange(L + 1)[:, None] + d[None, :]) <= L
        self.ok = ok[:, :, np.arange(L + 1)[:, None], J] & inband[None, None]
        self.a0 = np.zeros((self.C, S, R, L + 1, W))
        self.b0 = np.full((self.C, S, R, L + 1, W), NEG)
        self.ka = np.zeros((S, R))
        self.kb = np.zeros((S, R))
        rows_i = np.broadcast_to(np.arange(L + 1)[:, None], J.shape)
        real = J > rows_i  # the band's ranges [i, J); the others (masked by ok) as (0, 1)
        ib, jb = np.where(real, rows_i, 0), np.where(real, J, 1)
        for c in range(self.C):
            for s in range(S):
                for n, (a0, ka, b0, kb) in stage_terms(class_costs[c][s], schedule, pp, s, ib, jb).items():
                    if n not in self.row:
                        continue
                    q = self.row[n]
                    if a0 is not None:
                        self.a0[c, s, q] = a0
                    if b0 is not None:
                        self.b0[c, s, q] = b0
                    self.ka[s, q], self.kb[s, q] = ka, kb
        self.send = np.zeros((self.C, self.C + 1, L + 1))  # index C: no next stage
        for c, c2 in itertools.product(range(self.C), range(self.C)):
            if c != c2 or self.sizes[c] > 1:
                self.send[c, c2] = send(c, c2)
        self.relax_links = relax_links
        if relax_links:
            self._relax_links()
        self.twin_before = self._twins()
        self._suffix_minima()

    def _relax_links(self) -> None:
        """Every transfer after a stage on class ``c`` replaced by its least
        over the next classes possible (``c`` itself only when it has two
        or more slots), per boundary layer: the same for every next class."""
        for c in range(self.C):
            nxt = [c2 for c2 in range(self.C) if c2 != c or self.sizes[c] > 1]
            if nxt:
                self.send[c, :self.C] = self.send[c, nxt].min(axis=0)

    def _twins(self) -> tuple[int | None, ...]:
        """Per class the previous class interchangeable with it (same
        slots, terms and transfers to and from every other class; two A100
        nodes of one group), else None: swapping two such classes maps
        every order to one of the same time, so :meth:`allowed` lets a
        class start only after its twin has."""
        out: list[int | None] = [None] * self.C
        for b in range(self.C):
            out[b] = next((a for a in range(b - 1, -1, -1) if self._same(a, b)), None)
        return tuple(out)

    def _same(self, a: int, b: int) -> bool:
        """Whether swapping classes ``a`` and ``b`` maps the tables onto
        themselves: equal sizes, terms and fits, equal transfers to and from
        every other class, ``a -> a`` as ``b -> b`` and ``a -> b`` as ``b -> a``."""
        if self.sizes[a] != self.sizes[b] or not (np.array_equal(self.ok[a], self.ok[b])
                                                and np.array_equal(self.a0[a], self.a0[b])
                                                and np.array_equal(self.b0[a], self.b0[b])):
            return False
        others = [x for x in range(self.C) if x not in (a, b)]
        return (np.array_equal(self.send[a, others], self.send[b, others])
                and np.array_equal(self.send[others, a], self.send[others, b])
                and np.array_equal(self.send[a, a], self.send[b, b])
                and np.array_equal(self.send[a, b], self.send[b, a]))

    def allowed(self, node: "Prefix", c: int) -> bool:
        """Whether rank ``len(node.classes)`` may take class ``c``: a slot
        left, and its twin (:meth:`_twins`) already used if ``c`` is not."""
        if node.left[c] == 0:
            return False
        a = self.twin_before[c]
        return a is None or node.left[c] < self.sizes[c] or node.left[a] < self.sizes[a]

    # -- the backward DP over (slots left, class, first layer) ---------------------------------------------

    def _suffix_minima(self) -> None:
        """``self.V[left]``: array ``(C, R, 2, L+1)``: for the stages from
        ``S - (|left| - extra)`` on, the first on class ``c`` starting at
        layer ``i``, with ``left`` slots per class available to them (the
        first's included), per component row the least alpha sum ``[0]`` and
        the least max part ``[1]`` over every class sequence and split
        (``+inf`` where none). One level (count of stages left) at a
        time, from the last stage back; per class of the stage every pair
        (vector of the level, class of the next stage) in one numpy pass
        (:meth:`_suffix_class`, :meth:`_combine`). Twin classes
        (:meth:`_twins`: equal terms, sizes and links) make the problem
        symmetric under swapping them, so only the vectors whose counts
        do not rise within each set of twins are computed; each other one
        is its canonical vector's with the classes permuted
        (:meth:`_canonical`), the same values bit for bit (every input of
        its DP is the same array, and minima are exact)."""
        L, S, C, R = self.L, self.S, self.C, len(self.names)
        self.V: dict[tuple[int, ...], np.ndarray] = {}
        levels: dict[int, list[tuple[int, ...]]] = {}
        images: dict[int, list] = {}  # per level: (vector, its canonical vector, class permutation)
        for n in itertools.product(*(range(z + 1) for z in self.sizes)):
            if 1 <= sum(n) - self.extra <= S:
                canon, perm = self._canonical(n)
                if canon == n:
                    levels.setdefault(sum(n) - self.extra, []).append(n)
                else:
                    images.setdefault(sum(n) - self.extra, []).append((n, canon, perm))
        last = np.full((1, R, 2, L + 1), np.inf)  # the state after the last stage: only j = L, empty
        last[:, :, 0, L] = 0.0
        last[:, :, 1, L] = NEG
        whole = C * (C + 1) * R * (L + 1) * self.W <= MAX_PASS_FLOATS  # every pair's terms of a stage at once
        radix = np.cumprod((1,) + tuple(z + 1 for z in self.sizes[:-1]))  # a vector's code (each in one level)
        rows = np.zeros(int(radix @ np.array(self.sizes)) + 1, dtype=np.int64)  # by code: the row in its level
        below = None  # the level before: (its values, its least over the class)
        for stages in sorted(levels):
            s = S - stages
            tables = self._stage_tables(s) if whole else None
            canon = levels[stages]
            vectors = np.array(canon, dtype=np.int64).reshape(len(canon), C)
            out = np.full((len(canon), C, R, 2, L + 1), np.inf)  # the level's canonical vectors, in order
            for c in range(C):
                self._suffix_class(c, s, stages, vectors, tables, last, below, rows, radix, out)
            imgs = images.get(stages, [])
            rows[vectors @ radix] = np.arange(len(canon))
            of = rows[np.array([x for _, x, _ in imgs], dtype=np.int64).reshape(-1, C) @ radix]  # images' canonical
            values = np.concatenate([out, out[of[:, None], np.array([p for _, _, p in imgs], dtype=np.int64)
                                              .reshape(-1, C)]])  # an image: its canonical vector's, classes permuted
            every = canon + [n for n, _, _ in imgs]
            self.V.update(zip(every, values))
            rows[np.array(every, dtype=np.int64).reshape(-1, C) @ radix] = np.arange(len(every))
            below = (values, values.min(axis=1) if self.relax_links else None)

    def _canonical(self, left: tuple[int, ...]) -> tuple[tuple[int, ...], np.ndarray]:
        """``(canon, perm)``: ``left`` with the counts of each set of twin
        classes (:meth:`_twins`) sorted in non-increasing order over the
        set's classes (ties keep their order), and the permutation of the
        classes that maps it there: ``V[left][c] = V[canon][perm[c]]`` (the
        class ``c`` of ``left`` plays the part of ``perm[c]`` in
        ``canon``)."""
        canon, perm = list(left), np.arange(self.C)
        for members in self._twin_sets:
            order = sorted(members, key=lambda c: -left[c])  # stable: ties keep their order
            for target, c in zip(members, order):
                canon[target] = left[c]
                perm[c] = target
        return tuple(canon), perm

    @cached_property
    def _twin_sets(self) -> list[list[int]]:
        """The sets of two or more twin classes (:meth:`_twins`' chains),
        each in increasing order, whose every pair is :meth:`_same` (then
        every permutation inside the set is a symmetry)."""
        sets: dict[int, list[int]] = {}
        for c in range(self.C):
            root = c
            while self.twin_before[root] is not None:
                root = self.twin_before[root]
            sets.setdefault(root, []).append(c)
        return [members for members in sets.values() if len(members) > 1 and all(
            self._same(a, b) for a, b in itertools.combinations(members, 2))]

    def _suffix_class(self, c: int, s: int, stages: int, vectors: np.ndarray, tables, last: np.ndarray, below,
                      rows: np.ndarray, radix: np.ndarray, out: np.ndarray) -> None:
        """The part of :meth:`_suffix_minima` with stage ``s`` on class
        ``c``, for every vector ``left`` of one level (``stages`` stages
        left; ``vectors`` ``(n, C)``) at once: each pair (vector, class
        ``c2`` of the next stage) combined with ``V[left - e_c][c2]`` (from
        ``below``: the level before's values and their least over the class;
        ``rows``: each vector's row in its level by its code ``left @
        radix``), the least over ``c2``
        into ``out[row of left, c]``. Only the first :attr:`band` ``[c]``
        lengths are combined (the longest stage class ``c`` can hold: the
        rest is ``+inf``), in numpy passes of at most :data:`MAX_PASS_FLOATS`
        floats per array."""
        C, R, L, w = self.C, len(self.names), self.L, self.band[c]
        owners = np.flatnonzero(vectors[:, c] > 0) if w > 0 else np.zeros(0, dtype=np.int64)
        if not len(owners):
            return
        best = np.full((len(owners), R, 2, L + 1), np.inf)
        step = max(1, MAX_PASS_FLOATS // (R * (L + 1) * w))  # pairs per numpy pass
        rests = vectors[owners] - np.eye(C, dtype=np.int64)[c]  # slots after this stage
        if stages > 1:
            values, least = below
            rest_rows = rows[rests @ radix]
        for c2 in ([C] if stages == 1 else [0] if self.relax_links else range(C)):  # pairs of one next class
            if stages == 1:
                who, nxt = np.arange(len(owners)), np.broadcast_to(last, (len(owners),) + last.shape[1:])
            elif self.relax_links:  # the terms do not depend on the next class: the least over it of its minima
                # (per row and part: a relaxation of _combine's pair (alpha sum, max part), which may then come
                # from two classes)
                who, nxt = np.arange(len(owners)), least[rest_rows]
            else:
                who = np.flatnonzero(rests[:, c2] > 0)
                if not len(who):
                    continue
                nxt = values[rest_rows[who], c2]
            col = c2 if not self.relax_links else int(c2 == C)  # relaxed: the tables' columns any class, none
            a, b = (tables[0][c, col], tables[1][c, col]) if tables is not None else self._stage(c, s, c2)
            a, b = a[None, ..., :w], b[None, ..., :w]
            for lo in range(0, len(who), step):
                k = who[lo:lo + step]  # each owner once per next class: a gather, a minimum, a scatter
                best[k] = np.minimum(best[k], self._combine(a, b, nxt[lo:lo + step]))
        out[owners, c] = best  # (each class's column written once per level)

    def _stage_tables(self, s: int):
        """Terms of stage ``s`` on every class ``c`` with its outgoing
        transfer to every class ``c2`` (``C``: none): ``alpha``, ``beta`` of
        shape ``(C, C+1, R, L+1, W)``, ``+inf`` where the stage cannot be
        (as :meth:`_stage`). With :attr:`relax_links` (every next class the
        same transfer) two columns: any next class, none."""
        cols = [0, self.C] if self.relax_links else slice(None)
        ok = self.ok[:, s][:, None, None]  # (C, 1, 1, L+1, W)
        sj = self.send[:, cols][:, :, self.J][:, :, None]  # (C, C+1 or 2, 1, L+1, W)
        a = self.a0[:, s][:, None] + self.ka[s][None, None, :, None, None] * sj
        b = self.b0[:, s][:, None] + self.kb[s][None, None, :, None, None] * sj
        return np.where(ok, a, np.inf), np.where(ok, b, np.inf)

    def _stage(self, c: int, s: int, c2: int):
        """Terms of stage ``s`` on class ``c`` with its outgoing transfer to
        class ``c2`` (``C``: none): ``alpha``, ``beta`` of shape ``(R, L+1,
        W)`` (first layer, length - 1), ``+inf`` where the stage cannot be;
        kept while they fit in :data:`MAX_TABLE_FLOATS`."""
        key = (c, s, c2)
        if key in self._stages:
            return self._stages[key]
        ok = self.ok[c, s]
        sj = self.send[c, c2][self.J][None]
        a = self.a0[c, s] + self.ka[s][:, None, None] * sj
        b = self.b0[c, s] + self.kb[s][:, None, None] * sj
        a = np.where(ok[None], a, np.inf)
        b = np.where(ok[None], b, np.inf)
        if (len(self._stages) + 1) * 2 * a.size <= MAX_TABLE_FLOATS:
            self._stages[key] = (a, b)
        return a, b

    def _combine(self, a: np.ndarray, b: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        """``(P, R, 2, L+1)`` over the first layer ``i`` of the stage, for
        each of ``P`` pairs ``(c, c2)``: the stage's terms ``a``, ``b``
        ``(P, R, L+1, W)`` (or ``(1, R, L+1, W)``, shared) on class ``c`` (transfer to ``c2``, as
        :meth:`_stage`) over ``[i, j)`` combined with the next state's
        values at ``j`` (``nxt`` ``(P, R, 2, L+1)``, the state after the
        last stage for ``c2 = C``), least over ``j``."""
        P, R, _, L1 = nxt.shape
        w = a.shape[-1]  # the lengths combined (:attr:`band`)
        pad = np.full((P, R, 2, L1 + w), np.inf)  # past layer L: +inf, as the stage's terms there
        pad[..., :L1] = nxt
        out = np.full(nxt.shape, np.inf)
        tmp = np.empty((P, R, L1))
        kinds = self._kind_rows
        for d in range(w):  # stages [i, i + d + 1): the next state's values at i + d + 1, a view
            na, nm = pad[:, :, 0, d + 1:d + 1 + L1], pad[:, :, 1, d + 1:d + 1 + L1]
            ad, bd = a[..., d], b[..., d]
            np.minimum(out[:, :, 0], np.add(ad, na, out=tmp), out=out[:, :, 0])
            for kind, q in kinds:
                if kind == "max":
                    x = np.maximum(bd[:, q], nm[:, q])
                elif kind == "prefix":
                    x = np.maximum(bd[:, q], ad[:, q] + nm[:, q])
                elif kind == "suffix":  # beta_k plus the least alpha sum after k, or the rest's maximum
                    x = np.maximum(bd[:, q] + na[:, q], nm[:, q])
                else:
                    continue
                np.minimum(out[:, q, 1], x, out=out[:, q, 1])
        for kind, q in kinds:
            if kind == "sum":
                out[:, q, 1] = out[:, q, 0]
        np.copyto(out[:, :, 1], np.inf, where=~np.isfinite(out[:, :, 0]))
        return out

    @cached_property
    def _kind_rows(self) -> list:
        """``(kind, slice of rows)`` for each component kind present (the
        rows are sorted by kind); kept, every DP step reads it."""
        kinds = [self.kind[n] for n in self.names]
        return [(k, slice(kinds.index(k), len(kinds) - kinds[::-1].index(k))) for k in _KINDS if k in kinds]

    # -- prefixes -------------------------------------------------------------------------------------------

    def root(self) -> Prefix:
        """The empty prefix (every order), bound the least over every first class."""
        R, L = len(self.names), self.L
        fwd = np.full((R, 2, L + 1), np.inf)
        fwd[:, 0, 0] = 0.0
        fwd[:, 1, 0] = NEG
        return Prefix((), self.sizes, fwd, 0.0)

    def extend(self, node: Prefix, c: int) -> Prefix:
        """``node`` with class ``c`` for its next rank: the last rank's stage
        joins the forward DP (its transfer to ``c`` now known) and the bound
        is the least, over the first layer ``i`` of rank ``r`` (= ``len``),
        of each family's prefix part at ``i`` combined with the suffix
        minima of the classes left from ``(c, i)``; the max over families.
        ``+inf`` when no split fits."""
        r = len(node.classes)
        left = tuple(x - (k == c) for k, x in enumerate(node.left))
        fwd = node.fwd
        if r > 0:
            fwd = self._forward(node.classes[-1], r - 1, c, fwd)
        V = self.V[node.left][c]
        return Prefix(node.classes + (c,), left, fwd, self._bound(fwd, V))

    def _forward(self, c: int, s: int, c2: int, fwd: np.ndarray) -> np.ndarray:
        """The forward DP through stage ``s`` on class ``c`` (next class
        ``c2``): ``(R, 2, L+1)`` over the stage's end layer."""
        a, b = self._stage(c, s, c2)
        pa, pm = fwd[:, 0][:, :, None], fwd[:, 1][:, :, None]  # (R, L+1, 1) at the first layer
        cand = np.empty((2,) + a.shape)
        cand[0] = pa + a
        for kind, q in self._kind_rows:  # the rows of one kind at once (the same operations per row)
            if kind == "sum":
                cand[1, q] = cand[0, q]
            elif kind == "max":
                cand[1, q] = np.maximum(pm[q], b[q])
            elif kind == "prefix":
                cand[1, q] = np.maximum(pm[q], pa[q] + b[q])
            else:
                cand[1, q] = np.maximum(pm[q] + a[q], b[q])
        L = self.L
        out = np.full((2,) + fwd[:, 0].shape, np.inf)  # (2, R, L+1) over the end layer
        for d in range(1, self.W + 1):  # ranges [i, i + d) end at i + d
            np.minimum(out[:, :, d:], cand[:, :, :L + 1 - d, d - 1], out=out[:, :, d:])
        out = out.transpose(1, 0, 2).copy()
        out[~np.isfinite(out[:, 0])[:, None, :].repeat(2, axis=1)] = np.inf
        return out

    def _bound(self, fwd: np.ndarray, V: np.ndarray) -> float:
        """The max over families of the least over the boundary layer of the
        sum of their components, each the prefix part ``fwd`` joined with
        the suffix part ``V`` (both ``(R, 2, L+1)``)."""
        pa, pm, va, vm = fwd[:, 0], fwd[:, 1], V[:, 0], V[:, 1]
        comp = np.empty((len(pa) + 1,) + pa.shape[1:])  # a last row of zeros pads the shorter families
        comp[-1] = 0.0
        for kind, q in self._kind_rows:
            if kind == "sum":
                comp[q] = pa[q] + va[q]
            elif kind == "max":
                comp[q] = np.maximum(pm[q], vm[q])
            elif kind == "prefix":
                comp[q] = np.maximum(pm[q], pa[q] + vm[q])
            else:
                comp[q] = np.maximum(pm[q] + va[q], vm[q])
        # every family's components summed in its order at once (x + 0 = x: the padding adds nothing)
        rows = self._family_rows()
        total = comp[rows[:, 0]].copy()
        for k in range(1, rows.shape[1]):
            total += comp[rows[:, k]]
        feasible = np.isfinite(pa[0]) & np.isfinite(va[0])
        total[:, ~feasible] = np.inf
        least = total.min(axis=1)
        least = least[~np.isnan(least)]  # as max(best, nan) keeps best
        return max(NEG, float(least.max())) if len(least) else NEG

    def _family_rows(self) -> np.ndarray:
        """``(families, longest)``: each family's component rows in its order,
        padded with the zero row of :meth:`_bound` (index ``-1``)."""
        if self._fam_rows is None:
            longest = max((len(fam) for fam in self.fams), default=0)
            self._fam_rows = np.array([[self.row[n] for _, n in fam] + [-1] * (longest - len(fam))
                                       for fam in self.fams], dtype=np.int64).reshape(len(self.fams), longest)
        return self._fam_rows


def order_with(classes: Sequence[Sequence[int]], fixed: dict[int, int], pp: int) -> tuple[int, ...]:
    """An order of ``pp`` slots with rank ``k`` on class ``fixed[k]`` for the
    ranks given, the other ranks on the remaining slots in class order."""
    used = [0] * len(classes)
    seq: list[int | None] = [None] * pp
    for k in sorted(fixed):
        c = fixed[k]
        seq[k] = classes[c][used[c]]
        used[c] += 1
    rest = iter(x for c, members in enumerate(classes) for x in members[used[c]:])
    return tuple(x if x is not None else next(rest) for x in seq)


def covering_orders(classes: Sequence[Sequence[int]], pp: int) -> list[tuple[int, ...]]:
    """Orders that together put every class on every rank and every pair of
    classes (twice the same class where it has two slots) on ranks 0, 1:
    the donors of :func:`class_bounds`' terms. Deterministic."""
    C = len(classes)
    sizes = [len(c) for c in classes]
    need = {(s, c) for s in range(pp) for c in range(C)}
    orders = []
    while need:
        s0, c0 = min(need)
        fixed, count = {s0: c0}, [0] * C
        count[c0] = 1
        for s in range(pp):
            if s in fixed:
                continue
            for c in range(C):
                if (s, c) in need and count[c] < sizes[c] and sum(sizes) - sum(count) > 0:
                    fixed[s], count[c] = c, count[c] + 1
                    break
        order = order_with(classes, fixed, pp)
        orders.append(order)
        cls = class_of(classes)
        need -= {(s, cls[x]) for s, x in enumerate(order)}
    for c, c2 in itertools.product(range(C), range(C)):
        if c != c2 or sizes[c] > 1:
            orders.append(order_with(classes, {0: c, 1: c2}, pp))
    return orders


def class_of(classes: Sequence[Sequence[int]]) -> dict[int, int]:
    """Slot -> its class index."""
    return {x: c for c, members in enumerate(classes) for x in members}


def class_bounds(classes: Sequence[Sequence[int]], costs_of: Callable[[tuple[int, ...]], PipelineCosts],
                 schedule: str, pp: int, cutoff_s: float = np.inf, only: Sequence[str] | None = None,
                 relax_links: bool = False) -> ClassBounds:
    """The :class:`ClassBounds` of a point from the cost terms of a few
    orders (:func:`covering_orders`): stage ``s``'s terms on class ``c``
    from an order with a slot of ``c`` on rank ``s``, the transfer between
    two classes from an order with them on ranks 0 and 1 (a link depends
    only on the two slots' nodes and groups)."""
    cls = class_of(classes)
    C = len(classes)
    donors = [(o, costs_of(o)) for o in covering_orders(classes, pp)]
    class_costs = [[None] * pp for _ in range(C)]
    pair = {}
    for order, costs in donors:
        for s, x in enumerate(order):
            if class_costs[cls[x]][s] is None:
                class_costs[cls[x]][s] = costs
        pair.setdefault((cls[order[0]], cls[order[1]]), costs)
    L = donors[0][1].num_layers
    j = np.arange(L + 1)

    def send(c, c2):
        return np.asarray(pair[c, c2].send_s(0, np.maximum(j, 1)), dtype=float)

    return ClassBounds(class_costs, send, [len(c) for c in classes], schedule, pp, cutoff_s, only, relax_links)


def rank_covering_orders(classes: Sequence[Sequence[int]], pp: int) -> list[tuple[int, ...]]:
    """Orders that together put every class on every rank (the first part
    of :func:`covering_orders`, without its pairs on ranks 0, 1). Deterministic."""
    cls = class_of(classes)
    need = {(s, c) for s in range(pp) for c in range(len(classes))}
    orders = []
    while need:
        s0, c0 = min(need)
        fixed, count = {s0: c0}, [0] * len(classes)
        count[c0] = 1
        for s in range(pp):
            if s in fixed:
                continue
            for c in range(len(classes)):
                if (s, c) in need and count[c] < len(classes[c]):
                    fixed[s], count[c] = c, count[c] + 1
                    break
        order = order_with(classes, fixed, pp)
        orders.append(order)
        need -= {(s, cls[x]) for s, x in enumerate(order)}
    return orders


@dataclass(frozen=True)
class RankCapacity:
    """What a rank of each class can hold, per rank position
    (:func:`rank_capacity_tables`).

    Attributes:
        cap: ``(C, pp)`` seconds, the sum over the rank's ``vp`` stages ``r,
            r + pp, ...`` of the largest profiled-device work of one
            micro-batch (forward + backward, ``compute_prefix_s``) of a layer
            range that fits the stage's memory (``PipelineCosts.fits``) and
            leaves a layer to every other stage; ``-inf`` where no range fits
            (no order puts class ``c`` on rank ``r``).
        floor: ``(C, pp)`` the same sum of the least such work (every stage
            holds at least one layer); ``inf`` where none fits.
        scale: ``(C,)`` the ``time_scale`` of a slot of each class.
        work_s: ``W``, the model's work of one micro-batch (seconds).
        works: per class, per stage ``(C, pp * vp)``: the sorted distinct
            works of the ranges that fit (the integral choices).
    """

    cap: np.ndarray
    floor: np.ndarray
    scale: np.ndarray
    work_s: float
    works: tuple


def stage_fit_masks(costs: PipelineCosts, stages: Sequence[int], S: int, ii: np.ndarray, jj: np.ndarray,
                    first_at_zero: bool = False) -> list[np.ndarray]:
    """Per stage ``s`` of ``stages`` (of ``S``), the ranges ``[i, j)`` it can
    have that fit its devices (:meth:`PipelineCosts.fits`): ``(L+1, L+1)``
    bool over the grids ``ii``, ``jj`` (start, end); a stage starts at a
    layer in ``[s, L - S + s]`` (layer 0 for the first with
    ``first_at_zero``) and leaves a layer to every later stage, the last one
    ending at ``L``. Each start's longest fitting end is found by bisection
    for every stage at once (:func:`pipesearch.split_fits.fit_ends`: a
    stage's memory only grows with its range, so the ends that fit are
    those up to it), ``log L`` fit tests per start instead of one per
    range."""
    L = ii.shape[0] - 1
    starts = [np.arange(s, (0 if first_at_zero and s == 0 else L - S + s) + 1) for s in stages]
    last = [L if s == S - 1 else L - S + s + 1 for s in stages]
    counts = [len(x) for x in starts]
    ends = fit_ends(costs, np.repeat(stages, counts), np.concatenate(starts), np.repeat(last, counts))
    out = []
    for s, start, e in zip(stages, starts, np.split(ends, np.cumsum(counts)[:-1])):
        end = np.full(L + 1, -1)  # past every start outside the stage's: no range
        end[start] = e
        mask = (jj > ii) & (jj <= end[:, None])
        if s == S - 1:
            mask &= jj == L
        out.append(mask)
    return out


def rank_capacity_tables(classes: Sequence[Sequence[int]], costs_of: Callable[[tuple[int, ...]], PipelineCosts],
                         pp: int, vp: int = 1) -> RankCapacity | None:
    """The :class:`RankCapacity` of a point from the cost terms of the
    orders of :func:`rank_covering_orders` (stage ``s`` on class ``c`` from
    an order with a slot of ``c`` on rank ``s % pp``). None when the
    point's stages have per-stage memory options (their work is not one
    table)."""
    cls = class_of(classes)
    C, S = len(classes), pp * vp
    works: list[list] = [[np.zeros(0)] * S for _ in range(C)]
    scale = np.zeros(C)
    seen = np.zeros((C, S), dtype=bool)
    work_total = None
    for order in rank_covering_orders(classes, pp):
        costs = costs_of(order)
        if costs.options is not None or costs.pp != S:
            return None
        if work_total is None:
            L = costs.num_layers
            ii, jj = np.meshgrid(np.arange(L + 1), np.arange(L + 1), indexing="ij")
            prefix = np.asarray(costs.compute_prefix_s, dtype=float)
            work = prefix[jj] - prefix[ii]
            work_total = float(prefix[-1] - prefix[0])
        todo = [s for s in range(S) if not seen[cls[order[s % pp]], s]]
        for s in todo:
            seen[cls[order[s % pp]], s] = True
            scale[cls[order[s % pp]]] = float(costs.time_scale[s])
        # stage s starts at a layer in [s, L - S + s] (layer 0 for the first) and leaves a layer to each later stage
        fitting = stage_fit_masks(costs, todo, S, ii, jj, first_at_zero=True)
        for s, mask in zip(todo, fitting):
            works[cls[order[s % pp]]][s] = np.unique(work[mask])
    best = np.array([[w[-1] if len(w) else -np.inf for w in row] for row in works]).reshape(C, vp, pp)
    least = np.array([[w[0] if len(w) else np.inf for w in row] for row in works]).reshape(C, vp, pp)
    return RankCapacity(cap=best.sum(axis=1), floor=least.sum(axis=1), scale=scale, work_s=work_total,
                        works=tuple(tuple(row) for row in works))


def _integral_capacity(tables: RankCapacity, T: float, m: int, sends_s: np.ndarray) -> np.ndarray:
    """``(C, pp)``: the most work a rank of class ``c`` at position ``r``
    can hold when it is busy at most ``T`` (``m scale_c w + sends_s[c, r]
    <= T``): each of its stages the largest fitting range work at most
    that, their sum capped there too; ``-inf`` where a stage has no such
    range."""
    C, pp = tables.cap.shape
    out = np.zeros((C, pp))
    for c in range(C):
        x = (T - sends_s[c]) / (m * tables.scale[c]) if tables.scale[c] > 0 else np.full(pp, np.inf)
        for s, w in enumerate(tables.works[c]):
            k = int(np.searchsorted(w, x[s % pp] * (1 + 1e-12), side="right"))
            out[c, s % pp] += w[k - 1] if k > 0 else -np.inf
        out[c] = np.minimum(out[c], x)
    return out


def blocking_send_floor_s(sigma: np.ndarray, pp: int, m: int) -> np.ndarray:
    """``(C, pp)`` seconds a rank of class ``c`` at position ``r`` spends in
    its own sends under blocking sends (1F1B, :func:`pipesearch.timemodel.send_overlap`
    false: each action whose consumer is on another rank lasts its compute
    plus the transfer): ``m`` forward sends to rank ``r + 1`` (``r < pp -
    1``) and ``m`` gradient sends to rank ``r - 1`` (``r > 0``, the same
    bytes over the same link as boundary ``r - 1``'s activation), each at
    least the least transfer from (or to) class ``c`` over every class and
    boundary layer (``sigma`` from :func:`link_send_minima`)."""
    out_min = np.min(sigma, axis=1)  # from c to any class
    in_min = np.min(sigma, axis=0)  # from any class to c
    r = np.arange(pp)
    return m * (np.where(r < pp - 1, out_min[:, None], 0.0) + np.where(r > 0, in_min[:, None], 0.0))


def _assignment_value(values: np.ndarray, sizes: Sequence[int]) -> float:
    """``max sum_r values[c_r, r]`` over class sequences ``c`` with at most
    ``sizes[c]`` ranks of class ``c`` (``values`` ``(C, pp)``, ``-inf``
    where a class cannot take a rank): a DP over the slots used per class,
    one numpy pass per rank."""
    C, pp = values.shape
    shape = tuple(int(z) + 1 for z in sizes)
    level = np.zeros(shape, dtype=int)
    for c in range(C):
        level = level + np.arange(shape[c]).reshape([-1 if k == c else 1 for k in range(C)])
    V = np.full(shape, -np.inf)
    V[(0,) * C] = 0.0
    for r in range(pp):
        new = np.full(shape, -np.inf)
        for c in range(C):
            if shape[c] < 2:
                continue
            src = [slice(None)] * C
            dst = [slice(None)] * C
            src[c], dst[c] = slice(0, shape[c] - 1), slice(1, shape[c])
            np.maximum(new[tuple(dst)], V[tuple(src)] + values[c, r], out=new[tuple(dst)])
        V = np.where(level == r + 1, new, -np.inf)
    return float(V.max())


def rank_capacity_bound_s(tables: RankCapacity, sizes: Sequence[int], m: int, cutoff_s: float = np.inf,
                          sends_s: np.ndarray | None = None) -> float:
    """A lower bound of the simulated time of every order and split of a
    point whose ranks each run all their stages' forward and backward
    actions of the ``m`` micro-batches one after another (every schedule of
    :mod:`pipesearch.schedules` with the point's stages on ranks; the
    all-reduce after them only adds): rank ``r`` on class ``c`` holds work
    ``floor[c, r] <= w_r <= cap[c, r]`` (:class:`RankCapacity`), is busy
    ``m scale_c w_r + sends_s[c, r] <= T`` (``sends_s``: seconds of its
    own blocking sends, :func:`blocking_send_floor_s`; default none), and
    the ranks' work adds up to ``W``.

    The value is the least ``T`` (bisection, a fixed count of steps) at
    which the relaxation that lets every slot of a class take the class's
    largest capacity and least floor over the ranks holds ``W`` (a
    top-``pp`` choice over the slots, work taken as divisible). When that is
    below ``cutoff_s``, the exact test at ``cutoff_s``: each rank's work a
    sum of its stages' fitting range works (:func:`_integral_capacity`),
    ranks assigned to classes by :func:`_assignment_value`; if even there
    no order holds ``W``, every order and split is slower than ``cutoff_s``
    and the bound returned is ``cutoff_s``. ``inf`` when no order's ranks
    can hold the model at all (no split fits). ``W`` is taken ``1e-9``
    smaller (the ranks' works are summed in another order than the layer
    prefix: a rounding margin, on the safe side). Seconds."""
    cap, floor, scale, work_s = tables.cap, tables.floor, tables.scale, tables.work_s
    C, pp = cap.shape
    sends_s = np.zeros((C, pp)) if sends_s is None else np.asarray(sends_s, dtype=float)
    safe = np.where(scale > 0, scale, np.inf)
    slot_cap = np.repeat(cap.max(axis=1), sizes)
    slot_sends_s = np.repeat(sends_s.min(axis=1), sizes)
    # the least busy time a slot can have
    slot_floor_s = np.repeat((m * safe[:, None] * floor + sends_s).min(axis=1), sizes)
    slot_rate = np.repeat(1.0 / (m * safe), sizes)

    def relaxed(T: float) -> float:
        held = np.where(slot_floor_s <= T, np.minimum((T - slot_sends_s) * slot_rate, slot_cap), -np.inf)
        return float(np.sort(held)[::-1][:pp].sum())

    need = work_s * (1 - 1e-9)  # sums in another order than the prefix's: a rounding margin
    if _assignment_value(np.where(np.isfinite(floor), cap, -np.inf), sizes) < need:
        return np.inf
    lo, hi = 0.0, 1.0
    while relaxed(hi) < need:
        hi *= 2.0
    for _ in range(60):  # a fixed count: the same bound on any machine
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if relaxed(mid) < need else (lo, mid)
    bound = lo
    if bound < cutoff_s < np.inf:
        values = np.where(m * safe[:, None] * floor + sends_s <= cutoff_s,
                          _integral_capacity(tables, cutoff_s, m, sends_s), -np.inf)
        if _assignment_value(values, sizes) < need:
            bound = cutoff_s
    return float(bound)


def link_send_minima(classes: Sequence[Sequence[int]], costs_of: Callable[[tuple[int, ...]], PipelineCosts],
                     pp: int) -> np.ndarray:
    """``(C, C)`` seconds: the least time of one transfer over a boundary
    from a stage on class ``c`` to the next on class ``c2``, over every
    boundary layer ``1 .. L-1`` (``PipelineCosts.send_s`` of stage 0 of an
    order with ``c`` on rank 0 and ``c2`` on rank 1; a link depends only on
    the two slots' nodes and groups); ``inf`` for ``c == c2`` when the
    class has one slot."""
    C = len(classes)
    out = np.full((C, C), np.inf)
    for c, c2 in itertools.product(range(C), range(C)):
        if c != c2 or len(classes[c]) > 1:
            costs = costs_of(order_with(classes, {0: c, 1: c2}, pp))
            j = np.arange(1, costs.num_layers)
            if len(j):
                out[c, c2] = float(np.min(costs.send_s(0, j)))
    return out


def link_bound_s(sigma: np.ndarray, sizes: Sequence[int], pp: int, vp: int, m: int) -> float:
    """A lower bound of the simulated time of every order and split under
    overlapped sends (:func:`pipesearch.timemodel.send_overlap`: each
    directed link between two ranks is one chain of transfers in the time
    model's graph): the link from rank ``r`` to ``r + 1`` (``r < pp - 1``)
    carries the ``m`` forward transfers of each of its ``vp`` boundaries
    ``r, r + pp, ...`` one after another, so ``T >= m vp sigma[c_r,
    c_{r+1}]`` (``sigma`` from :func:`link_send_minima`). The bound is
    ``m vp`` times the least, over every class sequence of ``pp`` ranks with
    at most ``sizes[c]`` of class ``c``, of the largest ``sigma`` between
    consecutive ranks (a bottleneck path: the least threshold whose allowed
    pairs admit a sequence, by a DP over (slots used per class, last
    class)). Seconds; 0 for ``pp < 2``."""
    if pp < 2:
        return 0.0
    for tau in np.unique(sigma[np.isfinite(sigma)]):
        allowed = sigma <= tau
        if _admits_sequence(tuple(map(tuple, allowed.tolist())), tuple(int(z) for z in sizes), pp):
            return float(m * vp * tau)
    return np.inf


@lru_cache(maxsize=1024)
def _admits_sequence(allowed: tuple, sizes: tuple, pp: int) -> bool:
    """Whether some sequence of ``pp`` classes, at most ``sizes[c]`` of
    class ``c``, has every consecutive pair ``(c, c2)`` with
    ``allowed[c][c2]``: a DP over (slots used per class, last class). Kept
    per pattern (the points of one cluster meet the same few)."""
    C = len(sizes)
    states = {(tuple(int(k == c) for k in range(C)), c) for c in range(C) if sizes[c] > 0}
    for _ in range(pp - 1):
        states = {(tuple(x + (k == c2) for k, x in enumerate(n)), c2) for n, c in states
                  for c2 in range(C) if allowed[c][c2] and n[c2] < sizes[c2]}
    return bool(states)
