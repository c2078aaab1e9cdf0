"""The branch and bound over the stages of a split: node expansion, lookahead and its progress checks."""

from __future__ import annotations

import bisect

import numpy as np

from .bound_tables import SuffixTables, TABLE_FLOATS
from .rank_bounds import RankCount
from .split_evaluator import SplitEvaluator


#: nodes after which the branch and bound estimates the nodes its tree has
#: left (:func:`remaining_nodes_estimate`) and stops, as at its node limit,
#: when that is more than HOPELESS_FACTOR times the limit: it could not end
#: within it (counts, never seconds). On the 34 catalog cases of
#: benchmarks/bench_rank1.py every search that ended had an estimate of at
#: most 3,553 here (resnet101 on 4x4-v100-10gbe, which ended at 1,461
#: nodes), and those of GPT-3 175B that ran to the limit 1.7e7 to 3e12
ESTIMATE_NODES = 300


HOPELESS_FACTOR = 10


#: ``(nodes, factor)``: after that many nodes the branch and bound also
#: stops when its tree, estimated from the share of it already searched
#: (:func:`searched_share`), holds more than ``factor`` times its node
#: limit. Measured at 100 to 2,000 nodes on the 34 cases of
#: benchmarks/bench_rank1.py (the stop rules disabled, limit 3,000): the 41
#: searches that ended had estimates of at most 34,650 at node 100,
#: 30,927 at node 300 (resnext101, which ended at 1,527 nodes) and 10,643
#: at node 1,000 (gnmt_large, at 2,539); of the 158 that ran to a limit,
#: 121 are stopped at node 100, 133 by node 300 with :data:`HOPELESS_FACTOR`
#: and 4 more at 1,000 (with HOPELESS_FACTOR alone 101): T5-11B's and
#: T5-3B's then, too.
#: GPT-3 1.3B's interleaved points on 16 A100s (8,000 to 34,000 all along)
#: are not told apart from searches that end by the factor alone
PROGRESS_CHECKS = ((100, 100), (300, 33), (1000, 16))


#: ``(nodes, factor)``: a progress check before those of
#: :data:`PROGRESS_CHECKS`, which stops the search only when some subtree is
#: already finished (a positive share searched: a depth-first search of 30
#: or more stages may not have met a leaf by node 30, which says nothing of
#: its size) and the estimate is above ``factor`` times the node limit.
#: Measured with every stop rule off (limit 3,000) on the 34 cases of
#: benchmarks/bench_rank1.py and GPT-3 175B at 16,384 GPUs: the searches
#: that ended had estimates of at most 18.8 times the limit at node 30
#: (gnmt_large, ended at 2,539 nodes; resnext101 18.5, at 1,394), and 131 of
#: the 167 that ran to their limit were above 30 times it (110 of them also
#: above :data:`PROGRESS_CHECKS`' 100 at node 100, where they stopped before)
EARLY_CHECK = (30, 30)


#: ``{nodes: factor}``: at that check (one of :data:`PROGRESS_CHECKS`) the
#: search also stops when the estimate is more than ``factor`` times its
#: node limit and has not fallen since the check before. Measured with
#: every stop rule off (limit 3,000) on the 34 cases of
#: benchmarks/bench_rank1.py, estimates at nodes 100, 300, 1,000: every
#: search that ended and reached node 1,000 had an estimate there of at
#: most 10,643, each of those above 2,000 lower than at node 300
#: (gnmt_large 18,020 -> 10,643, resnext101 18,730 -> 7,600); of those that
#: reached node 300, none had a rising estimate above 7,992 there
#: (densenet121: 6,791 -> 7,992, ended at 1,375 nodes; resnext101's 30,800
#: -> 18,730 and gnmt_large's 32,000 -> 18,020 fell). Of the searches that
#: ran to the limit, at node 300 (factor 3: 9,000) the four interleaved
#: ones of GPT-3 1.3B on 16 A100s (14,065-22,500 -> 17,269-25,871), three
#: of llama2-13b's, resnext101's and inception_v3's, one of T5-11B's; at
#: node 1,000 (factor 2) GPT-3 1.3B's two of 32 micro-batches (6,584 ->
#: 6,742), each of which ran on to the limit without a proof
RISING_CHECKS = {300: 3, 1000: 2}


#: nodes of one level of a look-ahead expansion (:class:`_Expander`), at
#: most; fewer where the children's rank-counting terms would pass
#: :data:`LOOKAHEAD_FLOATS` floats, or the node limit is near (counts; the
#: answer is the same for every width: wider levels cost fewer numpy passes
#: but bound more children the search never reaches. Replaying the split
#: searches of the default plan and GPT-3 175B at 1,024 and 16,384 GPUs under
#: callgrind, 32 ran 6-13% fewer instructions than 128, 8 and 16 more; in
#: CPU seconds, replaying those of GPT-3 1.3B on 16 GPUs, the default plan,
#: resnet50 on 4x4-v100-10gbe and GPT-3 175B on 1,024 GPUs, 64 took 15-17%,
#: 2%, 2% and 0-3% less than 32, 128 22%, 1%, 1% less and 5% more)
LOOKAHEAD_WIDTH = 64


LOOKAHEAD_FLOATS = 2**22


class _Kids:
    """The children of a batch of nodes of one stage (:meth:`_Expander.expand`).

    ``stage``: the stage the children end (they are nodes of stage ``stage +
    1``; leaves when it is the last one). ``j``, ``lb``: their ends and
    lower bounds (lists), the children of parent ``p`` at positions
    ``lo[p] .. hi[p] - 1`` in bound order (ties in end order), only those
    below the limit of the expansion. ``rows[pos]``: the column of child
    ``pos`` in ``acc`` (per kind the accumulated component values, the
    children on the last axis; ``count`` the rank-counting states on the
    first; ``device`` the parents' per-rank sums ``(N, Q, pp)`` with the
    children's own rank's sums in ``own`` ``(Q, T)``). ``child[pos]``: the
    ``(kids, parent index)`` of child ``pos``'s children once expanded.
    """

    __slots__ = ("stage", "j", "lb", "lo", "hi", "rows", "par", "acc", "own", "child")

    def __init__(self, stage, j, lb, lo, hi, rows, par, acc, own):
        self.stage, self.j, self.lb, self.lo, self.hi = stage, j, lb, lo, hi
        self.rows, self.par, self.acc, self.own, self.child = rows, par, acc, own, {}


class _Expander:
    """Node expansion of :func:`run_branch_and_bound`, vectorised over all the
    nodes of one stage that a look-ahead expands together.

    A node's children and their bounds depend only on the node and on the
    limit (the incumbent), which only falls. Children found under a limit
    are those below it, with the same bounds (the rank-counting bound is
    only skipped for children already excluded), so a list found under an
    earlier, higher limit and cut at the current one is the list a fresh
    expansion would give. :meth:`lookahead` therefore expands a node and,
    level by level, the first children in depth-first order (at most
    :attr:`width` per level and the node limit in all), each level one
    numpy pass; the depth-first search then takes each node's children from
    there, visiting the same nodes in the same order, with the same bounds
    (elementwise the same floating-point operations as one node at a time).
    """

    def __init__(self, tables: SuffixTables, counter: RankCount | None, S: int, L: int, pp: int):
        self.tables, self.counter, self.S, self.L, self.pp = tables, counter, S, L, pp
        self.nfam, self.kinds = tables.num_families, tables.kinds
        # per kind: the family of each component, and whether no family has two of them
        # (then a fancy-indexed add, in the same order as np.add.at, is exact)
        self.scatter = {kind: (idx, len(np.unique(idx)) == len(idx)) for kind, idx in tables.fam.items()}
        self.others_of = [np.delete(np.arange(pp), r) for r in range(pp)]
        self.width = max(1, min(LOOKAHEAD_WIDTH, LOOKAHEAD_FLOATS // (tables.rows * pp * (L + 1))))
        self._columns: dict = {}
        self._suffix: dict = {}
        self._held = 0
        self.layout = self._rows(tables.column(0, 0)[0])
        costs = tables.costs
        # several stages per device: each node carries its devices' bytes so far at every count state
        self.states = costs.chunk_states if costs.chunk_states is not None and S > pp else None

    def columns(self, s: int, starts: list[int]) -> list:
        """Per start ``i``: the children's ends ``j`` of a node at stage
        ``s`` from layer ``i`` (those that fit and leave a layer per later
        stage), per kind their terms and the suffix minima at ``j``, and the
        rank-counting terms of :meth:`pipesearch.rank_bounds.RankCount.step` (memoised per ``(s,
        i)``, the missing ones found together; at most :data:`pipesearch.bound_tables.TABLE_FLOATS`
        floats held, then dropped)."""
        have = {i: self._columns[s, i] for i in starts if (s, i) in self._columns}
        missing = [i for i in dict.fromkeys(starts) if i not in have]
        if missing:
            have.update(zip(missing, self._new_columns(s, missing)))
        return [have[i] for i in starts]

    def _new_columns(self, s: int, starts: list[int]) -> list:
        """The entries of :meth:`columns` for ``starts`` (none memoised yet):
        ``(j, block, count)``, ``block`` the children's terms of every kind
        and their suffix minima stacked as rows (:meth:`_rows` says which),
        ``count`` the ``(4, n)`` rank-counting terms or None."""
        tables, S, L, W = self.tables, self.S, self.L, self.tables.rows
        d = np.arange(1, W + 1)
        suf = self._suffix_rows(s + 1)
        out = []
        for i in starts:
            j = i + d
            keep = (j <= L - (S - 1 - s)) if s < S - 1 else (j == L)
            terms, fits = tables.column(s, i)
            keep &= fits
            rows, j = d[keep] - 1, j[keep]
            own = np.concatenate([t for kind in self.kinds for t in terms[kind] if t is not None])
            out.append([j, np.concatenate([own[:, rows], suf[:, j]]), None])
        if self.counter is not None and s < S - 1:  # every start's terms in one pass
            at = np.array(starts)[:, None]
            count = np.stack(self.counter.terms(s, at, np.minimum(at + d, L)), axis=1)  # (n, 4, W)
            for k, entry in enumerate(out):
                entry[2] = count[k][:, entry[0] - starts[k] - 1]
        for i, entry in zip(starts, out):
            if self._held > TABLE_FLOATS:
                self._columns.clear()
                self._held = 0
            self._held += entry[1].size
            self._columns[s, i] = tuple(entry)
        return [tuple(e) for e in out]

    def _suffix_rows(self, s: int) -> np.ndarray:
        """The suffix minima from stage ``s`` of every kind stacked as rows
        (``(R, L + 1)``, in the order of :meth:`_rows`; memoised per stage)."""
        if s not in self._suffix:
            parts = [self.tables.suffix_min(kind, s) for kind in self.kinds]
            self._suffix[s] = np.concatenate([x for p in parts for x in (p if isinstance(p, tuple) else (p,))])
        return self._suffix[s]

    def _rows(self, column) -> dict:
        """Per kind, the slices of a column block's rows (:meth:`_new_columns`)
        holding its alpha and beta (None where the kind has none), then its
        suffix minima (two for ``suffix``: the min sum and the min max)."""
        sizes = {kind: len(self.tables.fam[kind]) for kind in self.kinds}
        own = [(kind, k) for kind in self.kinds for k, t in enumerate(column[kind]) if t is not None]
        out, at = {kind: [None, None] for kind in self.kinds}, 0
        for kind, k in own:
            out[kind][k] = slice(at, at + sizes[kind])
            at += sizes[kind]
        for kind in self.kinds:
            for _ in range(2 if kind == "suffix" else 1):
                out[kind].append(slice(at, at + sizes[kind]))
                at += sizes[kind]
        return out

    def root(self) -> _Kids:
        """The root (no stage placed, every layer left) as the one child of
        stage ``-1``."""
        acc = {}
        for kind in self.kinds:
            q = len(self.tables.fam[kind])
            if kind == "prefix":
                acc[kind] = np.array([np.zeros((q, 1)), np.full((q, 1), -np.inf)])
            elif kind == "sum":
                acc[kind] = np.zeros((q, 1))
            elif kind != "device":
                acc[kind] = np.full((q, 1), -np.inf)
        if "device" in self.kinds:
            q = len(self.tables.fam["device"])
            acc["device"] = np.zeros((1, q, self.pp))
        if self.counter is not None:
            acc["count"] = self.counter.root[None].copy()
        if self.states is not None:
            acc["mem"] = np.zeros((1,) + self.states.shape[:2])
            acc["peak"] = np.zeros((1, self.states.shape[0]))
            acc["extra"] = np.zeros((1, self.states.shape[0]))
        own = np.zeros((len(self.tables.fam.get("device", ())), 1))
        return _Kids(-1, [0], [-np.inf], [0], [1], np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64), acc, own)

    def gather(self, kids: _Kids, pos: list[int]) -> dict:
        """The accumulated values of the children ``pos`` of ``kids`` (the
        nodes on the last axis; ``device`` and ``count`` on the first)."""
        cols = kids.rows[pos]
        out = {}
        for kind, val in kids.acc.items():
            if kind == "device":
                dev = val[kids.par[cols]]
                dev[:, :, kids.stage % self.pp] = kids.own[:, cols].T
                out[kind] = dev
            elif kind in ("count", "mem", "peak", "extra"):
                out[kind] = val[cols]
            else:
                out[kind] = val[..., cols]
        return out

    def lookahead(self, kids: _Kids, pos: int, limit: float, budget: int):
        """Expand child ``pos`` of ``kids`` with the children after it not
        yet expanded (the search visits them next), then, level by level,
        the first of the new children in depth-first order (at most
        :attr:`width` per level, ``budget`` nodes in all: the search pops at
        most that many more). A level of nodes with ``D`` more levels below
        takes at most ``budget / floor((D + 1) / 4)`` of them: the search
        reaches the next one only after the subtree of the one before, at
        least one node and at most a path of ``D + 1`` (replaying the split
        searches of GPT-3 175B at 1,024 and 16,384 GPUs, pipelines of up to
        96 stages whose searches stop after 99 nodes, 64 a level expanded
        up to eight nodes for each one visited; dividing by ``D + 1`` cost
        GPT-3 1.3B's 3,000-node searches of 8 stages 8%, a quarter of it
        nothing). Returns ``(kids, parent index)`` of child ``pos``'s
        children."""
        def wide(stage: int, budget: int) -> int:  # nodes of ``stage`` expanded together
            return max(1, min(self.width, budget // max(1, (self.S - stage) // 4)))

        ahead = range(pos, min(len(kids.j), pos + wide(kids.stage + 1, budget)))
        level, rows = kids, [r for r in ahead if r not in kids.child and kids.lb[r] < limit]
        while True:
            s = level.stage + 1
            out = self.expand(s, [level.j[r] for r in rows], self.gather(level, rows), limit)
            for p, r in enumerate(rows):
                level.child[r] = (out, p)
            n = min(len(out.j), wide(s + 1, budget), budget)
            if s >= self.S - 1 or n <= 0:  # its children are leaves, or the search stops first
                return kids.child[pos]
            level, rows, budget = out, list(range(n)), budget - n

    def expand(self, s: int, starts: list[int], acc: dict, limit: float) -> _Kids:
        """The children of the nodes of stage ``s`` starting at the layers
        ``starts`` with the accumulated values ``acc`` (:meth:`gather`), with
        their lower bounds: per family the fixed part plus the suffix minima
        of the rest, the largest over families, then (not the last stage)
        the rank-counting bound for those below ``limit``; only the children
        below ``limit``."""
        cols = self.columns(s, starts)
        N = len(cols)
        par = np.repeat(np.arange(N), [len(c[0]) for c in cols])
        T = len(par)

        def cat(xs):
            return xs[0] if N == 1 else np.concatenate(xs, axis=-1)

        if T == 0:
            return _Kids(s, [], [], [0] * N, [0] * N, par, par, {}, None)
        j, block = cat([c[0] for c in cols]), cat([c[1] for c in cols])
        fam_lb = np.zeros((self.nfam, T))
        new, own, rank = {}, None, s % self.pp
        for kind in self.kinds:
            a, x, *suf = (None if r is None else block[r] for r in self.layout[kind])
            if kind == "device":
                dev = acc[kind]  # (N, Q, pp)
                mine = dev[:, :, rank]
                own = mine.T[:, par] + x
                others = dev[:, :, self.others_of[rank]].max(axis=2, initial=-np.inf).T[:, par]
                rest = (dev.sum(axis=2) - mine).T[:, par]
                tot = np.maximum(np.maximum(own, others), (rest + own + suf[0]) / self.pp)
                new[kind] = dev
            else:
                v = acc[kind][..., par]
                if kind == "sum":
                    new[kind] = v + a
                    tot = new[kind] + suf[0]
                elif kind == "max":
                    new[kind] = np.maximum(v, x)
                    tot = np.maximum(new[kind], suf[0])
                elif kind == "prefix":
                    cm = np.maximum(v[1], v[0] + x)
                    ca = v[0] + a
                    tot = np.maximum(cm, ca + suf[0])
                    new[kind] = np.stack([ca, cm])
                else:  # suffix
                    new[kind] = np.maximum(v + a, x)
                    tot = np.maximum(new[kind] + suf[0], suf[1])
            idx, unique = self.scatter[kind]
            if unique:
                fam_lb[idx] += tot
            else:
                np.add.at(fam_lb, idx, tot)
        lb = fam_lb.max(axis=0)
        if self.states is not None:
            new["mem"], new["peak"], new["extra"] = self._device_bytes(
                s, np.asarray(starts)[par], j, acc["mem"][par], acc["peak"][par], acc["extra"][par], lb)
        if self.counter is not None and s < self.S - 1:  # only children that may still be expanded
            live = np.flatnonzero(lb < limit)
            states = np.zeros((T, 4, self.pp))
            if len(live):
                count = cat([c[2] for c in cols])[:, live]
                states[live] = self.counter.step(acc["count"][par[live]], s, *count)
                lb[live] = np.maximum(lb[live], self.counter.bound(states[live], s, j[live], limit))
            new["count"] = states
        order = np.lexsort((lb, par))  # per parent in bound order, ties in end order
        order = order[lb[order] < limit]  # the rest can never be expanded
        per_parent = np.bincount(par[order], minlength=N)
        hi = np.cumsum(per_parent)
        lo = hi - per_parent
        return _Kids(s, j[order].tolist(), lb[order].tolist(), lo.tolist(), hi.tolist(), order, par, new, own)


    def _device_bytes(self, s: int, i: np.ndarray, j: np.ndarray, before: np.ndarray, peak: np.ndarray,
                      extra: np.ndarray, lb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """With several stages per device: ``(T, R, Q)`` bytes each child's
        devices hold so far at each count state (``before``, the parents',
        a copy of them, updated in place), stage ``s`` on ``[i, j)`` added to
        its device (its training state, and the state's count of its chunk
        times one micro-batch's saved bytes), ``(T, R)`` the most
        one-at-a-time bytes of each device's stages so far (``extra``, the
        parents', a copy, in place; :meth:`PipelineCosts.peak_extra_at`),
        and ``(T, R)`` each device's peak over the states plus that
        (``peak``, the parents', a copy, in place:
        :meth:`PipelineCosts.device_memory_bytes` of the stages placed, the
        rest holding at least nothing; only the device of stage ``s``
        changes, so its row alone is reduced). A child
        whose device already exceeds its capacity at some state has no
        split that fits below it, nor one whose layers left need more
        training-state bytes than the devices have left together (each
        device ends at least at its peak so far plus the state of the layers
        it gets): its bound ``lb`` becomes +inf (in place)."""
        costs = self.tables.costs
        R = self.states.shape[0]
        r, c = s % R, s // R
        act = np.asarray(costs.saved_bytes(s, i, j), dtype=float)
        out = before
        out[:, r, :] += costs.resident_bytes(s, i, j)[:, None] + act[:, None] * self.states[r, :, c][None, :]
        extra[:, r] = np.maximum(extra[:, r], costs.peak_extra_at(s, i, j))
        peak[:, r] = out[:, r, :].max(axis=1) + extra[:, r]
        left = (costs.param_prefix_bytes[-1] - costs.param_prefix_bytes[j]) * costs.state_bytes_per_param_byte
        cap = costs.capacity_bytes[:R]
        lb[(peak[:, r] > cap[r]) | (peak.sum(axis=1) + left > cap.sum())] = np.inf
        return out, peak, extra


def run_branch_and_bound(tables: SuffixTables, ev: SplitEvaluator, S: int, L: int, pp: int, best: float, tie_rel: float,
                         max_splits: int, max_nodes: int, counter: RankCount | None = None):
    """Depth-first over stages, children in bound order (their bounds found
    level by level for many nodes at once, :class:`_Expander`); leaves are
    queued and evaluated in batches. Stops at ``max_nodes`` nodes, or at
    :data:`ESTIMATE_NODES` when the tree left is estimated at more than
    :data:`HOPELESS_FACTOR` times the limit
    (:func:`remaining_nodes_estimate`). Returns ``(exact, frontier_bound,
    nodes)``."""
    pending: list[tuple[float, tuple[int, ...]]] = []
    nodes = 0

    batch = ev.batch_size()

    def limit():
        # splits within the tie window of the best matter too: the tie-break (_chosen) sees every one
        return best * (1 + tie_rel)

    def flush():
        nonlocal best
        if not pending:
            return
        pending.sort()
        todo = [(lb, b) for lb, b in pending]
        pending.clear()
        step = ev.first_chunk()
        while todo:
            todo = [(lb, b) for lb, b in todo if lb < limit()]
            chunk, todo = todo[:step], todo[step:]
            if not chunk:
                break
            ev.run([b for _, b in chunk])
            best = min(best, min(ev.times[b] for _, b in chunk))
            step = min(2 * step, batch)

    expander = _Expander(tables, counter, S, L, pp)
    checks = {n: factor * max_nodes for n, factor in (EARLY_CHECK,) + PROGRESS_CHECKS if n < max_nodes}
    # where the search may stop (its stop rules' checks, its node limit): a look-ahead expands no node past the
    # next one, so that a search stopped there expanded none it does not visit (one of 64 stages of 64 nodes a
    # level reaches 4,096 nodes ahead)
    stops = sorted({*checks, max_nodes} | ({ESTIMATE_NODES} if ESTIMATE_NODES < max_nodes else set()))

    def ahead(nodes: int) -> int:
        return next((n for n in stops if n > nodes), max_nodes) - nodes

    kids, p = expander.lookahead(expander.root(), 0, limit(), ahead(0))
    # a frame: the node's boundaries, its children (kids, next position, end, first)
    stack = [[(0,), kids, kids.lo[p], kids.hi[p], kids.lo[p]]]
    hopeless = False  # the tree left is far larger than the node limit (ESTIMATE_NODES, PROGRESS_CHECKS)
    last_estimate = np.inf  # the tree's estimate at the last progress check passed (RISING_CHECKS)
    while stack:
        frame = stack[-1]
        prefix, kids, pos, end, _ = frame
        if pos >= end or kids.lb[pos] >= limit():
            stack.pop()  # children are sorted by bound: the rest is excluded too
            continue
        if hopeless or nodes >= max_nodes or ev.feasible + len(pending) >= max_splits:
            flush()
            live = [fr[1].lb[fr[2]] for fr in stack if fr[2] < fr[3] and fr[1].lb[fr[2]] < limit()]
            if live:
                return False, min(live), nodes
            return True, np.inf, nodes
        if nodes + 1 == ESTIMATE_NODES < max_nodes and remaining_nodes_estimate(
                [(fr[1].lb, fr[2] + (fr is frame), fr[3]) for fr in stack], limit()) > HOPELESS_FACTOR * max_nodes:
            hopeless = True  # stopped as at the node limit, before this child
            continue
        if nodes + 1 in checks:
            share = searched_share([(fr[1].lb, fr[4], fr[2], fr[3]) for fr in stack], limit())
            estimate = (nodes + 1) / share if share > 0 else np.inf
            rising = RISING_CHECKS.get(nodes + 1)
            informed = share > 0 or nodes + 1 != EARLY_CHECK[0]  # the early check needs a finished subtree
            if informed and (estimate > checks[nodes + 1] or (rising is not None and estimate >= last_estimate
                                                              and estimate > rising * max_nodes)):
                hopeless = True
                continue
            last_estimate = estimate
        frame[2] = pos + 1
        nodes += 1
        bounds = prefix + (kids.j[pos],)
        if len(bounds) == S + 1:
            pending.append((kids.lb[pos], bounds))
            if len(pending) >= batch:
                flush()
            continue
        sub, p = kids.child.get(pos) or expander.lookahead(kids, pos, limit(), ahead(nodes))
        stack.append([bounds, sub, sub.lo[p], sub.hi[p], sub.lo[p]])
    flush()
    return True, np.inf, nodes


def searched_share(frames, limit: float) -> float:
    """The share of a depth-first branch and bound's tree already searched,
    from its stack: ``frames`` root first, each ``(lb, first, pos, end)``
    with its children's bounds ``lb[first:end]`` in bound order, those below
    ``limit`` live, and ``pos`` the next to visit (the one before it is in
    progress in every frame but the last). Each live child of a frame
    stands for an equal share of that frame's share, so the share searched
    is the sum of the finished children's shares (the weighted estimate
    of Kilby, Slaney, Thiebaux and Walsh 2006, "Estimating search tree
    size", AAAI); ``nodes / share`` estimates the tree's size."""
    share, weight = 0.0, 1.0
    for k, (lb, first, pos, end) in enumerate(frames):
        live = bisect.bisect_left(lb, limit, first, end) - first
        if live <= 0:
            break
        weight /= live
        finished = pos - first - (k < len(frames) - 1)
        if finished >= live:  # the child in progress is excluded now (the limit fell): the frame is done
            return share + live * weight
        share += finished * weight
    return share


def remaining_nodes_estimate(frames, limit: float) -> float:
    """Nodes a depth-first branch and bound has left, estimated from its
    stack: ``frames`` root first, each ``(lb, pos, end)`` with its
    children's bounds ``lb[pos:end]`` not yet visited (in bound order), of
    which those below ``limit`` are live. Along the current path, as Knuth's
    estimator of a backtrack tree's size does with its random path (Knuth
    1975, Mathematics of Computation 29(129)): a live child of frame ``k``
    stands for a subtree of ``1 + b_{k+1} + b_{k+1} b_{k+2} + ...`` nodes,
    ``b_i`` the live children of the frames below it."""
    total, below = 0.0, 1.0
    for lb, pos, end in reversed(frames):
        live = bisect.bisect_left(lb, limit, pos, end) - pos
        total += live * below
        below = 1.0 + live * below
    return total
