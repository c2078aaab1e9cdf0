"""Suffix minima of the bound families over every split of the layers left, per stage and start."""

from __future__ import annotations


import numpy as np

from .costs import PipelineCosts
from .split_bounds import MAX_CHAIN_FAMILIES, TERM_KINDS, bound_families, path_rows, round_trip_pairs
from .timemodel import PATH_TERMS


#: schedules whose cutoff proof first tables their own closed form's families alone
#: (:func:`pipesearch.split_bounds.bound_families` ``own_only``); on the default plan and GPT-3 175B at
#: 1,024 and 16,384 GPUs they excluded every one of the 414 points the root
#: bound of all families excludes (the other points need the full tables anyway)
OWN_FAMILY_SCHEDULES = ("gpipe", "1f1b", "zb-h1")


#: floats the band tables of one block of stages may hold; longer models are
#: tabled block by block and their terms recomputed per node (memory stays
#: linear in layers x band width)
TABLE_FLOATS = 2**23


_ROWS_PER_STAGE = 32  # an upper bound on the stacked components of a stage


_COLUMN_CHUNK = 16  # starts of one stage whose terms are recomputed together (kept up to TABLE_FLOATS floats)


class SuffixTables:
    """Band tables of the bound components and their suffix minima, per kind
    of component (all components of one kind are stacked on a leading axis).

    ``fam[K]`` holds the family of each component of kind ``K``. A stage's
    terms (:meth:`column`) are ``alpha[K]``, ``beta[K]`` of shape ``(Q_K,
    W)`` (row ``d - 1``: the stage ``[i, i + d)``) and whether that stage
    fits in memory. The suffix minima (:meth:`suffix_min`) bound each
    component over every split of ``[i, L)`` into stages ``s .. S-1``, shape
    ``(Q_K, L+1)``: ``sum``: min sum; ``max``: min max; ``prefix``: ``min
    max_k (sum_{s<=k'<k} alpha + beta_k)``; ``suffix``: the pair ``(min sum
    alpha, min max_k (beta_k + sum_{k'>k} alpha))``; ``device``: min sum
    beta.

    Only the ranges a split can hold are tabled: stage ``s`` from the layers
    ``max(s, L - (S - s) W) .. min(s W, L - S + s)`` (``_start``, ``_stop``),
    stages of at most ``W = min(width, L - S + 1)`` layers, the first stage
    only from layer 0 and the last one only up to layer ``L`` (one range per
    start); with ``limit_s`` (only splits faster than it matter, ``W`` its
    :func:`width_for`) also only from the layers whose compute before them
    the ``s`` stages before can hold and whose compute after them the rest
    can (each at most :func:`_span_s`: ``c(i) <= s span`` and ``c(L) -
    c(i) <= (S - s) span``, ``c`` the compute prefix), which on layers of
    unequal times is narrower than counting ``W`` layers per stage; the
    minima from other layers are infinite. Within a block of
    stages the band is cut to the longest range that fits in memory
    (longer ones are +inf). The components are stacked by how the backward
    DP combines them (:meth:`_block`): ``add`` (``sum`` alpha, ``device``
    beta, ``suffix`` alpha: min-sum), ``mx`` (``max`` and ``prefix`` beta:
    min-max, with the ``prefix`` alpha in ``mxa``) and ``sfx`` (``suffix``
    beta). The stages are tabled in blocks of at most
    :data:`TABLE_FLOATS` floats, laid out ``(Q, stage, start, length)``, so
    that stage ``s``'s DP step reads the minima of stage ``s + 1`` at ``i +
    d`` as a sliding window (no gather) and takes one minimum over the
    contiguous last axis per component. Memory is ``O(Q S L)`` for the
    minima plus one block. The terms of the stages are kept for
    :meth:`column` when they fit in one block (those of the last stage
    always), else recomputed there.
    """

    def __init__(self, costs: PipelineCosts, schedule: str, pp: int, width: int, weights=None, chains: bool = False,
                 paths=(), own_only: bool = False, limit_s: float = np.inf):
        L, S = costs.num_layers, costs.pp
        self.costs, self.schedule, self.pp, self.own_only, self.limit_s = costs, schedule, pp, own_only, limit_s
        self.width = max(1, min(width, L))
        # no stage of a split is longer than L - S + 1 (every other stage has a layer)
        self.rows = W = max(1, min(self.width, L - S + 1))
        self._kept: dict = {}
        self._columns: dict = {}
        self._held = 0  # floats in _columns
        self._suf = [None] * (S + 1)
        self.weights, self.chains, self.paths = weights, chains, paths
        # stage s from every layer it can start at in a split of stages of at
        # most W layers: from max(s, L - (S - s) W) (the later stages cover
        # the rest) to min(s W, L - S + s) (every other stage holds a layer);
        # the suffix minima from other layers are infinite
        st = np.arange(S)
        self._start = np.maximum(st, L - (S - st) * W)
        self._stop = np.minimum(st * W, L - S + st)
        if np.isfinite(limit_s):  # and the compute the stages before and after can hold
            cp, span = costs.compute_prefix_s, _span_s(costs, limit_s)
            self._start = np.maximum(self._start, np.searchsorted(cp, cp[-1] - (S - st) * span, "left"))
            self._stop = np.minimum(self._stop, np.searchsorted(cp, st * span, "right") - 1)
        rows = _ROWS_PER_STAGE + (MAX_CHAIN_FAMILIES + 1 + path_rows(paths) if chains else 0) + (
            0 if own_only else len(round_trip_pairs(costs, schedule, pp)))
        if self._block_size(rows, S) >= S:  # every stage in one block (the first from layer 0, the last to L)
            self._stages(0, S, keep=True)
            return
        block = self._block_size(rows)
        self._last_stage()  # several blocks: the last stage's one range per start on its own, kept
        for hi in range(S - 1, 1, -block):
            self._stages(max(1, hi - block), hi, keep=block >= S - 2)
        self._stages(0, 1, keep=True)  # one start: layer 0

    def _block_size(self, rows: int, upto: int | None = None) -> int:
        """Stages per block: ``rows`` stacked components of the band of each
        within :data:`TABLE_FLOATS` floats (at least one stage), the band
        as wide as the most starts of stages ``1 .. upto - 1`` (default: the
        middle stages)."""
        upto = self.costs.pp - 1 if upto is None else upto
        U = int(max(1, np.max(self._stop[1:upto] - self._start[1:upto] + 1, initial=1)))
        return max(1, TABLE_FLOATS // (rows * self.rows * U))

    def with_chains(self, weights, paths=()) -> "SuffixTables":
        """``SuffixTables(costs, schedule, pp, width, weights, chains=True, paths)`` of
        this table's point and width, equal to it entry for entry, built
        from this table (without chains): the families it has come first
        and each component's DP row is independent of the others, so only
        the added ``sum`` rows (the chain families and the combined one of
        ``weights``) are tabled for the middle stages; the first and the
        last stage (one range per start) are tabled whole. Built from
        scratch when this table has chains or weights already or keeps its
        middle terms."""
        costs, S = self.costs, self.costs.pp
        new = SuffixTables.__new__(SuffixTables)
        # (and when a path family adds a row other than a sum: :meth:`_added_rows` tables sums only)
        if self.chains or self.weights is not None or self.own_only or S <= 2 or any(
                where == "banded" and 0 < k < S - 1 for k, (where, *_) in self._kept.items()) or any(
                len(coef) > len(PATH_TERMS) for coef in paths):
            new.__init__(costs, self.schedule, self.pp, self.width, weights, chains=True, paths=paths,
                         limit_s=self.limit_s)
            return new
        new.costs, new.schedule, new.pp, new.width, new.rows = costs, self.schedule, self.pp, self.width, self.rows
        new.own_only, new.limit_s = False, self.limit_s
        new.weights, new.chains, new.paths = weights, True, paths
        new._kept, new._columns, new._held, new._suf = {}, {}, 0, [None] * (S + 1)
        new._start, new._stop = self._start, self._stop
        new._last_stage()
        block = new._block_size(MAX_CHAIN_FAMILIES + 1 + path_rows(paths))
        for hi in range(S - 1, 1, -block):
            new._added_rows(max(1, hi - block), hi, self)
        new._stages(0, 1, keep=True)
        return new

    def _band(self, lo: int, hi: int):
        """The band of stages ``lo .. hi-1``: ``(stages, i, j, ok, first)``
        with ``i`` ``(n, U, 1)`` the starts from each stage's first
        (``first``; clipped below ``L``), ``j`` ``(n, U, Wb)`` the ends and
        ``ok`` whether each range ends by ``L``, starts by the stage's last
        start (``_stop``) and fits in memory; ``Wb`` the longest length that
        is ``ok`` somewhere (longer ones are +inf everywhere)."""
        L, W = self.costs.num_layers, self.rows
        first, stop = self._start[lo:hi], self._stop[lo:hi]
        U = int(max(1, np.max(stop - first) + 1))
        stages = np.arange(lo, hi)[:, None, None]
        at = first[:, None, None] + np.arange(U)[None, :, None]  # (n, U, 1)
        i = np.minimum(at, L - 1)  # past a stage's last start: masked
        j = i + np.arange(1, W + 1)  # (n, U, W)
        ok = (j <= L) & (at <= stop[:, None, None])
        if hi == self.costs.pp:  # the last stage ends at L
            ok[-1] &= j[-1] == L
        ok = ok & self.costs.fits(stages, i, np.minimum(j, L))
        rows = np.flatnonzero(ok.any(axis=(0, 1)))
        Wb = int(rows[-1]) + 1 if len(rows) else 1
        return stages, i, j[..., :Wb], ok[..., :Wb], first

    def _added_rows(self, lo: int, hi: int, cheap: "SuffixTables") -> None:
        """Stages ``lo .. hi-1`` of :meth:`with_chains`: the DP of the ``sum``
        rows past those of ``cheap`` (same point and width), every other row
        of the minima taken from ``cheap``."""
        stages, i, j, ok, first = self._band(lo, hi)
        L = self.costs.num_layers
        fams = bound_families(self.costs, self.schedule, self.pp, stages, i, np.minimum(j, L), self.weights, True,
                              paths=self.paths)
        n0 = cheap._sizes["sum"]
        sums = [a for fam in fams for kind, a, _ in fam if kind == "sum"][n0:]
        t = self._stack(sums, np.inf, ok)
        U, Wb = t.shape[2:]
        buf = np.empty((len(t), U, Wb))
        for s in range(hi - 1, lo - 1, -1):
            k, at = s - lo, int(first[s - lo])
            np.add(t[:, k], self._window(self._suf[s + 1]["add"][n0:n0 + len(t)], at, U, Wb), out=buf)
            c = cheap._suf[s]
            self._suf[s] = {"add": np.concatenate([c["add"][:n0], self._placed(buf.min(axis=2), at), c["add"][n0:]]),
                            "mx": c["mx"], "sfx": c["sfx"]}

    def _window(self, v: np.ndarray, at: int, U: int, Wb: int) -> np.ndarray:
        """``v[:, at + u + d]`` for ``u < U``, ``d = 1 .. Wb`` (``v``: a row of
        suffix minima, ``(Q, L + rows + 2)``, +inf past ``L``, :meth:`_row`): a
        ``(Q, U, Wb)`` sliding-window view of ``v`` (of a copy padded with
        more +inf when a window reaches past it)."""
        if at + U + Wb >= v.shape[1]:
            pad = np.full((len(v), at + U + Wb + 1), np.inf)
            pad[:, :v.shape[1]] = v
            v = pad
        if not v.flags.c_contiguous:
            v = np.ascontiguousarray(v)
        step = v.strides[1]  # [q, u, d] -> v[q, at + 1 + u + d]: a view made by the array constructor (C)
        out = np.ndarray((len(v), U, Wb), dtype=v.dtype, buffer=v, offset=(at + 1) * step,
                         strides=(v.strides[0], step, step))
        out.flags.writeable = False
        return out

    def _row(self, q: int) -> np.ndarray:
        """A ``(q, L + rows + 2)`` row of suffix minima, all +inf: columns
        ``0 .. L`` are starts, the rest padding that lets :meth:`_window` read
        every window as a view."""
        return np.full((q, self.costs.num_layers + self.rows + 2), np.inf)

    @staticmethod
    def _stack(xs, fill: float, ok: np.ndarray) -> np.ndarray:
        """The arrays ``xs`` (each broadcast to ``ok``'s shape) stacked on a
        leading axis, ``fill`` where not ``ok``."""
        out = np.empty((len(xs),) + ok.shape)
        if fill == np.inf and len(xs):  # one pass per row: fmax(x, -inf) = x, fmax(x, +inf) = +inf (exact)
            floor = np.where(ok, -np.inf, np.inf)
            for row, x in zip(out, xs):
                np.fmax(x, floor, out=row)
            return out
        for row, x in zip(out, xs):
            row[...] = x
        np.copyto(out, fill, where=~ok)
        return out

    def _last_stage(self) -> None:
        """The last stage from each start it can have to layer ``L`` (one
        range per start), and its suffix minima: its own terms (every layer
        is then placed). For tables of several blocks (:meth:`_stages` tables
        it in the band of the others when all fit in one: fewer numpy
        passes, but a band of its masked lengths, which on 1,000 layers x 64
        stages, kept, held 35 MiB more)."""
        L, S, W = self.costs.num_layers, self.costs.pp, self.rows
        s, first, stop = S - 1, int(self._start[S - 1]), int(self._stop[S - 1])
        i = np.arange(first, max(first, stop) + 1)  # (one masked start when none is possible)
        j = np.full_like(i, L)
        ok = (i >= first) & (i <= stop) & (j - i <= W) & (j > i)
        ok = ok & np.broadcast_to(self.costs.fits(np.array(s), i, j), ok.shape)
        groups, ok = self._block(np.array(s), i, j, ok)
        self._kept[s] = ("last", int(i[0]), groups, ok)
        self._end_row(groups)
        nxt, g, nmax = self._suf[S], groups, self._sizes["max"]
        h_add, h_mx, h_sfx = nxt["add"][:, L:L + 1], nxt["mx"][:, L:L + 1], nxt["sfx"][:, L:L + 1]
        na0, ns = self._rows["suffix"][1], self._sizes["suffix"]
        mx = np.concatenate([np.maximum(g["mx"][:nmax], h_mx[:nmax]),
                             np.maximum(g["mx"][nmax:], g["mxa"] + h_mx[nmax:])])
        self._suf[s] = {kind: self._placed(v, int(i[0])) for kind, v in
                        (("add", g["add"] + h_add), ("mx", mx),
                         ("sfx", np.maximum(g["sfx"] + h_add[na0:na0 + ns], h_sfx)))}

    def _end_row(self, groups) -> None:
        """The minima past the last stage: every layer placed, 0 for the sums
        and -inf for the maxima at ``L`` (+inf elsewhere)."""
        self._suf[self.costs.pp] = {kind: self._placed(np.full((len(groups[kind]), 1), value), self.costs.num_layers)
                                    for kind, value in (("add", 0.0), ("mx", -np.inf), ("sfx", -np.inf))}

    def _placed(self, v: np.ndarray, at: int) -> np.ndarray:
        """``v`` (``(Q, U)``: starts ``at .. at + U - 1``) in a row of +inf
        (:meth:`_row`; starts past ``L`` dropped)."""
        L = self.costs.num_layers
        out = self._row(len(v))
        n = max(0, min(v.shape[1], L + 1 - at))
        out[:, at:at + n] = v[:, :n]
        return out

    def _stages(self, lo: int, hi: int, keep: bool = True) -> None:
        """Table stages ``lo .. hi-1`` from each one's first possible start
        (``_start``) on, those past its last start (``_stop``) masked as not
        fitting, with every length up to the longest that fits (the last
        stage only the one that ends at ``L``), and their suffix minima
        (:meth:`_banded_minima`; with the last stage, from the row past it:
        0 for the sums and -inf for the maxima at ``L``, every layer
        placed); keep their terms for :meth:`column` when ``keep``. When
        every stage fits one block, the last stage is tabled in the band of
        the others, not on its own (:meth:`_last_stage`): on the default
        plan's own-family tables that saved about a tenth of their CPU
        time, though it tables more ranges (its masked ones)."""
        stages, i, j, ok, first = self._band(lo, hi)
        groups, ok = self._block(stages, i, j, ok)
        if keep:
            self._kept.update({k: ("banded", lo, groups, ok) for k in range(lo, hi)})
        if hi == self.costs.pp:
            self._end_row(groups)
        self._banded_minima(groups, ok, lo, hi, first)

    def _block(self, stages, i, j, ok=None):
        """Stacked terms of ``stages`` (int array broadcast against ``i``,
        ``j``) over the ranges ``[i, j)``: ``(groups, ok)`` with ``groups``
        the ``add``, ``mx``, ``mxa`` and ``sfx`` stacks (class docstring),
        each ``(Q,) + shape``, and ``ok`` whether the range is valid and fits
        (computed when None). Ranges that are not ``ok`` are +inf in every
        stack but ``mxa`` (0 there), so that each of their DP candidates is
        +inf (never nan: finite terms plus a suffix value in ``[-inf,
        inf]``)."""
        L = self.costs.num_layers
        jc = np.minimum(j, L)
        shape = np.broadcast_shapes(np.shape(stages), np.shape(i), np.shape(j))
        if ok is None:
            ok = (j <= L) & (j > i) & (j - i <= self.rows)
            ok = ok & self.costs.fits(stages, i, jc)
        ok = np.broadcast_to(ok, shape)
        fams = bound_families(self.costs, self.schedule, self.pp, stages, i, jc, self.weights, self.chains,
                              paths=self.paths, own_only=self.own_only)
        comps = {kind: [(f, a, x) for f, fam in enumerate(fams) for k, a, x in fam if k == kind] for kind in TERM_KINDS}
        self.fam = {kind: np.array([f for f, _, _ in c], dtype=np.int64) for kind, c in comps.items() if c}
        self.kinds, self.num_families = tuple(self.fam), len(fams)  # the same for every block
        self._sizes = sizes = {k: len(c) for k, c in comps.items()}
        na0 = sizes["sum"] + sizes["device"]
        self._rows = {"sum": ("add", 0, sizes["sum"]), "device": ("add", sizes["sum"], na0),
                      "suffix": ("add", na0, na0 + sizes["suffix"]),
                      "max": ("mx", 0, sizes["max"]), "prefix": ("mx", sizes["max"], sizes["max"] + sizes["prefix"])}

        def stack(xs, fill):
            return self._stack(xs, fill, ok)

        alphas = {k: [a for _, a, _ in c] for k, c in comps.items()}
        betas = {k: [x for _, _, x in c] for k, c in comps.items()}
        groups = {"add": stack(alphas["sum"] + betas["device"] + alphas["suffix"], np.inf),
                  "mx": stack(betas["max"] + betas["prefix"], np.inf),
                  "mxa": stack(alphas["prefix"], 0.0), "sfx": stack(betas["suffix"], np.inf)}
        return groups, ok

    def _views(self, groups, pick):
        """Per kind ``(alpha, beta)`` (None where the kind has none) of the
        stacks ``groups``, each indexed by ``pick`` after the component axis."""
        out = {}
        for kind in self.kinds:
            group, a, b = self._rows[kind]
            rows = groups[group][a:b][pick]
            alpha = {"sum": rows, "suffix": rows, "prefix": groups["mxa"][pick]}.get(kind)
            beta = None if kind == "sum" else groups["sfx"][pick] if kind == "suffix" else rows
            out[kind] = (alpha, beta)
        return out

    def column(self, s: int, i: int):
        """Stage ``s`` starting at layer ``i``, every length ``d = 1 .. W``:
        ``({kind: (alpha, beta)}, fits)`` with arrays ``(Q_K, W)`` and
        ``(W,)``; terms of the ranges that do not fit are arbitrary."""
        where, lo, groups, ok = self._kept.get(s, (None, 0, None, None))
        W = self.rows
        if where == "banded" and 0 <= i - self._start[s] < ok.shape[1]:
            k, u = s - lo, i - self._start[s]
            return self._padded(self._views(groups, (slice(None), k, u)), ok[k, u], W)
        if where == "last":  # the one length that ends at L
            d, u = self.costs.num_layers - i, i - lo
            fits = np.zeros(W, dtype=bool)
            cols = {kind: tuple(None if x is None else np.full((len(x), W), np.inf) for x in ab)
                    for kind, ab in self._views(groups, (slice(None), slice(0, 0))).items()}
            if 1 <= d <= W and 0 <= u < len(ok):
                fits[d - 1] = ok[u]
                for kind, ab in self._views(groups, (slice(None), u)).items():
                    for out, x in zip(cols[kind], ab):
                        if x is not None:
                            out[:, d - 1] = x
            return cols, fits
        key = (s, i // _COLUMN_CHUNK)  # the starts of one chunk in one pass (a node's children start close by)
        if key not in self._columns:
            if self._held > TABLE_FLOATS:
                self._columns.clear()
                self._held = 0
            L = self.costs.num_layers
            at = key[1] * _COLUMN_CHUNK + np.arange(_COLUMN_CHUNK)[:, None]
            start = np.minimum(at, L - 1)
            j = start + np.arange(1, W + 1)
            ok = (j <= L) & (at < L) & self.costs.fits(np.array(s), start, np.minimum(j, L))
            if s == self.costs.pp - 1:  # the last stage ends at L
                ok &= j == L
            self._columns[key] = self._block(np.array(s), start, j, ok)
            self._held += sum(g.size for g in self._columns[key][0].values())
        groups, ok = self._columns[key]
        u = i % _COLUMN_CHUNK
        return self._views(groups, (slice(None), u)), ok[u]

    @staticmethod
    def _padded(cols, ok, W: int):
        """Columns of a band cut to ``len(ok) <= W`` lengths, padded to ``W``
        (the longer ranges do not fit)."""
        if len(ok) == W:
            return cols, ok
        fits = np.zeros(W, dtype=bool)
        fits[:len(ok)] = ok
        out = {}
        for kind, ab in cols.items():
            out[kind] = tuple(None if x is None else np.concatenate(
                [x, np.full((len(x), W - len(ok)), np.inf)], axis=1) for x in ab)
        return out, fits

    def _banded_minima(self, groups, ok, lo: int, hi: int, first: np.ndarray) -> None:
        """The backward DP over stages ``hi - 1 .. lo`` of every component at
        once, from the minima of stage ``hi``: stage ``s`` from ``i = first +
        u`` takes, per component, the minimum over the lengths ``d`` of its
        term combined with the next stage's minimum at ``i + d`` (``add``:
        sum; ``mx``: ``max(beta, alpha + next)``; ``sfx``: ``max(beta + next
        add, next sfx)``), read as a sliding window over that row padded
        with +inf (``groups``: ``(Q, n, U, Wb)`` from :meth:`_stages`)."""
        _, _, U, Wb = groups["add"].shape
        nmax, ns = self._sizes["max"], self._sizes["suffix"]
        na0 = self._rows["suffix"][1]
        t_add, t_mx, a_mx, x_sfx = groups["add"], groups["mx"], groups["mxa"], groups["sfx"]
        buf = np.empty((max(len(t_add), len(t_mx), 1), U, Wb))
        # the rows of minima of these stages (:meth:`_row`), all +inf but the starts each stage writes
        width = self.costs.num_layers + self.rows + 2
        rows = {g: np.full((hi - lo, len(x), width), np.inf) for g, x in (("add", t_add), ("mx", t_mx), ("sfx", x_sfx))}
        for s in range(hi - 1, lo - 1, -1):
            k, at = s - lo, int(first[s - lo])
            nxt = self._suf[s + 1]
            h_add, h_mx, h_sfx = (self._window(nxt[g], at, U, Wb) for g in ("add", "mx", "sfx"))
            n = max(0, min(U, self.costs.num_layers + 1 - at))  # starts past L dropped (:meth:`_placed`)
            b = buf[:len(t_add)]
            np.add(t_add[:, k], h_add, out=b)
            rows["add"][k, :, at:at + n] = b.min(axis=2)[:, :n]
            b = buf[:len(t_mx)]
            np.maximum(t_mx[:nmax, k], h_mx[:nmax], out=b[:nmax])
            np.add(a_mx[:, k], h_mx[nmax:], out=b[nmax:])
            np.maximum(b[nmax:], t_mx[nmax:, k], out=b[nmax:])
            rows["mx"][k, :, at:at + n] = b.min(axis=2)[:, :n]
            b = buf[:ns]
            np.add(x_sfx[:, k], h_add[na0:na0 + ns], out=b)
            np.maximum(b, h_sfx, out=b)
            rows["sfx"][k, :, at:at + n] = b.min(axis=2)[:, :n]
            self._suf[s] = {g: v[k] for g, v in rows.items()}

    def suffix_min(self, kind: str, s: int):
        """The suffix minima of the components of ``kind`` from stage ``s``:
        ``(Q_K, L+1)``; for ``suffix`` the pair (min sum alpha, min max)."""
        group, a, b = self._rows[kind]
        n = self.costs.num_layers + 1
        if kind == "suffix":
            return self._suf[s]["add"][a:b, :n], self._suf[s]["sfx"][:, :n]
        return self._suf[s][group][a:b, :n]

    def root_bound(self) -> float:
        """The smallest lower bound of any split: each family's suffix minima
        from stage 0 at layer 0."""
        fam = np.zeros(self.num_families)
        for kind in self.kinds:
            v = self.suffix_min(kind, 0)
            v = v[1][:, 0] if kind == "suffix" else v[:, 0]
            if kind == "device":
                v = v / self.pp
            np.add.at(fam, self.fam[kind], v)
        return float(fam.max())


def width_for(costs: PipelineCosts, limit_s: float) -> int:
    """Longest stage (layers) whose ``m`` micro-batches of compute take at
    most ``limit_s`` on the fastest stage (no longer stage can be in a split
    faster than ``limit_s``: its rank does that work one micro-batch after
    another)."""
    L = costs.num_layers
    if not np.isfinite(limit_s):
        return L
    cp = costs.compute_prefix_s
    lo = np.searchsorted(cp, cp - _span_s(costs, limit_s), "left")
    return int(max(1, np.max(np.arange(L + 1) - lo)))


def _span_s(costs: PipelineCosts, limit_s: float) -> float:
    """The most compute (seconds of ``costs.compute_prefix_s``) one stage
    of a split faster than ``limit_s`` can hold: its rank runs the stage's
    ``m`` micro-batches one after another, at best on the fastest stage's
    device (with a relative margin of 1e-9 for rounding)."""
    return limit_s / (costs.num_micro_batches * max(float(np.min(costs.time_scale)), 1e-300)) * (1 + 1e-9) + 1e-15


#: floats the bound tables of one exact split may hold (1 GiB of float64);
#: above it the split is the best of the starting splits, reported with a
#: table-free lower bound and its gap (:func:`tables_fit`)
MAX_TABLED_FLOATS = 2**27


def tables_fit(costs: PipelineCosts, width: int) -> bool:
    """Whether the branch and bound's tables fit :data:`MAX_TABLED_FLOATS`:
    the suffix tables of the middle stages, ``(S - 2)`` of shape ``(width,
    L + 1)``, and the rank-counting bound's ``(L + 1, L + 1)``
    (:class:`pipesearch.rank_bounds.RankCount`). A count of the input, never of the machine."""
    L, S = costs.num_layers, costs.pp
    return max(S - 2, 0) * min(width, L) * (L + 1) + (L + 1) ** 2 <= MAX_TABLED_FLOATS
