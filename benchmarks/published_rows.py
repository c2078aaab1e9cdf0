"""The published A100 and H100 training runs pipesearch is checked against:
predicted vs published, and the device calibrations fitted from them (the
RTX 4090 run that calibrates the consumer cards is checked in
tests/test_consumer_catalog.py).

Usage:
    python benchmarks/published_rows.py            # the table of benchmarks/README.md
    python benchmarks/published_rows.py --fit a100  # refit one device type's GEMM curve
    python benchmarks/published_rows.py --fit h100

Rows (copied into tests/data/published/ with their provenance):

* Narayanan et al. SC'21 Table 1 (A100 80 GB, full recompute, interleaved),
  throughput per GPU by their eq. (3) (which counts the recomputed forward);
* Megatron-Core r0.8.0 README weak scaling (H100 80 GB, distributed
  optimizer, communication overlap on), model TFLOP/s per GPU by
  ``72 B s l h^2 (1 + s/(6h) + V/(12 l h))`` (no recompute term);
* Korthikanti et al. 2022 Table 4: one layer of a 22B GPT, forward and
  backward milliseconds.

Each run is planned as it ran: the published tp, pp, dp and global batch
pinned, Megatron-LM's even split of the blocks (embedding with the first
chunk, head with the last), the micro-batch size, the schedule (1F1B, or
interleaved with two chunks per rank) and, for the H100 runs, the recompute
mode searched, the CLI's default memory headroom (5%). (pipesearch's own
split can be faster than the even one; the runs did not use it.)

The fit (``--fit``): for each row, the constant fraction of the dense peak
(bisection) at which pipesearch reproduces the published throughput; then the
device curve ``achieved_fraction * h / (h + gemm_half_efficiency_size)``
through those (h, fraction) points, least squares in log space (for each
half-efficiency size on a grid the best ``achieved_fraction`` is the
geometric mean of the ratios). Write the result into
``hardware/devices/<device>.toml`` by hand, with the date and the rows used.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipesearch.errors import InfeasibleError  # noqa: E402
from pipesearch.hardware import load_cluster  # noqa: E402
from pipesearch.memory import preset  # noqa: E402
from pipesearch.overlap import CommOverlap  # noqa: E402
from pipesearch.profiles.transformer import TransformerConfig, layer_table, megatron_flops_eq3  # noqa: E402
from pipesearch.search import search  # noqa: E402
from pipesearch.search_options import ModelVariant, SearchOptions  # noqa: E402
from pipesearch.types import Job  # noqa: E402

DATA = ROOT / "tests" / "data" / "published"
HEADROOM = 0.05  # the CLI's default --memory-headroom
#: SC'21 trained in fp16, where Megatron-LM all-reduces the fp16 gradients
#: (its --accumulate-allreduce-grads-in-fp32 is forced on for bf16 only)
SC21_GRAD_BYTES = 2.0
#: the Megatron-Core H100 runs: data-parallel reduce-scatter and all-gather and
#: tensor-parallel communication overlapped (--overlap-grad-reduce,
#: --overlap-param-gather, --tp-comm-overlap)
H100_RUN_OVERLAP = CommOverlap(grad_reduce=True, param_gather=True, tp_forward=True)

#: Korthikanti et al. 2022 Table 4, ms: (sequence parallel, recompute) -> (forward, backward)
K22_TABLE4_MS = {
    (False, "none"): (7.7, 11.9),
    (True, "none"): (7.2, 11.8),
    (False, "full"): (7.7, 19.5),
    (False, "selective"): (7.7, 13.2),
    (True, "selective"): (7.2, 13.1),
}


def rows(name: str) -> list[dict]:
    return list(csv.DictReader(open(DATA / name)))


def _with_device(cluster, device):
    return cluster if device is None else replace(cluster, groups=tuple(replace(g, device=device)
                                                                        for g in cluster.groups))


def _gpt(row, vocab: int, seq: int) -> TransformerConfig:
    h = int(row["hidden_size"])
    return TransformerConfig(name=f"gpt-{row['params_billion']}b", num_layers=int(row["num_layers"]), hidden_size=h,
                             num_attention_heads=int(row["attention_heads"]), ffn_hidden_size=4 * h,
                             vocab_size=vocab, seq_len=seq)


def megatron_even_split(num_blocks: int, stages: int) -> tuple[int, ...] | None:
    """Megatron-LM's default split of a GPT layer table (embedding, blocks,
    head) into ``stages`` = pp x vp model chunks: the blocks divided evenly
    (``--num-layers`` must be divisible), the embedding on the first chunk and
    the head on the last. ``None`` when the blocks do not divide."""
    if num_blocks % stages:
        return None
    split = [num_blocks // stages] * stages
    split[0] += 1
    split[-1] += 1
    return tuple(split)


def plan_as_megatron_ran(variants, cluster, job, *, pp: int, dp: int, schedules, num_blocks: int):
    """The fastest plan with the published tp / pp / dp and Megatron's even
    split (:func:`megatron_even_split`), over the schedules it ran (1F1B; the
    interleaved schedule with two chunks per rank), the micro-batch size and
    the recompute mode searched."""
    best = None
    for schedule in schedules:
        vp = 2 if schedule == "interleaved-1f1b" else 1
        split = megatron_even_split(num_blocks, pp * vp)
        if split is None or (schedule == "interleaved-1f1b" and pp < 2):
            continue
        opts = SearchOptions(pp=pp, dp=dp, schedules=(schedule,), vps=(vp,), split=split, top=1)
        try:
            plan = search(variants, cluster, job, opts).plans[0]
        except InfeasibleError:
            continue
        if best is None or plan.predicted.iteration_time_s < best.predicted.iteration_time_s:
            best = plan
    if best is None:
        raise InfeasibleError(f"no plan with Megatron's even split fits pp {pp} x dp {dp}")
    return best


def predict_sc21(row, device=None) -> tuple[float, object]:
    """SC'21 Table 1 row -> (predicted TFLOP/s per GPU by eq. 3, plan)."""
    seq, vocab = 2048, 51200
    tp, pp, n = int(row["tensor_parallel"]), int(row["pipeline_parallel"]), int(row["num_gpus"])
    cl = _with_device(load_cluster("2x8-a100-80gb", nodes=n // 8), device)
    prof = layer_table(_gpt(row, vocab, seq), seq_len=seq, device=cl.device_spec(0), tp=tp,
                       sequence_parallel=False, recompute="full", tp_link=cl.intra_node, overlap_tp_backward=False)
    job = Job(int(row["global_batch_size"]), param_state=preset("megatron"), memory_headroom_fraction=HEADROOM,
              grad_bytes_per_param=SC21_GRAD_BYTES)
    plan = plan_as_megatron_ran([ModelVariant(prof, tp=tp, recompute="full")], cl, job, pp=pp, dp=n // (tp * pp),
                                schedules=("1f1b", "interleaved-1f1b"), num_blocks=int(row["num_layers"]))
    flops = megatron_flops_eq3(int(row["global_batch_size"]), seq, int(row["num_layers"]), int(row["hidden_size"]),
                               vocab)
    return flops / (n * plan.predicted.iteration_time_s) / 1e12, plan


def megatron_model_flops(B: int, s: int, l: int, h: int, V: int) -> float:
    """Megatron-LM's model FLOPs of one iteration (no recompute term):
    ``72 B s l h^2 (1 + s/(6h) + V/(12 l h))``."""
    return 72 * B * s * l * h**2 * (1 + s / (6 * h) + V / (12 * l * h))


def predict_h100(row, device=None) -> tuple[float, object]:
    """Megatron-Core H100 row -> (predicted model TFLOP/s per GPU, plan)."""
    seq, vocab = int(row["seq_len"]), int(row["vocab"])
    tp, pp, dp = int(row["tensor_parallel"]), int(row["pipeline_parallel"]), int(row["data_parallel"])
    n = int(row["num_gpus"])
    cl = _with_device(load_cluster("4x8-h100", nodes=n // 8), device)
    variants = [ModelVariant(layer_table(_gpt(row, vocab, seq), seq_len=seq, device=cl.device_spec(0), tp=tp,
                                         sequence_parallel=tp > 1, recompute=mode, tp_link=cl.intra_node,
                                         overlap_tp_forward=True),
                             tp=tp, recompute=mode) for mode in ("none", "selective", "full")]
    job = Job(int(row["global_batch_size"]), param_state=preset("megatron", "zero1"),
              memory_headroom_fraction=HEADROOM, comm_overlap=H100_RUN_OVERLAP)
    plan = plan_as_megatron_ran(variants, cl, job, pp=pp, dp=dp, schedules=("1f1b", "interleaved-1f1b"),
                                num_blocks=int(row["num_layers"]))
    flops = megatron_model_flops(int(row["global_batch_size"]), seq, int(row["num_layers"]),
                                 int(row["hidden_size"]), vocab)
    return flops / (n * plan.predicted.iteration_time_s) / 1e12, plan


def predict_k22_layer(sp: bool, recompute: str, device=None) -> tuple[float, float]:
    """Korthikanti Table 4's 22B layer -> predicted (forward ms, backward ms)."""
    cl = _with_device(load_cluster("1x8-a100-80gb"), device)
    cfg = TransformerConfig(name="gpt-22b", num_layers=48, hidden_size=6144, num_attention_heads=64,
                            ffn_hidden_size=4 * 6144, vocab_size=51200, seq_len=2048)
    prof = layer_table(cfg, device=cl.device_spec(0), tp=8, sequence_parallel=sp, recompute=recompute,
                       tp_link=cl.intra_node, micro_batch_size=4)
    block = prof.layers[1]
    return block.fwd_s * 1e3, block.bwd_s * 1e3


def _fraction_for(predict, row, base, target: float) -> float:
    """Constant fraction of peak at which ``predict(row)`` equals ``target``."""
    lo, hi = 0.05, 1.0
    for _ in range(18):
        mid = (lo + hi) / 2
        got, _ = predict(row, replace(base, achieved_fraction=mid, gemm_half_efficiency_size=0.0))
        lo, hi = (mid, hi) if got < target else (lo, mid)
    return (lo + hi) / 2


def fit(device: str) -> None:
    if device == "a100":
        data, predict, cluster = rows("megatron_sc21_table1_sample.csv"), predict_sc21, "2x8-a100-80gb"
    else:
        data, predict, cluster = rows("megatron_core_h100_sample.csv"), predict_h100, "4x8-h100"
    base = load_cluster(cluster).device_spec(0)
    pts = []
    for row in data:
        f = _fraction_for(predict, row, base, float(row["achieved_tflops_per_gpu"]))
        pts.append((int(row["hidden_size"]), f))
        print(f"h = {pts[-1][0]}: constant fraction that reproduces {row['achieved_tflops_per_gpu']} TFLOP/s: {f:.4f}")
    best = None
    for c in range(0, 8001, 10):
        logs = [math.log(f) - math.log(h / (h + c)) for h, f in pts]
        a = math.exp(sum(logs) / len(logs))
        err = sum((math.log(a * h / (h + c)) - math.log(f)) ** 2 for h, f in pts)
        if a <= 1 and (best is None or err < best[0]):
            best = (err, a, c)
    _, a, c = best
    print(f"fit: achieved_fraction = {a:.4f}, gemm_half_efficiency_size = {c}")
    for h, f in pts:
        print(f"  h = {h}: curve {a * h / (h + c):.4f} vs needed {f:.4f}")


def table() -> None:
    out = []
    for row in rows("megatron_sc21_table1_sample.csv"):
        got, plan = predict_sc21(row)
        out.append((f"SC'21 Table 1, {row['params_billion']}B, A100, tp {row['tensor_parallel']} pp "
                    f"{row['pipeline_parallel']}, {row['num_gpus']} GPUs", "TFLOP/s per GPU (eq. 3)",
                    float(row["achieved_tflops_per_gpu"]), got, _describe(plan)))
    for row in rows("megatron_core_h100_sample.csv"):
        got, plan = predict_h100(row)
        out.append((f"Megatron-Core, {row['params_billion']}B, H100, tp {row['tensor_parallel']} pp "
                    f"{row['pipeline_parallel']} dp {row['data_parallel']}, {row['num_gpus']} GPUs",
                    "model TFLOP/s per GPU", float(row["achieved_tflops_per_gpu"]), got, _describe(plan)))
    for (sp, rc), (fwd, bwd) in K22_TABLE4_MS.items():
        f, b = predict_k22_layer(sp, rc)
        what = f"Korthikanti Table 4, 22B layer, {rc} recompute{', sp' if sp else ''}"
        out.append((what, "forward ms", fwd, f, ""))
        out.append((what, "backward ms", bwd, b, ""))
    print("| run | quantity | published | predicted | error | plan |")
    print("|---|---|---:|---:|---:|---|")
    errs = {"A100": [], "H100": [], "Table 4": []}
    for what, qty, pub, got, desc in out:
        e = got / pub - 1
        errs["A100" if "A100" in what else "H100" if "H100" in what else "Table 4"].append(abs(e))
        print(f"| {what} | {qty} | {pub:g} | {got:.1f} | {100 * e:+.1f}% | {desc} |")
    print()
    print("| rows | mean abs error | max abs error |")
    print("|---|---:|---:|")
    for k, v in errs.items():
        print(f"| {k} ({len(v)}) | {100 * sum(v) / len(v):.1f}% | {100 * max(v):.1f}% |")


def _describe(plan) -> str:
    return (f"{plan.schedule}{f' v{plan.vp}' if plan.vp > 1 else ''}, mbs {plan.micro_batch_size}, "
            f"recompute {dict(plan.extra).get('recompute')}, peak {plan.predicted.peak_memory_bytes / 2**30:.1f} GiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fit", choices=("a100", "h100"), help="refit one device type's GEMM-efficiency curve")
    args = ap.parse_args()
    fit(args.fit) if args.fit else table()


if __name__ == "__main__":
    main()
