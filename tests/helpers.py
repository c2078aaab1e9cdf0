"""Shared builders for the planner tests (imported as ``helpers``: pytest puts
``tests/`` on ``sys.path`` because it is not a package).

* :func:`make_costs` builds a :class:`pipesearch.costs.PipelineCosts` from
  plain per-layer lists, so a test can state a cost-model instance by hand.
* :func:`reference_iteration_time` recomputes the objective of a split from
  those plain lists with the formula of ``pipesearch/costs.py``'s docstring,
  without calling any method of ``PipelineCosts``.
* :func:`tiny_profile` / :func:`tiny_cluster` build a small ModelProfile and a
  homogeneous Cluster directly from the value types (no catalog, no files).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import signal
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipesearch.costs import PipelineCosts
from pipesearch.types import Cluster, DeviceGroup, DeviceSpec, HostSpec, Layer, Link, ModelProfile

REPO = Path(__file__).resolve().parent.parent
COST_MODELS = REPO / "cost_models"


def _in_flight_by_hand(schedule: str, pp: int, m: int) -> list[int]:
    """Micro-batches whose activations stage ``s`` holds at its peak, stated
    here rather than taken from the package: GPipe keeps all ``m`` (every
    forward runs before any backward, Huang et al. 2019); 1F1B's stage ``s``
    runs ``pp - s`` forwards before its first backward and then one forward
    per backward, so it holds ``min(m, pp - s)`` (Narayanan et al. ICML'21)."""
    if schedule == "gpipe":
        return [m] * pp
    if schedule == "1f1b":
        return [min(m, pp - s) for s in range(pp)]
    raise ValueError(f"no hand formula for {schedule!r}")


def _per_stage(value, pp: int, name: str) -> list[float]:
    """A scalar broadcast to ``pp`` stages, or a list of length ``pp``."""
    if np.ndim(value) == 0:
        return [float(value)] * pp
    value = [float(v) for v in value]
    assert len(value) == pp, f"{name}: {len(value)} values for {pp} stages"
    return value


@dataclass(frozen=True)
class CostSpec:
    """A cost-model instance as plain lists (all per micro-batch, at the
    micro-batch size). ``in_flight`` is a schedule name or one count per stage.
    ``link_*`` is the link after each stage (the last entry is unused);
    ``allreduce_*`` the all-reduce model of each stage's replicas."""

    times: tuple[float, ...]                     # fwd+bwd seconds per layer
    pp: int
    m: int
    params: tuple[float, ...] | None = None      # parameter bytes per layer
    saved: tuple[float, ...] | None = None       # saved activation bytes per layer
    outputs: tuple[float, ...] | None = None     # output bytes per layer
    fwd: tuple[float, ...] | None = None         # forward seconds (default: a third)
    capacity: object = math.inf                  # usable bytes (scalar or per stage)
    in_flight: object = "1f1b"
    time_scale: object = 1.0
    link_bandwidth: object = math.inf            # bytes/s
    link_latency: object = 0.0                   # seconds
    allreduce_per_byte: object = 0.0             # seconds per gradient byte
    allreduce_fixed: object = 0.0                # seconds
    state_bytes_per_param_byte: float = 4.0
    grad_bytes_per_param_byte: float = 1.0

    @property
    def num_layers(self) -> int:
        return len(self.times)

    def lists(self) -> dict:
        L, P = self.num_layers, self.pp
        zeros = [0.0] * L
        if isinstance(self.in_flight, str):
            inflight = _in_flight_by_hand(self.in_flight, P, self.m)
        else:
            inflight = [int(x) for x in self.in_flight]
        return dict(
            times=[float(x) for x in self.times],
            fwd=[float(x) for x in self.fwd] if self.fwd is not None else [t / 3 for t in self.times],
            params=[float(x) for x in self.params] if self.params is not None else zeros,
            saved=[float(x) for x in self.saved] if self.saved is not None else zeros,
            outputs=[float(x) for x in self.outputs] if self.outputs is not None else zeros,
            capacity=_per_stage(self.capacity, P, "capacity"),
            in_flight=inflight,
            scale=_per_stage(self.time_scale, P, "time_scale"),
            bw=_per_stage(self.link_bandwidth, P, "link_bandwidth"),
            lat=_per_stage(self.link_latency, P, "link_latency"),
            ar_b=_per_stage(self.allreduce_per_byte, P, "allreduce_per_byte"),
            ar_f=_per_stage(self.allreduce_fixed, P, "allreduce_fixed"),
        )

    def costs(self) -> PipelineCosts:
        return make_costs(self)


def _prefix(values) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(np.asarray(values, dtype=float))])


def make_costs(spec: CostSpec | None = None, /, **kwargs) -> PipelineCosts:
    """``PipelineCosts`` of a :class:`CostSpec` (or of ``CostSpec(**kwargs)``)."""
    if spec is None:
        spec = CostSpec(**kwargs)
    v = spec.lists()
    return PipelineCosts(
        num_micro_batches=spec.m,
        compute_prefix_s=_prefix(v["times"]),
        fwd_prefix_s=_prefix(v["fwd"]),
        param_prefix_bytes=_prefix(v["params"]),
        saved_prefix_bytes=_prefix(v["saved"]),
        output_bytes=np.asarray(v["outputs"], dtype=float),
        time_scale=np.asarray(v["scale"], dtype=float),
        p2p_bandwidth_bytes_per_s=np.asarray(v["bw"], dtype=float),
        p2p_latency_s=np.asarray(v["lat"], dtype=float),
        allreduce_s_per_byte=np.asarray(v["ar_b"], dtype=float),
        allreduce_fixed_s=np.asarray(v["ar_f"], dtype=float),
        in_flight=np.asarray(v["in_flight"], dtype=np.int64),
        capacity_bytes=np.asarray(v["capacity"], dtype=float),
        state_bytes_per_param_byte=float(spec.state_bytes_per_param_byte),
        grad_bytes_per_param_byte=float(spec.grad_bytes_per_param_byte),
    )


# ----------------------------------------------------------------- reference


def reference_stage_terms(spec: CostSpec, bounds) -> list[tuple[float, float, float, bool]]:
    """Per stage ``(a_k, r_k, memory, fits)`` straight from the docstring of
    ``pipesearch/costs.py``, with plain Python sums over the layers:

    * ``a_k = scale_k * sum(times[i:j]) + p2p_k`` with
      ``p2p_k = 2 * (latency_k + outputs[j-1] / bandwidth_k)`` except the last
      stage (0);
    * ``r_k = grad * per_byte_k + fixed_k`` when the stage has gradient bytes
      ``grad = sum(params[i:j]) * grad_bytes_per_param_byte > 0``, else 0;
    * ``memory = sum(params[i:j]) * state_bytes_per_param_byte
      + sum(saved[i:j]) * in_flight_k``, fitting when ``<= capacity_k``.
    """
    v = spec.lists()
    out = []
    for k in range(spec.pp):
        i, j = bounds[k], bounds[k + 1]
        compute = v["scale"][k] * sum(v["times"][i:j])
        p2p = 0.0 if k == spec.pp - 1 else 2.0 * (v["lat"][k] + v["outputs"][j - 1] / v["bw"][k])
        grad = sum(v["params"][i:j]) * spec.grad_bytes_per_param_byte
        r = grad * v["ar_b"][k] + v["ar_f"][k] if grad > 0 else 0.0
        mem = sum(v["params"][i:j]) * spec.state_bytes_per_param_byte + sum(v["saved"][i:j]) * v["in_flight"][k]
        out.append((compute + p2p, r, mem, mem <= v["capacity"][k]))
    return out


def reference_iteration_time(spec: CostSpec, bounds) -> float:
    """``T = sum_k a_k + max_k ((m - 1) a_k + r_k)`` (costs.py docstring)."""
    terms = reference_stage_terms(spec, bounds)
    return sum(a for a, _, _, _ in terms) + max((spec.m - 1) * a + r for a, r, _, _ in terms)


def all_splits(num_layers: int, pp: int):
    """Every boundary tuple ``(0, x_1, ..., L)`` of ``pp`` non-empty stages."""
    for cut in itertools.combinations(range(1, num_layers), pp - 1):
        yield (0, *cut, num_layers)


def reference_optimum(spec: CostSpec) -> tuple[float, list[tuple[int, ...]]] | None:
    """Brute force with :func:`reference_iteration_time`: the least time over
    the splits that fit, and every split attaining it (None: nothing fits)."""
    best, arg = None, []
    for bounds in all_splits(spec.num_layers, spec.pp):
        if not all(fits for *_, fits in reference_stage_terms(spec, bounds)):
            continue
        t = reference_iteration_time(spec, bounds)
        if best is None or t < best:
            best, arg = t, [bounds]
        elif t == best:
            arg.append(bounds)
    return None if best is None else (best, arg)


def tiles(bounds, num_layers: int) -> bool:
    """Whether ``bounds`` cut ``[0, num_layers)`` into non-empty contiguous ranges."""
    return bounds[0] == 0 and bounds[-1] == num_layers and all(a < b for a, b in zip(bounds, bounds[1:]))


# ----------------------------------------------------------------- tiny models


def tiny_profile(times_fwd, times_bwd=None, *, params=None, outputs=None, saved=None,
                 batch_size: int = 1, name: str = "tiny", bytes_per_param: float = 4.0) -> ModelProfile:
    """A ModelProfile of ``len(times_fwd)`` layers ``l0, l1, ...`` (times in
    seconds, sizes in bytes, at ``batch_size``); backward defaults to twice
    forward, sizes to 0, ``saved`` to ``outputs``."""
    L = len(times_fwd)
    times_bwd = times_bwd if times_bwd is not None else [2 * t for t in times_fwd]
    params = params if params is not None else [0.0] * L
    outputs = outputs if outputs is not None else [0.0] * L
    saved = saved if saved is not None else outputs
    layers = tuple(
        Layer(name=f"l{k}", fwd_s=float(times_fwd[k]), bwd_s=float(times_bwd[k]), param_bytes=float(params[k]),
              output_bytes=float(outputs[k]), saved_bytes=float(saved[k]))
        for k in range(L)
    )
    return ModelProfile(name=name, layers=layers, profiled_batch_size=batch_size,
                        bytes_per_param=bytes_per_param, source="test")


def tiny_device(memory_bytes: float = 16 * 2**30, name: str = "testdev") -> DeviceSpec:
    return DeviceSpec(name=name, memory_bytes=float(memory_bytes), peak_fp16_flops=100e12,
                      peak_fp32_flops=10e12, hbm_bandwidth_bytes_per_s=1e12, achieved_fraction=0.5)


def tiny_cluster(nodes: int = 1, devices_per_node: int = 4, *, memory_bytes: float = 16 * 2**30,
                 intra: Link | None = None, inter: Link | None = None, name: str = "tiny-cluster") -> Cluster:
    """A homogeneous cluster; links default to free (infinite bandwidth, no latency)."""
    free = Link(math.inf, 0.0)
    return Cluster(name=name, groups=(DeviceGroup(tiny_device(memory_bytes), nodes, devices_per_node),),
                   intra_node=intra or free, inter_node=inter or free)


# ----------------------------------------------------------------- guards


class TimeLimitExceeded(AssertionError):
    pass


@contextlib.contextmanager
def time_limit(seconds: float, what: str = "call"):
    """Fail (instead of hanging the test run) when the body runs longer than
    ``seconds``: the exact split's scan must terminate. POSIX main thread
    only; elsewhere a no-op."""
    if not hasattr(signal, "setitimer"):
        yield
        return

    def _raise(signum, frame):
        raise TimeLimitExceeded(f"{what} ran longer than {seconds} s")

    try:
        old = signal.signal(signal.SIGALRM, _raise)
    except ValueError:  # not the main thread
        yield
        return
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def pcie_host(**kw) -> HostSpec:
    """A host table like 1x8-rtx4090-pcie4's (800 GB, PCIe 4.0 x16 at 25 GB/s
    per GPU, two switches of four GPUs, CPU Adam at 1e9 parameters/s), with
    ``kw`` overriding its fields."""
    base = dict(memory_bytes=800e9, pcie_generation=4, pcie_lanes_per_gpu=16,
                host_to_device_bytes_per_s=25e9, switch_uplink_bytes_per_s=25e9,
                pcie_switches=((0, 1, 2, 3), (4, 5, 6, 7)), cpu_adam_params_per_s=1e9)
    base.update(kw)
    return HostSpec(**base)


def mobius_profile(rng, num_layers: int, saved_gb: tuple[float, float]) -> ModelProfile:
    """Random layers for the Mobius brute-force tests: forward 0.5-2 s,
    backward 1-4 s, 1-8 GB of weights, ``saved_gb`` GB saved per micro-batch."""
    return ModelProfile(name="mob", layers=tuple(
        Layer(name=f"l{k}", fwd_s=float(rng.uniform(0.5, 2)), bwd_s=float(rng.uniform(1, 4)),
              param_bytes=float(rng.uniform(1, 8)) * 1e9, output_bytes=0.0,
              saved_bytes=float(rng.uniform(*saved_gb)) * 1e9)
        for k in range(num_layers)), profiled_batch_size=1, bytes_per_param=2.0)


def tied_or_random_profile(rng, num_layers: int, tied: bool) -> tuple[ModelProfile, np.ndarray, np.ndarray]:
    """A layer table for split-search tests and its ``(params, outputs)``
    bytes: ``tied``: identical layers and a random head (ties everywhere);
    else random layers (forward about 1 ms, backward 2 ms, parameters about
    1 MB on 70% of the layers, outputs about 1 MB)."""
    L = num_layers
    if tied:
        one = rng.exponential(1.0, 4)
        head = one * rng.uniform(0.2, 3.0, 4)
        fwd, bwd, params, outputs = (np.array([a] * (L - 1) + [h]) for a, h in zip(one, head))
        fwd, bwd, params, outputs = fwd * 1e-3, bwd * 2e-3, params * 1e6, outputs * 1e6
    else:
        fwd, bwd = rng.exponential(1e-3, L), rng.exponential(2e-3, L)
        params, outputs = rng.exponential(1e6, L) * (rng.random(L) < 0.7), rng.exponential(1e6, L)
    return tiny_profile(fwd, bwd, params=params, outputs=outputs, saved=outputs), params, outputs


def record_broken_barh(monkeypatch) -> list:
    """Every ``Axes.broken_barh`` call from now on, as ``(xranges, yrange,
    facecolors)``, drawn as usual (the list fills as figures are drawn)."""
    import matplotlib.axes

    drawn = []
    real = matplotlib.axes.Axes.broken_barh

    def record(self, xranges, yrange, **kw):
        drawn.append((list(xranges), tuple(yrange), kw.get("facecolors")))
        return real(self, xranges, yrange, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "broken_barh", record)
    return drawn


def mobius_gpus_fit(weight_bytes, held_bytes, pp: int, capacity_bytes: float) -> bool:
    """Mobius' device check written out (Feng et al., ASPLOS'23, sec. 3):
    every GPU ``r`` (stages ``r, r + pp, ...``) holds its stages'
    ``held_bytes`` plus the 16-bit weights and gradients (2 x the weight
    bytes) of its largest two consecutive stays (one stay alone when it has
    one stage), within ``capacity_bytes``."""
    S = len(weight_bytes)
    for r in range(pp):
        mine = list(range(r, S, pp))
        pairs = [2 * (weight_bytes[a] + weight_bytes[b]) for a, b in zip(mine[:-1], mine[1:])] or [
            2 * weight_bytes[mine[0]]]
        if held_bytes[mine].sum() + max(pairs) > capacity_bytes:
            return False
    return True


def written_plan(tmp_path_factory, name: str, args: list[str], *, validated: bool = True) -> dict:
    """``pipesearch <args> -o FILE`` (a ``plan`` command) in a fresh folder
    ``name``; asserts it exits 0 (and, with ``validated``, that ``pipesearch
    validate FILE`` passes) and returns the plan file's JSON."""
    import json

    from click.testing import CliRunner

    from pipesearch.cli import main

    out = tmp_path_factory.mktemp(name) / "p.json"
    r = CliRunner().invoke(main, list(args) + ["-o", str(out)])
    assert r.exit_code == 0, r.output
    if validated:
        assert CliRunner().invoke(main, ["validate", str(out)]).exit_code == 0
    return json.loads(out.read_text())


def rtx4090_cluster_toml(devices: int, switches: str, host_memory_gb: int = 800, name: str = "c") -> str:
    """A cluster TOML of one node of ``devices`` RTX 4090s at 12.5 GB/s, 20
    us, with a ``[host]`` of ``host_memory_gb`` GB, PCIe 4 x16 at 25 GB/s,
    the ``pcie_switches`` list ``switches`` and a 1e9 parameters/s CPU Adam."""
    return (f'name = "{name}"\nnodes = 1\ndevices_per_node = {devices}\ndevice = "rtx4090-24gb"\n'
            "[intra_node]\nbandwidth_GBps = 12.5\nlatency_us = 20\n[inter_node]\nbandwidth_GBps = 12.5\n"
            f"latency_us = 20\n[host]\nmemory_GB = {host_memory_gb}\npcie_generation = 4\npcie_lanes_per_gpu = 16\n"
            f"host_to_device_GBps = 25\nswitch_uplink_GBps = 25\npcie_switches = {switches}\n"
            "cpu_adam_params_per_s = 1e9\n")


def script_module(relative_path: str):
    """A script of the repository (``benchmarks/bench_split_replay.py``,
    ``docs/examples/generate.py``) loaded as a module, by its path."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / relative_path
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
