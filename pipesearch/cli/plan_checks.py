"""``pipesearch plan``'s refusals before the search: one line naming the
flags that contradict each other, the cluster or the model, and the fix.
Each check runs in the order the command reads its inputs (outputs first, so
a bad path costs nothing and leaves nothing)."""

from __future__ import annotations

import click

from .. import runtimes
from ..errors import InputError
from ..export import model_kind_refusal, transformer_shape
from ..hardware import device_files, load_cluster
from ..models import PER_STAGE
from ..output import check_directory, check_distinct_paths, check_suffix, check_writable
from ..pins import check_vp_pins, split_text
from ..search_options import DEFAULT_SCHEDULES, MULTI_STAGE_SCHEDULES
from ..units import format_bytes
from .params import option_given


def checked_outputs(output, all_points, plot_dir, model, cluster_name):
    """Every output path of the command checked before the search:
    ``(plan file path or None, the --plot-dir directory or None)``.

    Raises:
        InputError: a path that cannot be written, two outputs on one path
            or on an input, or a wrong suffix.
    """
    out = check_writable(output, "plan file (-o)") if output is not None else None  # a file only when asked for
    if all_points is not None:
        check_writable(all_points, "--all-points")
    if plot_dir == "":
        raise InputError("--plot-dir: empty directory name; give a directory")
    figures = []
    if plot_dir:
        from ..plots.common import KINDS

        plot_dir = check_directory(plot_dir, "--plot-dir")  # made when the figures are written
        figures = [("--plot-dir", plot_dir / f"{kind}.png") for kind in KINDS]
        if plot_dir.is_dir():  # every figure's file too, before anything is written
            for _, path in figures:
                check_writable(path, "--plot-dir figure")
        # the directory itself too: named like -o, the plan file took its place and the figures failed after it
        figures.append(("--plot-dir", plot_dir))
    check_distinct_paths([("-o", output), ("--all-points", all_points), *figures],
                         [("--model", model), ("--cluster", cluster_name), *device_files(cluster_name)])
    check_suffix(output, "-o", ".json", "the plan file is JSON")
    check_suffix(all_points, "--all-points", ".csv", "the table of every point is CSV")
    return out, plot_dir


def checked_cluster(cluster_name, nodes, mapping_time_limit, memory_reserve: str, reserve: float,
                    memory_headroom: float, host_flags):
    """The cluster (:func:`pipesearch.hardware.load_cluster`), once the flags
    that need what it lacks are refused: ``--mapping-time-limit`` on one
    device type, a host flag (``host_flags``: ``(flag, on)`` pairs) without
    a ``[host]`` table, a reserve and headroom that leave no device type any
    memory (a warning where they leave some types none).

    Raises:
        InputError: the flag and the fix.
    """
    cluster = load_cluster(cluster_name, nodes=nodes)
    if option_given(click.get_current_context(), "mapping_time_limit") and cluster.is_uniform:
        raise InputError(f"--mapping-time-limit {mapping_time_limit:g}: it limits the device-order search of a "
                         f"cluster whose devices or links differ; {cluster.name} has one device type and one link "
                         "model (every order is the same); drop it")
    for flag, on in host_flags:
        if on and cluster.host is None:
            raise InputError(f"{flag}: cluster {cluster.name!r} has no [host] table (host memory, "
                             "PCIe links, CPU Adam rate); add one (hardware/README.md) or drop the flag")
    empty = {g.device.name: g.device.memory_bytes for g in cluster.groups
             if reserve >= g.device.memory_bytes * (1 - memory_headroom)}
    if len(empty) == len({g.device.name for g in cluster.groups}):
        smallest = min(empty.values())
        raise InputError(f"--memory-reserve {memory_reserve} with --memory-headroom {memory_headroom:g} leaves "
                         f"nothing of the {format_bytes(smallest)} devices of {cluster.name}; lower them "
                         f"(defaults 1GiB and 0.05)")
    for name, size in empty.items():  # a mixed cluster: those types hold nothing, the others plan
        click.echo(f"warning: --memory-reserve {memory_reserve} with --memory-headroom {memory_headroom:g} leaves "
                   f"nothing of the {format_bytes(size)} of {name}: its devices stay idle (lower them to use "
                   f"those devices)", err=True)
    return cluster


def check_model_flags(source, model, runtime, tp, tp_comm_overlap, sequence_parallel) -> None:
    """Refuse the flags the loaded model cannot take: ``--runtime megatron``
    for a layer table that is not GPT-style, ``--tp-comm-overlap`` and a
    given ``--(no-)sequence-parallel`` for a layer profile (or at ``--tp 1``).

    Raises:
        InputError: the flag and the fix.
    """
    names = [lay.name for lay in source.variants[0].profile.layers]
    if runtime == "megatron" and transformer_shape(names) is None:  # before the search, not after it
        raise InputError(f"--runtime megatron: {model}'s layers ({', '.join(names[:4])}, ...) are not a transformer "
                         f"layer table (embedding, block_00 .. block_<L-1>, head), and Megatron-LM builds GPT-style "
                         f"models only; drop --runtime or choose torch or deepspeed")
    if tp_comm_overlap and source.info.get("kind") != "transformer":
        raise InputError(f"--tp-comm-overlap: needs a transformer config (tensor parallelism); {model} is a layer "
                         f"profile; drop it")
    if option_given(click.get_current_context(), "sequence_parallel"):
        flag = "--sequence-parallel" if sequence_parallel else "--no-sequence-parallel"
        if source.info.get("kind") != "transformer":
            raise InputError(f"{flag}: needs a transformer config (sequence parallelism splits its tensor-parallel "
                             f"activations); {model} is a layer profile; drop it")
        if tp == 1:
            raise InputError(f"{flag} with --tp 1: sequence parallelism splits the activations of a tensor-parallel "
                             "group, and there is none; drop one of them")


def check_host_flags(cluster, schedules, vps, recompute, *, optimizer_offload, stream_weights, activation_offload,
                     delayed_optimizer_step) -> None:
    """Refuse the host-memory flags (offload, streaming, delayed step) and
    Mobius where they contradict each other or the schedules asked for.

    Raises:
        InputError: the flags and the fix.
    """
    if delayed_optimizer_step and not (optimizer_offload or stream_weights
                                       or {"mobius", "roundpipe"} & set(schedules or ())):
        raise InputError("--delayed-optimizer-step: no stage keeps its optimizer on the host; add "
                         "--optimizer-offload, --stream-weights, --schedule mobius or --schedule roundpipe, or drop "
                         "the flag")
    if "mobius" in (schedules or ()) and cluster.host is None:
        raise InputError(f"--schedule mobius: cluster {cluster.name!r} has no [host] table (host memory, PCIe "
                         "switches, CPU Adam rate) to swap its stages through; add one (hardware/README.md) or "
                         "choose another schedule")
    if "mobius" in (schedules or ()) and recompute == PER_STAGE:
        raise InputError("--schedule mobius with --recompute per-stage: a Mobius GPU holds the activations of all "
                         "its stages, so its stages' recompute levels are not chosen one by one; use --recompute "
                         "none, selective or full (docs/offload.md)")
    if set(schedules or ()) == {"mobius"} and stream_weights:
        raise InputError("--schedule mobius with --stream-weights: Mobius keeps every stage's weights in host memory "
                         "and copies each stage in before it runs already; drop the flag")
    if stream_weights and activation_offload and set(schedules or ()) != {"roundpipe"}:
        raise InputError("--stream-weights with --activation-offload: a streamed stage's activations in host memory "
                         "are not modelled (docs/offload.md); drop one of the two flags")
    several = {"interleaved-1f1b", "looped-bfs"}  # several stages per device, whose activations stay on it
    if activation_offload and ((schedules and set(schedules) <= several) or (vps and min(vps) > 1 and not (
            set(schedules or ()) & {"mobius", "roundpipe"}))):
        by_schedule = bool(schedules) and set(schedules) <= several
        what = f"--schedule {' '.join(schedules)}" if by_schedule else f"--vp {min(vps)}"
        fix = "add one of those schedules" if by_schedule else "drop --vp (or add --vp 1)"
        raise InputError(f"--activation-offload with {what}: activations in host memory are planned for one stage "
                         "per device (gpipe, 1f1b, zb-h1) and Mobius, not for several stages per device; "
                         f"{fix}, or drop --activation-offload")


def check_roundpipe_pins(cluster, runtime, *, pp, tp, dp, recompute, optimizer_offload, stream_weights,
                         activation_offload, optimizer_state, sharding, zero1, optimizer_bytes_per_param,
                         overlap_grad_reduce, tp_comm_overlap) -> None:
    """``--schedule roundpipe``'s refusals (:func:`check_roundpipe_flags`,
    without a runtime :func:`check_roundpipe_state_flags`, whose defaults
    the runtime's own rules refuse), and a ``--pp`` above a node's GPUs (its
    pool shares one host).

    Raises:
        InputError: the flag and the fix.
    """
    check_roundpipe_flags(cluster, tp=tp, dp=dp, recompute=recompute, optimizer_offload=optimizer_offload,
                          stream_weights=stream_weights, activation_offload=activation_offload)
    if runtime is None:  # a runtime's own defaults are refused with the runtime, below
        check_roundpipe_state_flags(optimizer_state=optimizer_state, sharding=sharding, zero1=zero1,
                                    optimizer_bytes_per_param=optimizer_bytes_per_param,
                                    overlap_grad_reduce=overlap_grad_reduce, tp_comm_overlap=tp_comm_overlap)
    per_node = max(g.devices_per_node for g in cluster.groups)
    if pp and pp > per_node:
        raise InputError(f"--schedule roundpipe with --pp {pp}: RoundPipe's pool of GPUs shares one host (its "
                         f"memory, CPU optimizer and PCIe switches), and a node of {cluster.name} has {per_node} "
                         f"GPUs; use --pp {per_node} or less")


def check_replication_pins(split, split_replicas, runtime, replicate_stages, dp, pp, vps, schedules) -> None:
    """Per-stage replication (``--replicate-stages``, a ``--split`` with
    replicas) against a runtime, ``--dp`` and ``--vp``; a ``--split``
    without ``--pp`` where the pins ask for virtual stages
    (:func:`check_split_without_pp`).

    Raises:
        InputError: the pins and the fix.
    """
    if runtime and (replicate_stages or split_replicas):
        raise InputError(f"--runtime {runtime} runs one data-parallel degree for all stages; drop "
                         f"{'--replicate-stages' if replicate_stages else 'the replicas (NxR) of --split'}")
    pinned = split_text(split, split_replicas) if split_replicas else ""
    if (split_replicas or replicate_stages) and dp is not None:
        flag, whose = ((pinned, "the split's replicas (NxR)") if split_replicas else
                       ("--replicate-stages", "the replicas"))
        raise InputError(f"{flag} with --dp {dp}: {whose} give each stage its own data-parallel degree; drop --dp")
    if split_replicas and vps and max(vps) > 1:
        raise InputError(f"{pinned} with --vp {max(vps)}: per-stage replication runs one stage per device (vp 1); "
                         f"drop --vp or the replicas")
    if split and not pp and not split_replicas:  # a split for virtual stages needs --pp: say which one
        check_split_without_pp(len(split), vps, schedules)


def searched_schedules(schedules, split, split_replicas, vps, pp, *, replicate_stages, optimizer_offload) -> tuple:
    """The schedules the search tries: those asked for, else the default
    ones that the pins allow (one stage per device for a ``--split`` unless
    ``--vp`` asks for more; a pinned vp), once the ``--vp`` pins agree with
    them and with ``--pp`` and ``--split``.

    Raises:
        InputError: the pins and the fix.
    """
    explicit = schedules
    if not schedules:
        schedules = DEFAULT_SCHEDULES if not split else tuple(x for x in DEFAULT_SCHEDULES
                                                               if x not in MULTI_STAGE_SCHEDULES)
        if vps and min(vps) > 1:  # a pinned vp > 1: only the default schedules with virtual stages honour it
            schedules = tuple(x for x in DEFAULT_SCHEDULES if x in MULTI_STAGE_SCHEDULES)
        elif vps and max(vps) < 2:  # vp 1 pinned: interleaving needs 2 or more (pins.check_vp_pins)
            schedules = tuple(x for x in schedules if x != "interleaved-1f1b")
    check_vp_pins(tuple(vps), tuple(schedules), MULTI_STAGE_SCHEDULES,
                  "--schedule asks for" if explicit or not split else
                  f"{split_text(split, split_replicas)} without --schedule is searched (one stage per device) with")
    if vps and max(vps) > 1 and (pp == 1 or (split and len(split) == 1)):
        raise InputError(f"--vp {max(vps)} with --pp 1: one pipeline rank runs all its stages as one (plain "
                         "gradient accumulation, vp 1); use --pp 2 or more, or drop --vp")
    if split and pp and vps and len(split) in [v * pp for v in vps]:  # the split and --pp fix vp = stages / pp
        off = [v for v in vps if v * pp != len(split)]  # (no vp that fits: the split's own check refuses it)
        if off:
            raise InputError(f"--vp {off[0]} with --split of {len(split)} stages and --pp {pp}: the split gives "
                             f"every device {len(split) / pp:g} stages; drop --vp {off[0]}")
    if split and replicate_stages:
        raise InputError("--replicate-stages with --split: the split pins the stages, so there is nothing to search; "
                         "write each stage's replicas in the split (e.g. --split 32x15,8x1) or drop --split")
    if optimizer_offload and schedules and set(schedules) == {"mobius"}:
        raise InputError("--schedule mobius with --optimizer-offload: Mobius keeps every stage's weights and "
                         "optimizer state in host memory already (its step runs on the CPU); drop the flag")
    return tuple(schedules)


def runtime_schedules(runtime, source, schedules, explicit, split, vps, *, pp, num_micro_batches, tp) -> tuple:
    """The schedules of ``schedules`` that ``runtime`` runs
    (:func:`pipesearch.runtimes.schedules_for`), once the runtime's own
    rules are met: a model kind it builds, pins it runs
    (:func:`pipesearch.runtimes.check_pins`), virtual stages only where it
    has them; ``explicit``: the schedules the user asked for.

    Raises:
        InputError: the runtime's refusal and its fix.
    """
    refused = model_kind_refusal(runtime, source.info.get("transformer"))
    if refused:  # no plan of this model runs there: said before the search, not after it
        raise InputError(f"--runtime {runtime}: {refused}; drop --runtime (then export --format stages-json "
                         f"gives the split)")
    schedules = runtimes.schedules_for(runtime, schedules, explicit=bool(explicit))
    if split and not explicit and not (vps and min(vps) > 1):
        # a split without --schedule is searched one stage per device, as without --runtime
        schedules = tuple(x for x in schedules if x not in MULTI_STAGE_SCHEDULES) or schedules
    runtimes.check_pins(runtime, schedules=tuple(schedules), pp=pp, num_micro_batches=num_micro_batches, tp=tp)
    if vps and max(vps) > 1 and not set(schedules) & set(MULTI_STAGE_SCHEDULES):
        looped = [r for r in runtimes.RUNTIMES if set(runtimes.SCHEDULES[r]) & set(MULTI_STAGE_SCHEDULES)
                  and (r == "torch" or source.info.get("kind") == "transformer")]  # the others build LLMs
        raise InputError(f"--vp {max(vps)} with --runtime {runtime}: {runtime} runs {', '.join(schedules)}, one "
                         f"stage per device (vp 1); drop --vp, or choose a runtime with virtual stages "
                         f"({', '.join(looped)})")
    return tuple(schedules)


def check_replica_pins(cluster, dp, pinned_pp, tp, placements, *, replicate_stages, split_replicas, sharding,
                       zero1, overlap_grad_reduce, overlap_param_gather) -> None:
    """With one data-parallel replica (``dp`` 1, or ``pinned_pp`` and ``tp``
    filling the cluster) refuse the flags that need replicas
    (:func:`check_one_replica_flags`) and ``--placement`` on a cluster of
    one device type.

    Raises:
        InputError: the pins and the fix.
    """
    one_replica = (f"--pp {pinned_pp}{f' x --tp {tp}' if tp else ''} on the {cluster.num_devices} devices of "
                   f"{cluster.name} (dp 1)" if dp is None and pinned_pp is not None and not replicate_stages
                   and not split_replicas and cluster.num_devices // (pinned_pp * (tp or 1)) == 1 else None)
    if dp == 1:
        check_one_replica_flags(sharding, zero1, overlap_grad_reduce, overlap_param_gather)
    elif one_replica:
        check_one_replica_flags(sharding, zero1, overlap_grad_reduce, overlap_param_gather, why=one_replica)
    if placements and cluster.is_homogeneous and (1 in (pinned_pp, dp) or one_replica):
        degree = f"--pp {pinned_pp}" if pinned_pp == 1 else f"--dp {dp}" if dp == 1 else one_replica
        raise InputError(f"--placement {placements[0]} with {degree}: a placement orders the stages' replicas, which "
                         "needs pp > 1 and dp > 1 (every layout is the same here); drop --placement")



def check_split_without_pp(stages: int, vps, schedules) -> None:
    """A ``--split`` of ``stages`` stages without ``--pp`` runs one stage per
    rank (pp = stages). Refuse, naming the ``--pp`` (and ``--vp``) to add,
    where the pins ask for virtual stages instead: a ``--vp`` above 1, or
    only schedules of several stages per rank, or both kinds of schedule
    (each would read the split another way).

    Raises:
        InputError: the fix, e.g. ``--split of 4 stages with --vp 2: add
            --pp 2``.
    """
    several = [x for x in schedules if x in MULTI_STAGE_SCHEDULES]
    if vps and max(vps) > 1:
        if len(vps) > 1:
            raise InputError(f"--split of {stages} stages with --vp {','.join(map(str, vps))}: a split of pp x vp "
                             f"stages has one vp; keep one --vp and add --pp (stages / vp)")
        vp = vps[0]
        if stages % vp or stages // vp < 2:
            raise InputError(f"--split of {stages} stages with --vp {vp}: each pipeline rank runs {vp} of them, so "
                             f"the split needs a multiple of {vp} stages on 2 or more ranks ({2 * vp}, {3 * vp}, "
                             f"...); change the split or drop --vp")
        raise InputError(f"--split of {stages} stages with --vp {vp}: add --pp {stages // vp} (the split's stages, "
                         f"{vp} per pipeline rank)")
    if several and len(several) < len(schedules) and not vps:
        one = [x for x in schedules if x not in several]
        raise InputError(f"--split of {stages} stages with --schedule {' and '.join(schedules)}: {', '.join(one)} "
                         f"would run it one stage per rank (pp {stages}), {', '.join(several)} several stages per "
                         f"rank; add --pp (the split's stages over it fix vp), or ask for one kind of schedule")
    if several and len(several) == len(schedules) and not vps and set(several) <= {"interleaved-1f1b", "looped-bfs"}:
        pairs = [(stages // v, v) for v in range(2, stages // 2 + 1) if stages % v == 0]
        if not pairs:
            raise InputError(f"--split of {stages} stages with --schedule {' and '.join(schedules)}: a split for "
                             f"virtual stages has pp x vp stages, pp and vp of 2 or more (4, 6, 8, 9, ...); change "
                             f"the split, or use --schedule gpipe, 1f1b or zb-h1")
        raise InputError(f"--split of {stages} stages with --schedule {' and '.join(schedules)}: add --pp and --vp "
                         f"with pp x vp = {stages} (" + " or ".join(f"--pp {a} --vp {b}" for a, b in pairs[:2]) + ")")


def split_vps(split, pp: int | None) -> tuple[int, ...]:
    """The virtual stages per device searched when ``--vp`` is not given:
    what a ``--split`` with ``--pp`` fixes (its stages over the ranks, 1
    included: a split of 8 stages on 8 ranks runs one each), else 2."""
    if split and pp and len(split) % pp == 0:
        return (len(split) // pp,)
    return (2,)


def check_roundpipe_flags(cluster, *, tp, dp, recompute, optimizer_offload, stream_weights,
                          activation_offload) -> None:
    """``--schedule roundpipe`` runs one model copy on a pool of GPUs with
    every parameter and its optimizer in host memory and each group's
    forward re-run in its backward (:mod:`pipesearch.roundpipe`): refuse, in
    one line, the flags that contradict it.

    Raises:
        InputError: a cluster without ``[host]``, ``--tp`` or ``--dp``
            above 1, ``--recompute`` other than ``none``, or an offload or
            streaming flag.
    """
    if cluster.host is None:
        raise InputError(f"--schedule roundpipe: cluster {cluster.name!r} has no [host] table (host memory and PCIe "
                         "switches); add one (docs/offload.md) or choose another schedule")
    for flag, value in (("--tp", tp), ("--dp", dp)):
        if value is not None and value > 1:
            what = "tensor" if flag == "--tp" else "data"
            raise InputError(f"--schedule roundpipe with {flag} {value}: RoundPipe runs one model copy without "
                             f"{what} parallelism on its pool of GPUs; drop {flag} or choose another schedule")
    if recompute not in (None, "none"):
        raise InputError(f"--schedule roundpipe with --recompute {recompute}: RoundPipe already re-runs each layer "
                         "group's forward in its backward (checkpoints at the group boundaries); drop --recompute")
    for flag, on in (("--optimizer-offload", optimizer_offload), ("--stream-weights", stream_weights),
                     ("--activation-offload", activation_offload)):
        if on:
            raise InputError(f"--schedule roundpipe with {flag}: RoundPipe keeps every parameter, its optimizer and "
                             "the group boundaries' activations in host memory already; drop the flag")



def check_one_replica_flags(sharding, zero1: bool, overlap_grad_reduce, overlap_param_gather,
                            why: str = "dp 1") -> None:
    """With dp pinned to 1 (``--dp 1``, the batch pins, or a ``--pp`` that
    with ``--tp`` fills the cluster; ``why`` names the pins) there is one
    replica: no state to shard over replicas and no data-parallel collective
    to overlap. Refuse the flags that ask for them, as ``--tp 1
    --tp-comm-overlap`` is refused, rather than accept them doing nothing.

    Raises:
        InputError: a ``--sharding`` other than none, ``--zero1``,
            ``--overlap-grad-reduce`` or ``--overlap-param-gather``.
    """
    if sharding not in (None, "none") or zero1:
        flag = f"--sharding {sharding}" if sharding not in (None, "none") else "--zero1"
        raise InputError(f"{flag} with {why}: one data-parallel replica has no replicas to shard its state over; "
                         "drop one of them")
    for flag, on in (("--overlap-grad-reduce", overlap_grad_reduce), ("--overlap-param-gather", overlap_param_gather)):
        if on:
            raise InputError(f"{flag} with {why}: one data-parallel replica has no gradient reduce or parameter "
                             "gather to overlap; drop one of them")


def check_roundpipe_state_flags(*, optimizer_state, sharding, zero1, optimizer_bytes_per_param, overlap_grad_reduce,
                                tp_comm_overlap) -> None:
    """``--schedule roundpipe`` holds its own training state (16-bit weights
    and gradients, fp32 master weights, gradients and Adam moments in host
    memory, :data:`pipesearch.roundpipe.HOST_BYTES_PER_PARAM` bytes per
    parameter) on one model copy without tensor parallelism: refuse, in one
    line, the flags that would change a state or a collective it does not
    have, instead of dropping them.

    Raises:
        InputError: ``--optimizer-state``, ``--optimizer-bytes-per-param``,
            a ``--sharding`` other than none (or ``--zero1``),
            ``--overlap-grad-reduce`` or ``--tp-comm-overlap``.
    """
    from ..roundpipe import HOST_BYTES_PER_PARAM

    state = (("--optimizer-state", optimizer_state), ("--optimizer-bytes-per-param", optimizer_bytes_per_param))
    for flag, value in state:
        if value is not None:
            shown = value if isinstance(value, str) else f"{value:g}"
            raise InputError(f"--schedule roundpipe with {flag} {shown}: RoundPipe keeps its own state in host memory "
                             f"(16-bit weights and gradients, fp32 master weights, gradients and moments: "
                             f"{HOST_BYTES_PER_PARAM:g} B per parameter); drop {flag} or choose another schedule")
    if (sharding not in (None, "none")) or zero1:
        flag = "--zero1" if zero1 and sharding in (None, "zero1") else f"--sharding {sharding}"
        raise InputError(f"--schedule roundpipe with {flag}: RoundPipe runs one model copy (dp 1), so there are no "
                         "data-parallel replicas to shard over; drop it or choose another schedule")
    for flag, on, what in (("--overlap-grad-reduce", overlap_grad_reduce, "data-parallel gradient reduce (dp 1)"),
                           ("--tp-comm-overlap", tp_comm_overlap, "tensor-parallel collective (tp 1)")):
        if on:
            raise InputError(f"--schedule roundpipe with {flag}: RoundPipe has no {what} to overlap; drop it or "
                             "choose another schedule")
