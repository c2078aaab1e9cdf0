"""Tests of pipesearch.export: every exporter round-trips the stage boundaries
through its own parse-back helper, and refuses with a reason what its runtime
would reject or silently run differently."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipesearch.errors import InputError
from pipesearch.export import FORMATS, export_all, export_plan
from pipesearch.export.deepspeed import stages_from_parts
from pipesearch.export.gpipe import stages_from_balance
from pipesearch.export.megatron import (
    format_layout,
    parse_layout,
    stages_from_megatron_args,
    stages_from_megatron_layout,
)
from pipesearch.export.torch import schedule_from_csv, stages_from_split_spec
from pipesearch.export.torchtitan import parse_overrides, stages_from_layers_per_stage, stages_from_module_fqns
from pipesearch.schedules import build
from pipesearch.types import Plan, Prediction, StagePlan

# ---------------------------------------------------------------- helpers


def transformer_names(blocks: int, embedding: bool = True, head: bool = True) -> list[str]:
    width = max(2, len(str(blocks - 1)))
    return (["embedding"] if embedding else []) + [f"block_{i:0{width}d}" for i in range(blocks)] + (
        ["head"] if head else [])


def profiled_names(n: int) -> list[str]:
    return [f"b{i:02d}_Conv2d" for i in range(n)]


def make_plan(counts, names=None, *, pp=None, vp=1, schedule="1f1b", m=8, mbs=2, dp=1, tp=1, **extra) -> Plan:
    """A Plan with ``counts[s]`` layers on stage ``s`` (stage s on rank s % pp);
    all predicted figures zero. ``names`` default: profiled-style names."""
    counts = list(counts)
    if pp is None:
        pp = len(counts) // vp
    n = sum(counts)
    names = list(names) if names is not None else profiled_names(n)
    assert len(names) == n
    stages, pos = [], 0
    for s, c in enumerate(counts):
        r = s % pp
        stages.append(StagePlan(
            index=s, layers=(pos, pos + c), layer_names=tuple(names[pos:pos + c]),
            devices=tuple(r * dp + d for d in range(dp)), compute_s=0.0, comm_s=0.0,
            allreduce_s=0.0, memory_bytes=0.0, send_bytes=0.0,
        ))
        pos += c
    return Plan(rank=0, pp=pp, dp=dp, tp=tp, schedule=schedule, micro_batch_size=mbs, num_micro_batches=m,
                stages=tuple(stages), predicted=Prediction(0.0, 0.0, 0.0, 0.0, 0.0), vp=vp,
                extra=tuple(extra.items()))


def plan_ranges(plan: Plan) -> list[tuple[int, int]]:
    return [tuple(s.layers) for s in plan.stages]


def assert_cover(ranges, n):
    """Every layer exactly once, in order."""
    flat = [i for a, b in ranges for i in range(a, b)]
    assert flat == list(range(n))


def roundtrip(plan: Plan, fmt: str, **kw) -> dict:
    """Export, parse back, compare with the plan's stages; returns the export."""
    exp = export_plan(plan, fmt, **kw)
    assert exp["format_version"] == 1 and isinstance(exp["notes"], list) and exp["runtime"]
    assert json.loads(json.dumps(exp)) == exp  # JSON-serializable, nothing changes on the way
    n = sum(b - a for a, b in plan_ranges(plan))
    if fmt == "torch":
        got = stages_from_split_spec(exp["split_spec"], exp["layer_modules"])
        actions, s2r = schedule_from_csv(exp["pipeline_order_csv"])
        assert actions == build(plan.schedule, plan.pp, plan.num_micro_batches, plan.vp)
        assert [s2r[s] for s in range(exp["num_stages"])] == exp["stage_to_rank"]
    elif fmt == "torchtitan":
        over = parse_overrides(exp["overrides"])
        got = stages_from_module_fqns(over["parallelism.module_fqns_per_model_part"], exp["layer_modules"])
        assert over["parallelism.module_fqns_per_model_part"] == exp["parallelism"]["module_fqns_per_model_part"]
        for section in ("parallelism", "training"):
            for key, val in exp[section].items():
                want = val if isinstance(val, (bool, list)) else str(val)
                assert over[f"{section}.{key}"] == want
        assert over["activation_checkpoint"] == exp["activation_checkpoint"]
        assert exp["argv"][4:] == exp["overrides"] and exp["command_line"].endswith(shlex.join(exp["argv"]))
        alt = exp["layers_per_stage_alternative"]
        if alt is not None:
            assert stages_from_layers_per_stage(alt, exp_blocks(plan)) == exp["parallelism"]["module_fqns_per_model_part"]
    elif fmt == "megatron":
        got = stages_from_megatron_args(exp["args"], embedding=exp["has_embedding"], head=exp["has_head"])
        if exp["layout"] is not None:
            assert stages_from_megatron_layout(exp["layout"], plan.pp) == plan_ranges(plan)
    elif fmt == "deepspeed":
        got = stages_from_parts(exp["parts"])
        assert len(exp["parts"]) == plan.pp + 1
    elif fmt == "gpipe":
        got = stages_from_balance(exp["balance"])
        assert sum(exp["balance"]) == n
    else:  # pragma: no cover
        raise AssertionError(fmt)
    assert got == plan_ranges(plan)
    assert_cover(got, n)
    return exp


def exp_blocks(plan):
    return sum(1 for s in plan.stages for n in s.layer_names if n.startswith("block_"))


# ---------------------------------------------------------------- API


def test_formats():
    assert FORMATS == ("torch", "torchtitan", "megatron", "deepspeed", "gpipe")


def test_unknown_format_lists_formats():
    plan = make_plan([2, 2], pp=2)
    with pytest.raises(InputError) as ei:
        export_plan(plan, "alpa")
    for fmt in FORMATS:
        assert fmt in str(ei.value)


def test_unknown_option_is_input_error():
    with pytest.raises(InputError, match="unexpected keyword"):
        export_plan(make_plan([2, 2], pp=2), "gpipe", allow_layout=False)


def test_malformed_plan_refused():
    plan = make_plan([2, 2], pp=2)
    bad = Plan(**{**plan.__dict__, "stages": plan.stages[:1]})
    with pytest.raises(InputError, match="pp \\* vp"):
        export_plan(bad, "torch")


def test_export_all_collects_refusals():
    plan = make_plan([3, 3, 2, 2], transformer_names(8), schedule="1f1b", m=8)
    out = export_all(plan)
    assert list(out) == list(FORMATS)
    assert "refused" in out["gpipe"] and "gpipe" in out["gpipe"]["refused"]
    for fmt in ("torch", "torchtitan", "megatron", "deepspeed"):
        assert "refused" not in out[fmt], out[fmt]
    json.dumps(out)


def test_export_all_never_raises_for_refusals():
    plan = make_plan([2, 0, 2], pp=3, schedule="gpipe", m=2)  # empty stage
    out = export_all(plan)
    for fmt in ("torch", "torchtitan", "gpipe"):
        assert "stage 1 has no layers" in out[fmt]["refused"]
    assert "TrainSchedule" in out["deepspeed"]["refused"]
    assert "not a transformer" in out["megatron"]["refused"]


# ---------------------------------------------------------------- torch


@pytest.mark.parametrize("schedule,vp,m", [
    ("gpipe", 1, 3), ("1f1b", 1, 4), ("zb-h1", 1, 6), ("looped-bfs", 1, 2),
    ("interleaved-1f1b", 2, 8), ("looped-bfs", 3, 5),
])
def test_torch_roundtrip(schedule, vp, m):
    pp = 4
    counts = [1 + (s % 3) for s in range(pp * vp)]
    plan = make_plan(counts, pp=pp, vp=vp, schedule=schedule, m=m)
    exp = roundtrip(plan, "torch")
    assert exp["stages_per_rank"] == vp
    assert exp["stage_to_rank"] == [s % pp for s in range(pp * vp)]
    assert len(exp["split_spec"]) == pp * vp - 1
    assert set(exp["split_spec"].values()) == {"SplitPoint.BEGINNING"}


def test_torch_schedule_classes():
    cls = {s: export_plan(make_plan([2] * 4 * v, pp=4, vp=v, schedule=s, m=8), "torch")["schedule_class"]
           for s, v in [("gpipe", 1), ("1f1b", 1), ("zb-h1", 1), ("interleaved-1f1b", 2), ("looped-bfs", 2)]}
    assert cls == {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "zb-h1": "ScheduleInterleavedZeroBubble",
                   "interleaved-1f1b": "ScheduleInterleaved1F1B", "looped-bfs": "ScheduleLoopedBFS"}


def test_torch_transformer_split_spec():
    plan = make_plan([5, 4, 3], transformer_names(10), schedule="gpipe", m=2)
    exp = export_plan(plan, "torch")
    # stage 1 starts at block_04, stage 2 at block_08: the children of pipesearch's chain of the HuggingFace
    # model (profiler.hf_causal_lm_chain), which the script chains one tensor at a time
    assert exp["split_spec"] == {"layers_04": "SplitPoint.BEGINNING", "layers_08": "SplitPoint.BEGINNING"}
    assert exp["layer_modules"][0] == ["embed_tokens"] and exp["layer_modules"][-1] == ["lm_head"]
    assert any("hf_model_from_config --factory-arg config.json" in n for n in exp["notes"])
    # with tensor parallelism there is no script to run it with: no such note
    exp = export_plan(make_plan([5, 4, 3], transformer_names(10), schedule="gpipe", m=2, tp=2), "torch")
    assert exp["files"] == {} and not any("hf_model_from_config" in n for n in exp["notes"])


def test_torch_split_before_head_uses_the_chains_head():
    plan = make_plan([5, 1], transformer_names(4), schedule="gpipe", m=2)
    exp = roundtrip(plan, "torch")
    assert exp["split_spec"] == {"lm_head": "SplitPoint.BEGINNING"}


def test_torch_module_names_override():
    names = ["0", "1", "2", "layer3", "fc"]
    plan = make_plan([2, 3], names, schedule="gpipe", m=2)
    exp = roundtrip(plan, "torch", module_names={"layer3": "layer3.0", "fc": ["avgpool", "fc"]})
    assert exp["split_spec"] == {"2": "SplitPoint.BEGINNING"}
    assert exp["layer_modules"][-1] == ["avgpool", "fc"]
    with pytest.raises(InputError, match="not a layer"):
        export_plan(plan, "torch", module_names={"nope": "x"})
    with pytest.raises(InputError, match="given to layers"):
        export_plan(plan, "torch", module_names={"fc": "0"})


def test_torch_refuses_1f1b_with_fewer_microbatches_than_stages():
    plan = make_plan([2, 2, 2, 2], schedule="1f1b", m=3)
    with pytest.raises(InputError) as ei:
        export_plan(plan, "torch")
    msg = str(ei.value)
    assert "Schedule1F1B" in msg and "Number of microbatches (3)" in msg and "number of stages (4)" in msg


def test_torch_refuses_other_rules():
    with pytest.raises(InputError, match="stage 1 has no layers"):
        export_plan(make_plan([2, 0, 2], pp=3, schedule="gpipe", m=2), "torch")
    with pytest.raises(InputError, match="stages_per_rank > 1"):
        export_plan(make_plan([2, 2], pp=2, schedule="interleaved-1f1b", m=4), "torch")
    with pytest.raises(InputError, match="one stage per rank"):
        export_plan(make_plan([1] * 4, pp=2, vp=2, schedule="1f1b", m=4), "torch")
    with pytest.raises(InputError, match="multiple of its number of rounds"):
        export_plan(make_plan([1] * 4, pp=4, schedule="zb-h1", m=11), "torch")
    with pytest.raises(InputError, match="m % p == 0"):  # pipesearch's interleaved builder (Megatron's rule)
        export_plan(make_plan([1] * 8, pp=4, vp=2, schedule="interleaved-1f1b", m=6), "torch")


# ---------------------------------------------------------------- torchtitan


def test_torchtitan_roundtrip_and_names():
    plan = make_plan([2, 4, 4, 2], transformer_names(10), schedule="1f1b", m=4, tp=2, dp=2,
                     recompute="full", sequence_parallel=True)
    exp = roundtrip(plan, "torchtitan")
    par = exp["parallelism"]
    assert par["pipeline_parallel_schedule"] == "1F1B"
    assert par["pipeline_parallel_degree"] == 4
    assert par["pipeline_parallel_microbatch_size"] == 2
    assert exp["training"] == {"local_batch_size": 8, "global_batch_size": 16, "disable_cuda_graphs": True}
    assert par["enable_sequence_parallel"] is True
    assert par["module_fqns_per_model_part"][0] == ["tok_embeddings", "layers.0"]
    assert par["module_fqns_per_model_part"][-1] == ["layers.9", "norm", "lm_head"]
    assert par["tensor_parallel_degree"] == 2 and par["data_parallel_replicate_degree"] == 2
    assert exp["activation_checkpoint"] == "activation-checkpoint:full"
    assert exp["overrides"][-1] == "activation-checkpoint:full"
    # no model given: placeholders, said in a note
    assert exp["argv"][:4] == ["--module", "MODULE", "--config", "CONFIG"]
    assert any(n.startswith("warning: ") and "MODULE and CONFIG" in n for n in exp["notes"])
    assert "# pipesearch knows no torchtitan config" in exp["files"]["launch_torchtitan.sh"].splitlines()[2]


def test_torchtitan_without_pipeline_parallelism_accumulates_gradients():
    """pp 1, micro-batch 2, m 4, dp 2: torchtitan's forward takes
    local_batch_size = 2 samples and runs global // (local x dp) = 16 // 4
    = 4 accumulation steps; the note says so (it claimed local // micro =
    1 pipeline micro-batch from a formula for pp > 1)."""
    plan = make_plan([12], transformer_names(10), pp=1, schedule="1f1b", m=4, dp=2)
    exp = roundtrip(plan, "torchtitan")
    assert exp["training"]["local_batch_size"] == 2 and exp["training"]["global_batch_size"] == 16
    note = next(n for n in exp["notes"] if "micro-batches" in n)
    assert "4 micro-batches are gradient accumulation steps" in note and "// pipeline_parallel" not in note


@pytest.mark.parametrize("schedule,vp,name", [
    ("gpipe", 1, "GPipe"), ("1f1b", 1, "1F1B"), ("zb-h1", 1, "InterleavedZeroBubble"),
    ("interleaved-1f1b", 2, "Interleaved1F1B"), ("looped-bfs", 2, "LoopedBFS"),
])
def test_torchtitan_schedule_names(schedule, vp, name):
    plan = make_plan([2] * (4 * vp), pp=4, vp=vp, schedule=schedule, m=8)
    assert roundtrip(plan, "torchtitan")["parallelism"]["pipeline_parallel_schedule"] == name


def test_torchtitan_layers_per_stage_alternative():
    # even split with torchtitan's default weights: 8 effective layers per stage,
    # the embedding and the head each count as one layer
    plan = make_plan([8, 8, 8, 8], transformer_names(30), m=8)
    alt = roundtrip(plan, "torchtitan")["layers_per_stage_alternative"]
    assert alt == {"pipeline_parallel_layers_per_stage": 8, "pipeline_parallel_first_stage_less_layers": 1,
                   "pipeline_parallel_last_stage_less_layers": 1}
    # interleaved, 2 stages per rank, 16 blocks -> 2 blocks per stage with weights 0
    plan = make_plan([3] + [2] * 6 + [3], transformer_names(16), pp=4, vp=2, schedule="interleaved-1f1b", m=8)
    alt = roundtrip(plan, "torchtitan")["layers_per_stage_alternative"]
    assert alt is not None and alt["pipeline_parallel_layers_per_stage"] == 2
    # a split torchtitan's recipe cannot make
    plan = make_plan([2, 7, 2, 3], transformer_names(12), m=8)
    assert roundtrip(plan, "torchtitan")["layers_per_stage_alternative"] is None


def test_torchtitan_refusals():
    with pytest.raises(InputError, match="Schedule1F1B"):
        export_plan(make_plan([2, 2, 2, 2], m=2), "torchtitan")
    with pytest.raises(InputError, match="nested"):
        export_plan(make_plan([1, 1], ["a", "b"], schedule="gpipe", m=1), "torchtitan",
                    module_names={"a": "model.layers.0"})


# ---------------------------------------------------------------- torchtitan 0.2 (job TOML)

#: every field of the sections pipesearch writes, in torchtitan tag v0.2.2
#: torchtitan/config/job_config.py (class Job, Model, Training, Parallelism,
#: ActivationCheckpoint), copied by hand: a key outside these makes 0.2.x's
#: ConfigManager._dict_to_dataclass raise ValueError
TT02_FIELDS = {
    "job": {"config_file", "dump_folder", "description", "print_config", "save_config_file", "custom_config_module"},
    "model": {"name", "flavor", "hf_assets_path", "tokenizer_path", "converters", "print_after_conversion"},
    "training": {"dataset", "dataset_path", "local_batch_size", "global_batch_size", "seq_len", "max_norm", "steps",
                 "enable_cpu_offload", "dtype", "mixed_precision_param", "mixed_precision_reduce", "gc_freq",
                 "gc_debug", "dataloader"},
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
                    "tensor_parallel_degree", "disable_loss_parallel", "enable_async_tensor_parallel",
                    "pipeline_parallel_degree", "module_fqns_per_model_part",
                    "pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers",
                    "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule",
                    "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size",
                    "pipeline_parallel_expert_parallel_overlap", "context_parallel_degree",
                    "context_parallel_load_balancer", "context_parallel_rotate_method", "expert_parallel_degree",
                    "expert_tensor_parallel_degree", "expert_parallel_comm_backend"},
    "activation_checkpoint": {"mode", "selective_ac_option", "per_op_sac_force_recompute_mm_shapes_by_fqns",
                              "early_stop", "memory_budget", "visualize_memory_budget_pareto", "preserve_rng_state",
                              "determinism_check", "debug"},
}


def _toml_of(exp: dict) -> dict:
    import tomllib

    return tomllib.loads(exp["files"]["torchtitan.toml"])


@pytest.mark.parametrize("version", ["0.2", "0.2.0", "0.2.1", "0.2.2"])
def test_torchtitan_02_toml_numbers_and_keys(version):
    """pp 4 x dp 2 x tp 2, micro-batch 2 x 4 micro-batches, 1F1B, 10 blocks
    split [embedding, block 0 | 4 | 4 | block 9, head], full recompute,
    sequence length 4096: local batch 2 x 4 = 8, global 8 x 2 = 16; the head
    is 0.2.x's norm + output."""
    plan = make_plan([2, 4, 4, 2], transformer_names(10), schedule="1f1b", m=4, tp=2, dp=2,
                     recompute="full", sequence_parallel=True)
    exp = export_plan(plan, "torchtitan", torchtitan_version=version,
                      inputs={"model": {"name": "llama3-8b", "seq_len": 4096}})
    assert exp["runtime_version"] == "0.2.2" and json.loads(json.dumps(exp)) == exp
    toml = _toml_of(exp)
    assert toml == exp["config"]
    for section, table in toml.items():
        assert set(table) <= TT02_FIELDS[section], (section, set(table) - TT02_FIELDS[section])
    par, train = toml["parallelism"], toml["training"]
    assert (par["pipeline_parallel_degree"], par["tensor_parallel_degree"]) == (4, 2)
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (2, 1)
    assert par["pipeline_parallel_microbatch_size"] == 2 and par["pipeline_parallel_schedule"] == "1F1B"
    assert train == {"local_batch_size": 8, "global_batch_size": 16, "seq_len": 4096}
    assert toml["activation_checkpoint"] == {"mode": "full"}
    assert toml["model"] == {"name": "llama3", "flavor": "8B"}
    parts = par["module_fqns_per_model_part"]
    assert parts[0] == ["tok_embeddings", "layers.0"] and parts[-1] == ["layers.9", "norm", "output"]
    assert [len(p) for p in parts] == [2, 4, 4, 3]
    assert stages_from_module_fqns(parts, exp["layer_modules"]) == plan_ranges(plan)
    assert exp["argv"] == ["--job.config_file", "torchtitan.toml"]
    script = exp["files"]["launch_torchtitan.sh"]
    assert "-m torchtitan.train" in script and '--job.config_file "$CONFIG_FILE"' in script


def test_torchtitan_02_selective_interleaved_and_placeholders():
    plan = make_plan([3] + [2] * 6 + [3], transformer_names(16), pp=4, vp=2, schedule="interleaved-1f1b", m=8,
                     recompute="selective")
    exp = export_plan(plan, "torchtitan", torchtitan_version="0.2")
    toml = _toml_of(exp)
    # torchtitan's attention is fused: the attention core recomputed in its backward, no checkpointing
    assert toml["activation_checkpoint"] == {"mode": "none"}
    assert any("every second matmul" in n for n in exp["notes"])
    assert toml["parallelism"]["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert len(toml["parallelism"]["module_fqns_per_model_part"]) == 8
    assert "seq_len" not in toml["training"]
    assert toml["model"] == {"name": "MODEL", "flavor": "FLAVOR"} and any("flavor" in n for n in exp["notes"])
    # torchtitan's own recipe with the 0.2 names gives the same parts (2 blocks per stage, weights 0)
    from pipesearch.export.torchtitan import generate_llm_fqn_per_model_part

    alt = exp["layers_per_stage_alternative"]
    assert alt is not None
    assert generate_llm_fqn_per_model_part(8, 16, alt["pipeline_parallel_first_stage_less_layers"],
                                           alt["pipeline_parallel_last_stage_less_layers"],
                                           ("norm", "output")) == toml["parallelism"]["module_fqns_per_model_part"]


def test_torchtitan_version_refusals():
    plan = make_plan([2, 2], schedule="gpipe", m=2)
    with pytest.raises(InputError, match="'0.1'"):
        export_plan(plan, "torchtitan", torchtitan_version="0.1")
    with pytest.raises(InputError, match="--module/--config"):
        export_plan(plan, "torchtitan", torchtitan_version="0.2", module="llama3")
    with pytest.raises(InputError, match="Schedule1F1B"):  # the torch rules hold for 0.2 too
        export_plan(make_plan([2, 2, 2, 2], m=2), "torchtitan", torchtitan_version="0.2")
    assert export_plan(plan, "torchtitan", torchtitan_version="0.3.0") == export_plan(plan, "torchtitan")


# ---------------------------------------------------------------- megatron


def test_megatron_layout_grammar():
    # Megatron's own example (PipelineParallelLayerLayout.parse_str_to_list docstring)
    got = parse_layout("Ettt|(tt|)*29,m|L")
    assert got == [["E", "t", "t", "t"]] + [["t", "t"]] * 29 + [["m"], ["L"]]
    stages = [["E", "t"], ["t", "t"], ["t", "t"], ["t"], [], ["t", "L"]]
    assert parse_layout(format_layout(stages)) == stages


def test_megatron_uneven_layout_by_hand():
    """30 blocks on pp=4 as [embedding + 7 blocks | 8 | 8 | 7 blocks + head]:
    layers are embedding (0), block_00..block_29 (1..30), head (31); stage
    ranges (0, 8), (8, 16), (16, 24), (24, 32). Layout: 'E' then 7 't' | 8 't'
    | 8 't' | 7 't' then 'L' = "Et*7|(t*8|)*2,t*7L". The same split is
    Megatron's account-for flags: (30 + 1 + 1) / 4 = 8 layers per stage, one
    fewer transformer layer on the first (embedding) and last (loss) stage."""
    plan = make_plan([8, 8, 8, 8], transformer_names(30), m=8, mbs=1, dp=2)
    exp = roundtrip(plan, "megatron")
    assert exp["layout"] == "Et*7|(t*8|)*2,t*7L"
    assert parse_layout(exp["layout"]) == [["E"] + ["t"] * 7, ["t"] * 8, ["t"] * 8, ["t"] * 7 + ["L"]]
    assert stages_from_megatron_layout(exp["layout"], 4) == [(0, 8), (8, 16), (16, 24), (24, 32)]
    args = exp["args"]
    assert args[:6] == ["--num-layers", "30", "--pipeline-model-parallel-size", "4",
                        "--tensor-model-parallel-size", "1"]
    assert "--account-for-embedding-in-pipeline-split" in args
    assert "--account-for-loss-in-pipeline-split" in args
    assert args[args.index("--global-batch-size") + 1] == "16"  # mbs 1 * m 8 * dp 2
    # the same plan where only the layout string can express it
    plan = make_plan([7, 10, 8, 7], transformer_names(30), m=8)
    exp = roundtrip(plan, "megatron")
    assert exp["args"][exp["args"].index("--pipeline-model-parallel-layout") + 1] == "Et*6|t*10|t*8|t*6L"


def test_megatron_first_last_flags():
    # blocks per stage [7, 8, 8, 6]: only first=7 / last=6 with 16 / 2 = 8 in the middle
    plan = make_plan([8, 8, 8, 7], transformer_names(29), m=4)
    exp = roundtrip(plan, "megatron")
    a = exp["args"]
    assert a[a.index("--decoder-first-pipeline-num-layers") + 1] == "7"
    assert a[a.index("--decoder-last-pipeline-num-layers") + 1] == "6"


def test_megatron_even_and_interleaved():
    plan = make_plan([4, 4, 4, 4], transformer_names(16, embedding=False, head=False), m=4)
    exp = roundtrip(plan, "megatron")
    assert not any(a.startswith("--decoder") or a.startswith("--account") for a in exp["args"])
    assert exp["layout"] is None
    # interleaved, 32 blocks on pp=4, vp=2 -> 4 per virtual stage
    counts = [5] + [4] * 6 + [5]
    plan = make_plan(counts, transformer_names(32), pp=4, vp=2, schedule="interleaved-1f1b", m=8)
    exp = roundtrip(plan, "megatron")
    a = exp["args"]
    assert a[a.index("--num-layers-per-virtual-pipeline-stage") + 1] == "4"


def test_megatron_t5_interleaving_note_only_without_a_decoder_only_config():
    """Megatron refuses interleaving for T5: said of an interleaved plan of a
    layer profile (its model could be one), never of a transformer config,
    which the export takes only decoder-only (T5 is refused outright)."""
    counts = [5] + [4] * 6 + [5]
    plan = make_plan(counts, transformer_names(32), pp=4, vp=2, schedule="interleaved-1f1b", m=8)
    t5 = "Megatron refuses interleaving for encoder-decoder (T5) models."
    assert t5 in export_plan(plan, "megatron")["notes"]
    cfg = {"hidden_size": 1024, "num_attention_heads": 16, "ffn_hidden_size": 4096, "vocab_size": 32000,
           "num_layers": 32, "seq_len": 2048}
    exp = export_plan(plan, "megatron", inputs={"model": {"name": "gpt", "transformer": cfg}})
    assert "--num-layers-per-virtual-pipeline-stage" in exp["args"] and t5 not in exp["notes"]


def test_torchtitan_one_replica_note():
    """A plan of one data-parallel replica has nothing to shard or all-reduce:
    both degrees 1, and the note says so (not "FSDP2 over the data-parallel
    ranks")."""
    for dp, sharding in ((2, "fsdp"), (1, "none"), (1, "fsdp")):
        plan = make_plan([2, 4, 4, 2], transformer_names(10), m=4, dp=dp)
        exp = export_plan(plan, "torchtitan", inputs={"model": {"name": "llama3-8b", "seq_len": 4096},
                                                      "job": {"optimizer_state": {"sharding": sharding}}})
        if dp == 2:  # the state sharded over two replicas: FSDP2 over them
            assert exp["parallelism"]["data_parallel_shard_degree"] == 2
            assert any(n.startswith("data_parallel_shard_degree = 2: FSDP2") for n in exp["notes"])
            continue
        par = exp["parallelism"]
        assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (1, 1)
        assert any(n.startswith("one data-parallel replica: nothing to shard or all-reduce") for n in exp["notes"])
        assert not any("FSDP2 over the data-parallel ranks" in n for n in exp["notes"])


def test_megatron_refuses_interleaving_without_layout():
    """40 blocks, pp=8, vp=2: 16 virtual stages cannot hold 40 layers evenly
    (40 % 16 = 8), and the blocks-only plan gives no place for E and L, so no
    layout string either."""
    counts = [3] * 8 + [2] * 8
    plan = make_plan(counts, transformer_names(40, embedding=False, head=False), pp=8, vp=2,
                     schedule="interleaved-1f1b", m=16)
    with pytest.raises(InputError) as ei:
        export_plan(plan, "megatron")
    msg = str(ei.value)
    assert "divisible" in msg and "40 % 16 = 8" in msg and "layout" in msg
    # with explicit embedding/head a layout exists, unless the Megatron version has none
    counts = [4] + [3] * 7 + [2] * 7 + [3]
    plan = make_plan(counts, transformer_names(40), pp=8, vp=2, schedule="interleaved-1f1b", m=16)
    exp = roundtrip(plan, "megatron")
    assert "--pipeline-model-parallel-layout" in exp["args"]
    with pytest.raises(InputError, match="divisible"):
        export_plan(plan, "megatron", allow_layout=False)
    # 32 blocks divide into 16 virtual stages of 2: the refusal names the plan's unequal stages (it said
    # "needs the 32 layers divisible ... (32 % 16 = 0)", as if that were the reason)
    counts = [1, 3] + [2] * 14
    plan = make_plan(counts, transformer_names(32, embedding=False, head=False), pp=8, vp=2,
                     schedule="interleaved-1f1b", m=16)
    with pytest.raises(InputError) as ei:
        export_plan(plan, "megatron", allow_layout=False)
    assert "gives each of the pp*vp = 16 virtual stages 2 layers, and the plan's have [1, 3, 2" in str(ei.value)
    assert "% 16 = 0" not in str(ei.value)


def test_megatron_other_refusals():
    with pytest.raises(InputError, match="not a transformer"):
        export_plan(make_plan([2, 2]), "megatron")
    with pytest.raises(InputError, match="not divisible by pipeline-model-parallel-size"):
        export_plan(make_plan([3] * 8, transformer_names(22), pp=4, vp=2, schedule="interleaved-1f1b", m=6),
                    "megatron")
    for sched in ("gpipe", "zb-h1", "looped-bfs"):
        with pytest.raises(InputError, match="no .* schedule"):
            export_plan(make_plan([4, 4], transformer_names(6), schedule=sched, m=4), "megatron")


def test_megatron_recompute_and_sp():
    names = transformer_names(8)
    a = export_plan(make_plan([5, 5], names, tp=2, recompute="full", sequence_parallel=True), "megatron")["args"]
    assert a[a.index("--recompute-granularity") + 1] == "full"
    assert a[a.index("--recompute-method") + 1] == "uniform"
    assert "--sequence-parallel" in a
    a = export_plan(make_plan([5, 5], names, recompute="selective", sequence_parallel=True), "megatron")["args"]
    assert a[a.index("--recompute-granularity") + 1] == "selective"
    assert "--recompute-method" not in a and "--sequence-parallel" not in a  # tp=1: Megatron turns sp off


# ---------------------------------------------------------------- deepspeed


def test_deepspeed_roundtrip_and_config():
    plan = make_plan([3, 5, 4], schedule="1f1b", m=6, mbs=4, dp=2, recompute="full")
    exp = roundtrip(plan, "deepspeed")
    assert exp["parts"] == [0, 3, 8, 12]
    assert exp["config"] == {"train_batch_size": 48, "train_micro_batch_size_per_gpu": 4,
                             "gradient_accumulation_steps": 6, "zero_optimization": {"stage": 0}}
    assert json.loads(exp["files"]["ds_config.json"]) == exp["config"]
    zero = export_plan(plan, "deepspeed", inputs={"job": {"zero1": True}, "model": {"kind": "transformer"}})
    assert zero["config"]["zero_optimization"] == {"stage": 1} and zero["config"]["bf16"] == {"enabled": True}
    assert exp["pipeline_module"]["activation_checkpoint_interval"] == 1
    assert exp["pipeline_module"]["partition_method"] is None
    assert "_set_bounds" in exp["partition_recipe"]
    compile(exp["partition_recipe"], "<recipe>", "exec")
    even = roundtrip(make_plan([4, 4, 4], m=6), "deepspeed")
    assert even["pipeline_module"]["partition_method"] == "uniform"


def test_deepspeed_refuses_empty_stage():
    with pytest.raises(InputError) as ei:
        export_plan(make_plan([3, 0, 4], schedule="1f1b", m=4), "deepspeed")
    assert "stage 1 has no layers" in str(ei.value)


def test_deepspeed_refuses_other_schedules():
    for sched in ("gpipe", "zb-h1"):
        with pytest.raises(InputError, match="TrainSchedule"):
            export_plan(make_plan([2, 2], schedule=sched, m=4), "deepspeed")


# ---------------------------------------------------------------- gpipe


def test_gpipe_roundtrip():
    plan = make_plan([3, 1, 2], schedule="gpipe", m=5, mbs=3, dp=2, recompute="full")
    exp = roundtrip(plan, "gpipe")
    assert exp["balance"] == [3, 1, 2] and exp["chunks"] == 5 and exp["checkpoint"] == "always"
    assert exp["batch_size"] == 15
    assert exp["devices"] == [[0, 2, 4], [1, 3, 5]]
    assert roundtrip(make_plan([1, 1], schedule="gpipe", m=1), "gpipe")["checkpoint"] == "never"


def test_gpipe_refusals():
    with pytest.raises(InputError, match="fill-drain"):
        export_plan(make_plan([2, 2], schedule="1f1b", m=4), "gpipe")
    with pytest.raises(InputError, match="positive"):
        export_plan(make_plan([2, 0], schedule="gpipe", m=4), "gpipe")
    with pytest.raises(InputError, match="tensor parallelism"):
        export_plan(make_plan([2, 2], schedule="gpipe", m=4, tp=2), "gpipe")


def test_gpipe_one_stage_runs_only_what_every_schedule_runs():
    """One stage, several micro-batches: torchgpipe still runs all forwards
    first (every micro-batch's activations held, not 1F1B's one), so a 1F1B
    plan is refused; with one micro-batch every schedule is the same run."""
    with pytest.raises(InputError, match="all 4 forwards before the backwards"):
        export_plan(make_plan([4], schedule="1f1b", m=4), "gpipe")
    assert roundtrip(make_plan([4], schedule="1f1b", m=1), "gpipe")["chunks"] == 1
    assert roundtrip(make_plan([4], schedule="gpipe", m=4), "gpipe")["chunks"] == 4


# ---------------------------------------------------------------- properties


@st.composite
def plans(draw, transformer: bool):
    pp = draw(st.integers(1, 4))
    vp = draw(st.integers(1, 3)) if pp > 1 else 1
    counts = draw(st.lists(st.integers(1, 4), min_size=pp * vp, max_size=pp * vp))
    n = sum(counts)
    if transformer:
        if n < 3:
            counts[-1] += 3 - n
            n = 3
        names = transformer_names(n - 2)
    else:
        names = profiled_names(n)
    if vp > 1:
        schedule = draw(st.sampled_from(["interleaved-1f1b", "looped-bfs"]))
    else:
        schedule = draw(st.sampled_from(["gpipe", "1f1b", "zb-h1", "looped-bfs"]))
    m = pp * draw(st.integers(1, 3))
    return make_plan(counts, names, pp=pp, vp=vp, schedule=schedule, m=m,
                     recompute=draw(st.sampled_from(["none", "selective", "full"])))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans(transformer=False))
def test_property_roundtrip_profiled(plan):
    for fmt in ("torch", "torchtitan"):
        roundtrip(plan, fmt)
    if plan.vp == 1 and plan.schedule == "gpipe":
        roundtrip(plan, "gpipe")
    if plan.vp == 1 and plan.schedule == "1f1b":
        roundtrip(plan, "deepspeed")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans(transformer=True))
def test_property_roundtrip_transformer(plan):
    for fmt in ("torch", "torchtitan"):
        roundtrip(plan, fmt)
    if plan.schedule in ("1f1b", "interleaved-1f1b") and not (plan.vp > 1 and plan.pp < 2):
        roundtrip(plan, "megatron")  # a layout always exists with explicit embedding and head
    out = export_all(plan)
    assert list(out) == list(FORMATS)
    json.dumps(out)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.data())
def test_property_megatron_blocks_only(pp, vp, data):
    """Blocks-only plans: either exported (and round-tripped through the flags
    Megatron reads) or refused with the reason: layers that do not divide,
    or equal virtual stages the plan's are not."""
    if pp == 1:
        vp = 1
    counts = data.draw(st.lists(st.integers(1, 4), min_size=pp * vp, max_size=pp * vp))
    plan = make_plan(counts, transformer_names(sum(counts), False, False), pp=pp, vp=vp,
                     schedule="interleaved-1f1b" if vp > 1 else "1f1b", m=2 * pp)
    try:
        exp = roundtrip(plan, "megatron")
    except InputError as exc:
        assert "cannot express the split" in str(exc) and ("divisible" in str(exc) or "and the plan's have" in str(exc))
    else:
        assert "--pipeline-model-parallel-layout" not in exp["args"]


def test_parse_helpers_reject_malformed_input():
    mods = [["a"], ["b"], ["c"]]
    assert stages_from_split_spec({"b": "SplitPoint.BEGINNING"}, mods) == [(0, 1), (1, 3)]
    with pytest.raises(InputError, match="BEGINNING"):
        stages_from_split_spec({"b": "SplitPoint.END"}, mods)
    with pytest.raises(InputError, match="not the first module"):
        stages_from_split_spec({"z": "SplitPoint.BEGINNING"}, mods)
    with pytest.raises(InputError, match="expected modules"):
        stages_from_module_fqns([["a", "c"], ["b"]], mods)
    with pytest.raises(InputError, match="cover"):
        stages_from_module_fqns([["a"], ["b"]], mods)
    with pytest.raises(InputError):
        stages_from_parts([0, 3, 2])
    with pytest.raises(InputError, match="positive"):
        stages_from_balance([2, 0])
    with pytest.raises(InputError, match="invalid layer character"):
        parse_layout("Et*3|x|L")
    with pytest.raises(InputError, match="first layer must be embedding"):
        stages_from_megatron_layout("t*3|EL", 2)


def test_megatron_refuses_empty_end_stage():
    plan = make_plan([0, 4, 2], transformer_names(4), pp=3, schedule="1f1b", m=3)
    with pytest.raises(InputError, match="first or last stage is empty"):
        export_plan(plan, "megatron")
    # an empty middle stage is fine for a layout ("(empty stage)" in Megatron's pretty_repr)
    plan = make_plan([3, 0, 3], transformer_names(4), pp=3, schedule="1f1b", m=3)
    exp = roundtrip(plan, "megatron")
    assert exp["layout"] == "Et*2||t*2L"


def test_torchrun_prefix_fills_nodes_and_says_what_is_left():
    from pipesearch.export import Inputs, shell_command, torchrun_prefix

    nodes_of_8 = Inputs(cluster={"groups": [{"devices_per_node": 8}]})
    argv, note = torchrun_prefix(16, nodes_of_8)
    # two nodes: torchrun's static rendezvous, the node's index and node 0's address from the shell
    assert argv == ["torchrun", "--nnodes", "2", "--nproc-per-node", "8", "--node-rank", '"${NODE_RANK:?}"',
                    "--master-addr", '"${MASTER_ADDR:?}"', "--master-port", '"${MASTER_PORT:-29500}"']
    assert "each of the 2 nodes" in note and "NODE_RANK" in note
    line = shell_command(argv + ["train.py"])
    assert '--node-rank "${NODE_RANK:?}"' in line and '--master-port "${MASTER_PORT:-29500}"' in line
    # the shell expands them: node 1 of the job
    out = subprocess.run(["bash", "-c", line.replace("torchrun", "printf '%s\\n'", 1)],
                         env={"NODE_RANK": "1", "MASTER_ADDR": "10.0.0.2"}, capture_output=True, text=True)
    assert out.stdout.split() == ["--nnodes", "2", "--nproc-per-node", "8", "--node-rank", "1", "--master-addr", "10.0.0.2",
                                  "--master-port", "29500", "train.py"]
    argv, note = torchrun_prefix(15, nodes_of_8)  # 15 = 8 + 7: the last node runs 7
    assert argv[2:6] == ["2", "--nproc-per-node", "8", "--node-rank"]
    assert "on the last node pass --nproc-per-node 7" in note and "1 device(s)" in note
    assert torchrun_prefix(6, Inputs()) == (["torchrun", "--nnodes", "1", "--nproc-per-node", "6"], None)


def test_every_export_has_the_common_keys():
    plan = make_plan([4, 4], transformer_names(6), schedule="1f1b", m=4)
    for fmt, exp in export_all(plan).items():
        if "refused" in exp:
            continue
        assert {"runtime", "runtime_version", "format_version", "notes", "files"} <= set(exp), fmt
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in exp["files"].items())


def test_per_stage_recompute_exports_when_the_stages_agree():
    """A plan whose stages each chose their recompute (recompute =
    per-stage) exports with that one setting when every stage chose the same
    (here all 'none', or all 'full'); stages that differ are refused,
    naming them, where the runtime applies one setting to all stages; torch's
    script checkpoints each stage on its own and takes them."""
    from dataclasses import replace as dc_replace

    from pipesearch.export import recompute_mode

    base = make_plan([2, 2], recompute="per-stage")

    def with_options(*opts):
        return dc_replace(base, stages=tuple(dc_replace(st, memory_option=o) for st, o in zip(base.stages, opts)))

    assert recompute_mode(with_options("none", "none"), "torch") == "none"
    assert recompute_mode(with_options("on-device", "on-device"), "torch") == "none"
    assert recompute_mode(with_options("full", "full"), "megatron") == "full"
    # a layer profile's stages: --recompute selective / full need a transformer, so the fix is none (or torch)
    with pytest.raises(InputError, match=r"stage 0 full, stage 1 none.*--recompute none \(a layer profile.*torch"):
        recompute_mode(with_options("full", "none"), "megatron")
    exp = export_plan(with_options("full", "none"), "torch")
    assert "STAGE_RECOMPUTE = ['full', 'none']" in exp["files"]["pipeline_torch.py"]
    assert any(n.startswith("recompute='full' on stage 0:") for n in exp["notes"])


def test_torchtitan_llama3_configs_are_llama31():
    """torchtitan 0.3.0's llama3_8b is Llama-3.1-8B (its hf_assets_path):
    both catalog 8B models get it, and Llama-3 8B's export says which
    release that config loads and how to point it at Llama-3's files."""
    plan = make_plan([2, 4, 4, 2], transformer_names(10), schedule="1f1b", m=4, tp=2, dp=2)
    for name, noted in (("llama3-8b", True), ("llama3.1-8b", False)):
        exp = export_plan(plan, "torchtitan", inputs={"model": {"name": name, "seq_len": 4096}})
        assert exp["argv"][:4] == ["--module", "llama3", "--config", "llama3_8b"]
        notes = [n for n in exp["notes"] if "Llama-3.1-8B" in n]
        assert bool(notes) == noted
        if noted:
            assert "--hf_assets_path" in notes[0] and "same shapes as llama3-8b" in notes[0]
    toml = export_plan(plan, "torchtitan", torchtitan_version="0.2",
                       inputs={"model": {"name": "llama3.1-8b", "seq_len": 4096}})["config"]
    assert toml["model"] == {"name": "llama3", "flavor": "8B"}


def test_torchtitan_config_for_a_model_of_a_known_shape():
    """A model planned from its own config file with Llama 3 8B's shapes
    (Llama Team 2024, Table 3: 32 layers, width 4096, FFN 14,336, 32 heads,
    8 key/value heads, a 128K vocabulary, RoPE base 500,000) exports with torchtitan's
    llama3_8b, saying so, where it got MODULE / CONFIG placeholders; one
    layer fewer is no config torchtitan has."""
    shape = {"kind": "decoder", "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_kv_heads": 8,
             "head_dim": 128, "ffn_hidden_size": 14336, "vocab_size": 128256, "gated_mlp": True,
             "tied_embeddings": False, "norm": "rmsnorm", "bias": False, "qkv_bias": False, "qk_norm": False,
             "position_embedding": "rotary", "rope_theta": 500000.0, "rope_scaling_type": None,
             "rope_scaling_factor": None}
    plan = make_plan([9, 8, 8, 9], transformer_names(32), schedule="1f1b", m=4)
    exp = export_plan(plan, "torchtitan", inputs={"model": {"name": "my-llama", "seq_len": 4096, "transformer": shape}})
    assert exp["argv"][:4] == ["--module", "llama3", "--config", "llama3_8b"]
    assert any("has the shapes of llama3-8b" in n for n in exp["notes"])
    exp = export_plan(plan, "torchtitan", inputs={"model": {"name": "my-llama", "seq_len": 4096,
                                                             "transformer": shape | {"num_layers": 31}}})
    assert exp["argv"][:4] == ["--module", "MODULE", "--config", "CONFIG"]


def test_torch_recompute_notes_name_the_script_only_where_it_is_written():
    """With tp > 1 the torch export writes no pipeline_torch.py (it has no
    tensor parallelism), so its recompute notes cannot say what that script
    does; with tp 1 they do, and the script is among the files."""
    names = transformer_names(8)
    for tp, rc in ((2, "selective"), (2, "full"), (1, "selective"), (1, "full")):
        exp = export_plan(make_plan([5, 5], names, tp=tp, recompute=rc, sequence_parallel=tp > 1), "torch")
        notes = " ".join(exp["notes"])
        assert ("pipeline_torch.py" in (exp.get("files") or {})) == (tp == 1)
        assert ("no pipeline_torch.py" in notes) == (tp > 1)
        said = "pipeline_torch.py keeps every activation" in notes or "pipeline_torch.py checkpoints" in notes
        assert said == (tp == 1), (tp, rc, notes)


def test_training_precision_follows_the_rule_the_plan_was_timed_by():
    """The exports' precision of a profile is the one its plan was timed at
    (costs.profile_precision: fp32 for 4-byte parameters, the 16-bit rate
    for any other size); a transformer table is 16-bit; unknown inputs
    say nothing."""
    from pipesearch.costs import profile_precision
    from pipesearch.export import Inputs

    from helpers import tiny_profile

    for bpp in (1.0, 2.0, 4.0, 8.0):
        timed = profile_precision(replace(tiny_profile([1.0]), bytes_per_param=bpp))
        got = Inputs.of({"model": {"kind": "profile", "bytes_per_param": bpp}}).training_precision
        assert got == ("fp32" if timed == "fp32" else "16-bit"), bpp
    assert Inputs.of({"model": {"kind": "transformer", "bytes_per_param": 4.0}}).training_precision == "16-bit"
    assert Inputs.of({"model": {}}).training_precision is None
