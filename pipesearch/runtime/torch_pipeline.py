"""Run a pipesearch plan with ``torch.distributed.pipelining`` on CPU processes.

``run_plan(model_factory, plan, batch_size=..., input_shape=..., steps=...,
schedule=...)`` spawns ``plan.pp`` processes (``torch.multiprocessing``, one
intra-op thread each: ``torch.set_num_threads(1)``), joins them in a gloo
process group over ``127.0.0.1`` (a free TCP port), and on every rank:

1. builds the model with ``model_factory()`` (same weights on every rank when
   the factory is deterministic) and keeps the rank's stage: the modules of
   the stage's layers, looked up by FQN (``get_submodule``) and chained in an
   ``nn.Sequential``. The stage boundaries come from the plan's torch export
   (:func:`pipesearch.export.export_plan` ``(plan, "torch")``: its
   ``split_spec`` parsed back with ``stages_from_split_spec`` and its
   ``layer_modules``), or, when that exporter is not available, straight from
   the plan's ``stages[k].layer_names``. This is a manual split: each rank
   wraps its submodule in ``PipelineStage(submodule, stage_index, num_stages,
   device)`` (no tracing by ``pipeline()``);
2. runs ``Schedule1F1B`` or ``ScheduleGPipe`` with ``n_microbatches =
   plan.num_micro_batches``, an MSE loss against a random target on the last
   stage (the loss function is given to the schedule on *every* rank: torch
   2.13 runs a schedule built without ``loss_fn`` forward-only, and the other
   ranks then wait for it forever), and SGD (``lr=1e-2``) on each stage's parameters;
3. times every step: a barrier, then the schedule's ``step`` (forward and
   backward of all micro-batches, what the plan's predicted iteration time
   covers), then ``optimizer.step()`` timed separately. A step's time is the
   slowest rank's; the result keeps every timed step after ``warmup`` steps.
   Each rank also records its process CPU time per step (``cpu_s``: the
   stage's work, which waiting does not count), and ``/proc/stat`` gives the
   CPU that other processes of the host used meanwhile
   (``host_other_cores``): with fewer free cores than ranks, every
   micro-batch hand-off also waits for a core, and wall-clock step times
   stop reflecting the split.

``run_plans`` runs several configurations (plans, splits, schedules) in one
process group, alternating them round by round, so that slow phases of a
shared host hit all of them alike; ``run_plan`` is one configuration of it.

The model must run as a chain of its layers (see
:func:`pipesearch.profiler.model_layers`), with one tensor flowing between
layers. ``model_factory`` is a picklable callable (a module-level function)
or a ``"MODULE:FACTORY"`` string (see :func:`pipesearch.profiler.load_factory`).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Callable, Sequence

from ..errors import InputError
from ..types import Plan

SCHEDULE_NAMES = {
    "1f1b": "Schedule1F1B",
    "gpipe": "ScheduleGPipe",
    "schedule1f1b": "Schedule1F1B",
    "schedulegpipe": "ScheduleGPipe",
}
"""Accepted ``schedule`` values (lower-cased) -> torch class name."""


@dataclass(frozen=True)
class RunConfig:
    """One configuration to run: a plan and the schedule class to run it with.

    Attributes:
        plan: the plan (its stages give the split, ``num_micro_batches`` the
            micro-batch count).
        schedule: ``"1f1b"``, ``"gpipe"`` or the torch class name; ``None``
            takes the plan's own schedule.
        label: free text naming the configuration in results.
    """

    plan: Plan
    schedule: str | None = None
    label: str = ""


@dataclass(frozen=True)
class RunResult:
    """Measured times of one configuration.

    Attributes:
        label: the configuration's label.
        schedule_class: torch schedule class that ran.
        layers_per_stage: the split that ran.
        step_s: every timed step (after warm-up), seconds: the slowest rank's
            ``schedule.step`` (forward + backward of all micro-batches).
        optimizer_s: the slowest rank's ``optimizer.step()`` per timed step.
        predicted_s: the plan's predicted iteration time.
        predicted_busy_s: the plan's compute per iteration of its busiest
            stage, ``num_micro_batches * max(stage.compute_s)``.
        losses: the last stage's mean micro-batch loss per timed step.
        cpu_s: per rank, the process CPU time of each timed step's
            ``schedule.step`` (compute plus communication threads); a step's
            ``step_s`` much larger than its ranks' ``cpu_s`` means waiting --
            for the other stage or, on a busy host, for a core.
        host_other_cores: average CPU (in cores) that *other* processes of
            the host used during the timed steps of the whole run (from
            ``/proc/stat``; ``None`` off Linux). Wall-clock step times are only
            meaningful when this is small next to the idle cores: the stages
            of a pipeline wait on each other at every micro-batch, and on an
            oversubscribed host each wait also waits for a core.
        num_cpus: ``os.cpu_count()`` of the host.
    """

    label: str
    schedule_class: str
    layers_per_stage: tuple[int, ...]
    step_s: tuple[float, ...]
    optimizer_s: tuple[float, ...]
    predicted_s: float
    predicted_busy_s: float = 0.0
    losses: tuple[float, ...] = field(default=())
    cpu_s: tuple[tuple[float, ...], ...] = field(default=())
    host_other_cores: float | None = None
    num_cpus: int | None = None

    @property
    def busiest_cpu_s(self) -> float:
        """Median over steps of the busiest rank's CPU time: the bottleneck
        stage's work, insensitive to waiting (for peers or for a core)."""
        return statistics.median(max(col) for col in zip(*self.cpu_s))

    @property
    def median_step_s(self) -> float:
        return statistics.median(self.step_s)

    @property
    def median_optimizer_s(self) -> float:
        return statistics.median(self.optimizer_s)

    @property
    def ratio(self) -> float:
        """Measured median step time / predicted iteration time (> 1: slower
        than predicted)."""
        return self.median_step_s / self.predicted_s

    @property
    def busy_ratio(self) -> float:
        """Measured busiest-rank CPU time / predicted busiest-stage compute
        (``predicted_busy_s``)."""
        return self.busiest_cpu_s / self.predicted_busy_s


# ---------------------------------------------------------------- planning the run (parent side)


def schedule_class_name(schedule: str | None, plan: Plan) -> str:
    """The torch schedule class for ``schedule`` (``None``: the plan's).

    Raises:
        InputError: a schedule other than 1F1B / GPipe, or 1F1B with fewer
            micro-batches than stages (torch's ``Schedule1F1B`` refuses it).
    """
    name = plan.schedule if schedule is None else schedule
    cls = SCHEDULE_NAMES.get(str(name).lower())
    if cls is None:
        raise InputError(f"run_plan: schedule {name!r} is not supported; expected one of 1f1b, gpipe "
                         "(Schedule1F1B, ScheduleGPipe)")
    if cls == "Schedule1F1B" and plan.num_micro_batches < plan.pp:
        raise InputError(f"run_plan: Schedule1F1B needs num_micro_batches >= pp, the plan has "
                         f"{plan.num_micro_batches} < {plan.pp}")
    return cls


def stage_modules(plan: Plan) -> list[list[str]]:
    """Per stage, the module FQNs of its layers, in order.

    From the plan's torch export (``split_spec`` + ``layer_modules``) when
    :mod:`pipesearch.export.torch` is available, else from ``layer_names``.

    Raises:
        InputError: ``vp > 1`` or ``dp``/``tp > 1`` (not run here), an empty
            stage, or the exporter's refusal.
    """
    if plan.vp != 1 or plan.dp != 1 or plan.tp != 1:
        raise InputError(f"run_plan runs pipeline parallelism only (one stage per rank); the plan has "
                         f"pp={plan.pp} dp={plan.dp} tp={plan.tp} vp={plan.vp}")
    if any(st.layers[1] <= st.layers[0] for st in plan.stages):
        raise InputError("run_plan: the plan has an empty stage")
    try:
        from ..export import export_plan
        from ..export.torch import stages_from_split_spec
    except ImportError:
        return [list(st.layer_names) for st in plan.stages]
    exp = export_plan(plan, "torch")
    mods = exp["layer_modules"]
    ranges = stages_from_split_spec(exp["split_spec"], mods)
    if [tuple(r) for r in ranges] != [tuple(st.layers) for st in plan.stages]:
        raise InputError(f"run_plan: the torch export's split {ranges} differs from the plan's stages "
                         f"{[st.layers for st in plan.stages]}")
    return [[fqn for layer in mods[a:b] for fqn in layer] for a, b in ranges]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_plans(model_factory: Callable | str, configs: Sequence[RunConfig], *, batch_size: int | None = None,
              input_shape: Sequence[int], steps: int = 3, rounds: int = 1, warmup: int = 1,
              backend: str = "gloo", lr: float = 1e-2, seed: int = 0, timeout_s: float = 300.0,
              pin_cpus: bool = False, vocab_size: int | None = None) -> list[RunResult]:
    """Run several configurations in one process group, alternating them.

    Every configuration gets ``warmup`` untimed steps, then ``rounds`` rounds
    of ``steps`` timed steps, round by round across configurations (A A B B, A
    A B B, ... for ``steps=2``).

    Args:
        model_factory: picklable callable returning the model, or
            ``"MODULE:FACTORY"``.
        configs: what to run; all must have the same ``pp`` (the world size).
        batch_size: samples per step (split into ``num_micro_batches``
            micro-batches); default ``micro_batch_size * num_micro_batches``
            of the first plan.
        input_shape: shape of one sample.
        backend: ``torch.distributed`` backend (``"gloo"`` on CPU).
        lr: SGD learning rate.
        timeout_s: process-group timeout (a hung peer fails the run).
        pin_cpus: pin rank ``r`` to CPU ``r % os.cpu_count()`` (Linux).
        vocab_size: ``None`` for random normal float inputs; an integer for
            token-id inputs drawn uniformly from ``0 .. vocab_size - 1``
            (models that start with an embedding).

    Returns:
        One :class:`RunResult` per configuration, in order.

    Raises:
        InputError: torch missing, mixed ``pp``, unsupported plan or schedule,
            a batch not divisible into the micro-batches.
        RuntimeError: a worker failed (its traceback is in the message).
    """
    try:
        import torch.multiprocessing as mp
    except ImportError:
        raise InputError("run_plan needs PyTorch; pip install torch") from None
    if not configs:
        raise InputError("run_plans: no configurations")
    world = configs[0].plan.pp
    if any(c.plan.pp != world for c in configs):
        raise InputError("run_plans: every configuration must have the same pp (the number of processes)")
    if steps < 1 or rounds < 1 or warmup < 0:
        raise InputError(f"run_plans: steps {steps} and rounds {rounds} must be >= 1, warmup {warmup} >= 0")
    first = configs[0].plan
    batch = batch_size or first.micro_batch_size * first.num_micro_batches
    jobs = []
    for c in configs:
        if batch % c.plan.num_micro_batches:
            raise InputError(f"run_plans: batch size {batch} is not divisible into "
                             f"{c.plan.num_micro_batches} micro-batches")
        jobs.append({
            "label": c.label,
            "schedule_class": schedule_class_name(c.schedule, c.plan),
            "stage_modules": stage_modules(c.plan),
            "n_microbatches": c.plan.num_micro_batches,
            "layers_per_stage": list(c.plan.layers_per_stage),
            "predicted_s": c.plan.predicted.iteration_time_s,
            "predicted_busy_s": c.plan.num_micro_batches * max(st.compute_s for st in c.plan.stages),
        })
    with tempfile.TemporaryDirectory(prefix="pipesearch-run-") as tmp:
        out = Path(tmp) / "result.json"
        spec = {
            "jobs": jobs, "batch_size": batch, "input_shape": [int(d) for d in input_shape],
            "steps": steps, "rounds": rounds, "warmup": warmup, "backend": backend, "lr": lr,
            "seed": seed, "timeout_s": timeout_s, "out": str(out), "pin_cpus": pin_cpus,
            "vocab_size": vocab_size,
        }
        for attempt in range(3):
            spec["port"] = free_port()
            try:
                mp.spawn(_worker, args=(world, model_factory, spec), nprocs=world, join=True)
                break
            except mp.ProcessRaisedException as exc:
                # the free port can be taken between free_port() and the store's bind: retry
                if "address already in use" in str(exc).lower() and attempt < 2:
                    continue
                raise RuntimeError(f"run_plan: a worker failed:\n{exc}") from None
            except mp.ProcessExitedException as exc:
                raise RuntimeError(f"run_plan: a worker died: {exc}") from None
        data = json.loads(out.read_text())
    return [
        RunResult(label=j["label"], schedule_class=j["schedule_class"],
                  layers_per_stage=tuple(j["layers_per_stage"]), step_s=tuple(r["step_s"]),
                  optimizer_s=tuple(r["optimizer_s"]), predicted_s=j["predicted_s"],
                  predicted_busy_s=j["predicted_busy_s"], losses=tuple(r["losses"]),
                  cpu_s=tuple(tuple(c) for c in r["cpu_s"]), host_other_cores=r["host_other_cores"],
                  num_cpus=r["num_cpus"])
        for j, r in zip(jobs, data)
    ]


def run_plan(model_factory: Callable | str, plan: Plan, *, batch_size: int | None = None,
             input_shape: Sequence[int], steps: int = 5, schedule: str | None = None,
             backend: str = "gloo", warmup: int = 1, **kwargs) -> RunResult:
    """Run ``plan`` for ``steps`` timed training steps (after ``warmup``).

    ``schedule``: ``"1f1b"`` / ``"gpipe"`` (or ``Schedule1F1B`` /
    ``ScheduleGPipe``); ``None`` takes the plan's. Other keyword arguments go
    to :func:`run_plans`. Returns the :class:`RunResult`; its
    ``median_step_s`` is the median step time.
    """
    return run_plans(model_factory, [RunConfig(plan, schedule)], batch_size=batch_size, input_shape=input_shape,
                     steps=steps, rounds=1, warmup=warmup, backend=backend, **kwargs)[0]


# ---------------------------------------------------------------- worker (child side)


def _host_busy_s() -> float | None:
    """Seconds of CPU all processes of the host have used since boot
    (``/proc/stat``, all but idle and iowait); ``None`` when unreadable."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    if not fields or fields[0] != "cpu":
        return None
    values = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    busy = sum(values) - values[3] - values[4]
    return busy / ticks


def _factory(model_factory):
    if isinstance(model_factory, str):
        from ..profiler import load_factory

        return load_factory(model_factory)
    return model_factory


def _worker(rank: int, world: int, model_factory, spec: dict) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed import pipelining

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process
        pass
    if spec["pin_cpus"] and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(spec["port"])
    if sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(spec["backend"], rank=rank, world_size=world,
                            timeout=timedelta(seconds=spec["timeout_s"]))
    try:
        device = torch.device("cpu")
        factory = _factory(model_factory)
        torch.manual_seed(spec["seed"])
        if spec.get("vocab_size"):
            x = torch.randint(0, spec["vocab_size"], (spec["batch_size"], *spec["input_shape"]))
        else:
            x = torch.randn(spec["batch_size"], *spec["input_shape"])
        last = rank == world - 1
        loss_fn = nn.MSELoss()
        runs = []
        for job in spec["jobs"]:
            torch.manual_seed(spec["seed"])
            model = factory()
            fqns = job["stage_modules"][rank]
            submod = nn.Sequential(OrderedDict((f.replace(".", "_"), model.get_submodule(f)) for f in fqns))
            target = None
            if last:
                with torch.no_grad():
                    out_shape = model(x[:1]).shape[1:]
                target = torch.randn(spec["batch_size"], *out_shape,
                                     generator=torch.Generator().manual_seed(spec["seed"] + 1))
            del model
            stage = pipelining.PipelineStage(submod, rank, world, device)
            cls = getattr(pipelining, job["schedule_class"])
            # loss_fn on every rank: torch sets `_has_backward = loss_fn is not None`, so a
            # rank built without it runs forward only and the backward metadata exchange hangs
            sched = cls(stage, n_microbatches=job["n_microbatches"], loss_fn=loss_fn)
            opt = torch.optim.SGD(submod.parameters(), lr=spec["lr"])
            runs.append({"sched": sched, "opt": opt, "target": target, "step_s": [], "optimizer_s": [], "cpu_s": [],
                         "losses": []})

        def one_step(run, record: bool):
            dist.barrier()
            losses = [] if last else None
            c0 = time.process_time()
            t0 = time.perf_counter()
            if rank == 0:
                run["sched"].step(x)
            elif last:
                run["sched"].step(target=run["target"], losses=losses)
            else:
                run["sched"].step()
            t1 = time.perf_counter()
            c1 = time.process_time()
            run["opt"].step()
            run["opt"].zero_grad(set_to_none=True)
            t2 = time.perf_counter()
            if record:
                run["step_s"].append(t1 - t0)
                run["optimizer_s"].append(t2 - t1)
                run["cpu_s"].append(c1 - c0)
                if last:
                    run["losses"].append(float(torch.stack([loss.detach() for loss in losses]).mean()))

        for run in runs:
            for _ in range(spec["warmup"]):
                one_step(run, record=False)
        dist.barrier()
        busy0, wall0, cpu0 = _host_busy_s(), time.perf_counter(), time.process_time()
        for _ in range(spec["rounds"]):
            for run in runs:
                for _ in range(spec["steps"]):
                    one_step(run, record=True)
        dist.barrier()
        busy1, wall1, cpu1 = _host_busy_s(), time.perf_counter(), time.process_time()
        # CPU the other processes of the host used while we measured, in cores
        ours = torch.tensor([cpu1 - cpu0], dtype=torch.float64)
        dist.all_reduce(ours, op=dist.ReduceOp.SUM)
        other_cores = None
        if busy0 is not None and busy1 is not None and wall1 > wall0:
            other_cores = max(0.0, (busy1 - busy0 - float(ours)) / (wall1 - wall0))
        # every rank's times -> the slowest rank's, per step
        results = []
        for run in runs:
            times = torch.tensor([run["step_s"], run["optimizer_s"]], dtype=torch.float64)
            dist.all_reduce(times, op=dist.ReduceOp.MAX)
            cpu = [torch.zeros(len(run["cpu_s"]), dtype=torch.float64) for _ in range(world)]
            dist.all_gather(cpu, torch.tensor(run["cpu_s"], dtype=torch.float64))
            losses = torch.tensor(run["losses"] or [0.0] * len(run["step_s"]), dtype=torch.float64)
            if not last:
                losses.zero_()
            dist.all_reduce(losses, op=dist.ReduceOp.SUM)
            results.append({"step_s": times[0].tolist(), "optimizer_s": times[1].tolist(),
                            "losses": losses.tolist(), "cpu_s": [c.tolist() for c in cpu],
                            "host_other_cores": other_cores, "num_cpus": os.cpu_count()})
        if rank == 0:
            Path(spec["out"]).write_text(json.dumps(results))
        dist.barrier()
    finally:
        dist.destroy_process_group()
