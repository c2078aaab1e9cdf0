"""Profiled language models (token embedding, 4 blocks, head; token-id inputs)
planned and run for real with torch.distributed.pipelining on CPU: predicted
vs measured.

Usage: python benchmarks/gpt_cpu.py [--model gpt|llama] [--rounds N] [--seq-len N] [--batch-size N]

``gpt``: tests/gpt_model.py's make_bench_gpt (vocabulary 8192, width 256, 4
heads, 4 blocks). ``llama``: a HuggingFace ``LlamaForCausalLM`` built by
transformers from a tiny config (vocabulary 8192, hidden 256, 4 heads, 2
key/value heads, FFN 688, 4 layers; random weights, nothing downloaded),
chained by :func:`pipesearch.profiler.hf_causal_lm_chain`. Each is profiled
with token inputs at the given batch (one thread, CPU clock), planned for
pp=2 on the 1x2-cpu cluster with 4 micro-batches of that batch (1F1B), and
the planned split and the even 3,3 split run in two gloo processes (one
thread each), alternating them for --rounds rounds. Prints a Markdown table
as benchmarks/e2e_cpu.py does.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]  # run from a checkout

import e2e_model  # noqa: E402
import gpt_model  # noqa: E402
from e2e_cpu import cpu_model  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("gpt", "llama"), default="gpt")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8, help="micro-batch size (the profile's batch)")
    ap.add_argument("--repeats", type=int, default=10, help="profiling passes (median)")
    args = ap.parse_args(argv)
    import torch

    from pipesearch.hardware import load_cluster, load_device
    from pipesearch.plan import PlanFile, normalize
    from pipesearch.profiler import hf_model_from_config, profile_module
    from pipesearch.profiles import load_model, write_profile_csv
    from pipesearch.runtime import RunConfig, run_plans
    from pipesearch.search import search
    from pipesearch.search_options import ModelVariant, SearchOptions
    from pipesearch.types import Job

    vocab, m = gpt_model.BENCH["vocab"], 4
    tmp_cfg = tempfile.TemporaryDirectory()
    if args.model == "gpt":
        factory, what = gpt_model.make_bench_gpt, f"GPT {gpt_model.BENCH}"
    else:
        cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
               "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4, "num_attention_heads": 4,
               "num_key_value_heads": 2, "max_position_embeddings": 4096, "hidden_act": "silu",
               "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
        path = Path(tmp_cfg.name) / "config.json"
        path.write_text(json.dumps(cfg))
        factory, what = functools.partial(hf_model_from_config, path), "transformers LlamaForCausalLM " + json.dumps(
            {k: cfg[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                 "num_attention_heads", "num_key_value_heads")})
    torch.manual_seed(0)
    tokens = torch.randint(0, vocab, (args.batch_size, args.seq_len))
    measured = profile_module(factory(), tokens, batch_size=args.batch_size, warmup=3,
                              repeats=args.repeats, name=f"bench_{args.model}")
    with tempfile.TemporaryDirectory() as tmp:
        csv = Path(tmp) / "gpt.csv"
        write_profile_csv(measured, csv)
        profile = load_model(str(csv))
    cluster = load_cluster(e2e_model.CLUSTER)
    job = Job(global_batch_size=args.batch_size * m)
    configs = []
    for kind, split in (("planned", None), ("even", (3, 3))):
        opts = SearchOptions(pp=2, dp=1, num_micro_batches=m, schedules=("1f1b",), split=split)
        plan = search([ModelVariant(profile)], cluster, job, opts,
                      profiled_device=load_device(profile.profiled_device)).plans[0]
        plan = normalize(PlanFile(inputs={"model": profile.name}, search={}, plans=(plan,))).plans[0]
        configs.append(RunConfig(plan, "1f1b", kind))
    results = run_plans(factory, configs, input_shape=(args.seq_len,), vocab_size=vocab,
                        steps=1, rounds=args.rounds, warmup=1)
    print(f"# {datetime.date.today().isoformat()}, Python {platform.python_version()}, torch {torch.__version__}, "
          f"{cpu_model()}, "
          f"{os.cpu_count()} cores; {what}, sequence {args.seq_len}, micro-batch {args.batch_size}, "
          f"{m} micro-batches, {args.rounds} rounds")
    print(e2e_model.table([("1f1b", c.label, c.plan, r) for c, r in zip(configs, results)]))
    other = [r.host_other_cores for r in results if r.host_other_cores is not None]
    if other:
        print(f"\nother processes used {max(other):.2f} cores of {os.cpu_count()} meanwhile")
    tmp_cfg.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
