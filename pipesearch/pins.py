"""Pins of ``pipesearch plan`` checked against each other before a search:
a pin is honoured or refused with the reason, never silently dropped.

The search takes ``micro_batch_size x num_micro_batches x dp =
global_batch_size`` as given: when the three are pinned they must multiply
to the batch; when the micro-batch size and count are pinned they fix the
data-parallel degree. ``--vp`` only means something for the schedules that
run several virtual stages per device.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import InputError
from .limits import MAX_DEVICES


@dataclass(frozen=True)
class BatchPins:
    """The batch pins of a request (``None``: not pinned)."""

    global_batch_size: int
    dp: int | None = None
    micro_batch_size: int | None = None
    num_micro_batches: int | None = None


def resolve_dp(pins: BatchPins, num_devices: int) -> int | None:
    """The data-parallel degree the batch pins leave: ``pins.dp``, or the
    one that ``--micro-batch-size`` and ``--num-micro-batches`` together fix
    (``global_batch_size / (mbs x m)``), else ``None`` (free).

    Raises:
        InputError: the pins do not multiply to the global batch, or fix a
            degree larger than the cluster (``num_devices``).
    """
    b, dp, mbs, m = pins.global_batch_size, pins.dp, pins.micro_batch_size, pins.num_micro_batches
    if mbs is None or m is None:
        for flag, v in (("--num-micro-batches", m), ("--micro-batch-size", mbs), ("--dp", dp)):
            if v is not None and b % v:
                raise InputError(f"{flag} {v} does not divide --global-batch-size {b} (the global batch is dp x "
                                 f"micro-batch size x micro-batches); pick a divisor of {b} or drop {flag}")
        return dp
    if dp is not None:
        if mbs * m * dp != b:
            raise InputError(
                f"--micro-batch-size {mbs} x --num-micro-batches {m} x --dp {dp} = {mbs * m * dp}, but "
                f"--global-batch-size is {b}; the three must multiply to the global batch "
                f"(drop one of the pins to let the search choose it)")
        return dp
    if b % (mbs * m):
        raise InputError(
            f"--micro-batch-size {mbs} x --num-micro-batches {m} = {mbs * m} samples per replica does not "
            f"divide --global-batch-size {b}; pick sizes whose product divides the batch, or drop one pin")
    fixed = b // (mbs * m)
    if fixed > num_devices:
        raise InputError(
            f"--micro-batch-size {mbs} x --num-micro-batches {m} fixes dp = {b} / {mbs * m} = {fixed} replicas, "
            f"more than the cluster's {num_devices} devices; raise the sizes or drop one pin")
    return fixed


def check_fixed_dp_fits(cluster, global_batch_size: int, micro_batch_size: int, num_micro_batches: int, dp: int,
                        pp: int | None, tp: int | None) -> None:
    """Refuse the dp that ``--micro-batch-size`` and ``--num-micro-batches``
    fix (:func:`resolve_dp`) when, with the pinned ``pp`` and ``tp``, it
    needs more devices than ``cluster`` has; the message says where dp came
    from (the user typed no --dp) and counts every pinned degree."""
    need = dp * (pp or 1) * (tp or 1)
    if need <= cluster.num_devices or not (pp or tp):
        return
    parts = " x ".join([f"--pp {pp}"] * bool(pp) + [f"--tp {tp}"] * bool(tp))
    lower = " or ".join(["--pp"] * bool(pp) + ["--tp"] * bool(tp))
    raise InputError(
        f"--micro-batch-size {micro_batch_size} x --num-micro-batches {num_micro_batches} fixes dp = "
        f"{global_batch_size} / {micro_batch_size * num_micro_batches} = {dp} replicas; with {parts} that needs "
        f"{need} devices, cluster {cluster.name} has {cluster.num_devices}: raise the micro-batch size or count, or "
        f"lower {lower}")


def check_vp_pins(vps: tuple[int, ...], schedules: tuple[str, ...], multi_stage: tuple[str, ...],
                  asked: str = "--schedule asks for") -> None:
    """Refuse ``--vp`` when a requested schedule cannot honour it: a vp
    above 1 and none of them runs virtual stages (vp 1 alone: one stage per
    device, what they run), interleaved 1F1B with vp 1 the only pin (it
    needs 2 or more), vp 1 among the pins while interleaved 1F1B is the only
    schedule, or a single-stage schedule (vp 1) among them while 1 is not
    pinned. ``asked`` says where ``schedules`` come from.

    Raises:
        InputError: the pin and the schedule that cannot take it.
    """
    if vps and max(vps) > 1 and not any(s in multi_stage for s in schedules):
        raise InputError(
            f"--vp {','.join(map(str, vps))}: virtual stages apply to {' and '.join(multi_stage)} only, and "
            f"{asked} {', '.join(schedules)}; add --schedule {multi_stage[0]} or drop --vp")
    if vps and max(vps) < 2 and "interleaved-1f1b" in schedules:
        raise InputError(f"--vp {','.join(map(str, vps))} with --schedule interleaved-1f1b: interleaving needs at "
                         f"least 2 virtual stages per device; use --vp 2 or more, or --schedule 1f1b")
    if 1 in vps and schedules and set(schedules) == {"interleaved-1f1b"}:  # and a vp above 1 (above)
        raise InputError(f"--vp {','.join(map(str, vps))} with --schedule interleaved-1f1b: interleaving needs at "
                         f"least 2 virtual stages per device, so vp 1 could not be honoured; drop --vp 1, or add "
                         f"--schedule 1f1b")
    single = [s for s in schedules if s not in multi_stage]
    if vps and 1 not in vps and single:
        raise InputError(f"--vp {','.join(map(str, vps))} with --schedule {single[0]}: {single[0]} runs one stage per "
                         f"device (vp 1), so its plans could not honour the pin; drop --schedule {single[0]}, or "
                         "add --vp 1")


def parse_split(text: str) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """``--split``: layers per stage, e.g. ``5,3,4``, or layers and
    replicas per stage (per-stage replication), e.g. ``17x15,6x1`` (17
    layers on 15 replicas, then 6 layers on 1); a part ``P*K`` stands for
    ``K`` stages of ``P`` (``2,1*126,2``, as the plan table writes long
    splits). Returns ``(layers, replicas)``, ``replicas`` None without
    replicas.

    Raises:
        InputError: a part that is not ``N`` or ``NxR`` (each optionally
            ``*K``) with positive integers, or replicas given for some
            stages only.
    """
    parts = [p.strip() for p in text.split(",")]
    layers, replicas = [], []
    for part in parts:
        body, star, times = part.partition("*")
        fields = body.lower().split("x")
        if len(fields) > 2 or not all(f.isdigit() for f in fields) or (star and not times.strip().isdigit()):
            raise InputError(f"--split {text!r}: part {part!r} is not N or NxR (layers, or layers x replicas), "
                             "optionally *K for K stages alike; expected e.g. 5,3,4 or 17x15,6x1 or 2,1*126,2")
        if int(fields[-1]) < 1 or int(fields[0]) < 1 or (star and int(times) < 1):
            raise InputError(f"--split {text!r}: part {part!r} needs >= 1 layer, >= 1 replica and >= 1 stage")
        if len(layers) + (int(times) if star else 1) > MAX_DEVICES:  # every stage needs a device
            raise InputError(f"--split {text!r}: more than {MAX_DEVICES:,} stages, more than any cluster has devices")
        for _ in range(int(times) if star else 1):
            layers.append(int(fields[0]))
            if len(fields) == 2:
                replicas.append(int(fields[1]))
    if replicas and len(replicas) != len(layers):
        raise InputError(f"--split {text!r}: replicas given for {len(replicas)} of {len(layers)} stages; give NxR "
                         "for every stage or for none")
    return tuple(layers), (tuple(replicas) if replicas else None)


def split_text(layers, replicas=None) -> str:
    """``--split`` as :func:`parse_split` reads it: ``--split 5,3,4`` or
    ``--split 17x15,6x1``."""
    if replicas is None:
        return "--split " + ",".join(map(str, layers))
    return "--split " + ",".join(f"{n}x{r}" for n, r in zip(layers, replicas))
