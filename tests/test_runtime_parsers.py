"""Exports checked by the runtimes' own code: torchtitan 0.3.0's ConfigManager
and pipeline splitter, megatron-core's layer-count and layout code,
Megatron-LM's own argument parser (``parse_args`` + ``validate_args``, where
Megatron-LM is importable; it is not on the package index), DeepSpeed's
config class and PipelineModule bounds. Each test skips cleanly when its
runtime is not installed.

The expected values are derived from the plan's own fields (pp, dp, tp, m,
micro-batch size, the layer names of each stage), never from the export."""

from __future__ import annotations

import importlib
import json
import sys
from dataclasses import replace

import pytest
from click.testing import CliRunner

from pipesearch.cli import main
from pipesearch.errors import InputError
from pipesearch.export import export_plan
from pipesearch.plan import load_plan_file

from test_export import make_plan, transformer_names

# ---------------------------------------------------------------- plans


@pytest.fixture(scope="module")
def llama_plan_file(tmp_path_factory):
    """The README's case: Llama-3 8B on 2 nodes of 8 H100, global batch 512."""
    out = tmp_path_factory.mktemp("plans") / "llama.json"
    res = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--cluster", "4x8-h100", "--nodes", "2",
                                    "-b", "512", "--top", "8", "-q", "-o", str(out)])
    assert res.exit_code == 0, res.output
    return load_plan_file(out)


def stage_blocks(plan, s):
    """Indices of the transformer blocks of stage ``s`` (from the plan's layer names)."""
    return [int(n.split("_")[1]) for n in plan.stages[s].layer_names if n.startswith("block_")]


def hand_plans():
    """Hand-made llama3-8b plans for the split forms (1F1B even,
    first/last-stage layers, interleaved; GPipe and ZB-H1 for the torch-based runtimes; tp 1 and 2)."""
    n = transformer_names(32)
    out = [
        make_plan([9, 8, 8, 9], n, schedule="1f1b", m=8, mbs=1, dp=4, tp=1),          # even
        make_plan([11, 8, 8, 7], n, schedule="1f1b", m=16, mbs=2, dp=2, tp=2, sequence_parallel=True,
                  recompute="selective"),                                             # first/last-stage layers
        make_plan([5, 4, 4, 4, 4, 4, 4, 5], n, pp=4, vp=2, schedule="interleaved-1f1b", m=8, mbs=1, dp=2,
                  tp=2, sequence_parallel=True, recompute="full"),                    # interleaved
        make_plan([17, 17], n, schedule="gpipe", m=4, mbs=4, dp=8, tp=1),
        make_plan([17, 17], n, schedule="zb-h1", m=4, mbs=4, dp=4, tp=2),
    ]
    return out


# ---------------------------------------------------------------- torchtitan 0.3.0

TORCH_CLASS = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved-1f1b": "ScheduleInterleaved1F1B",
               "zb-h1": "ScheduleInterleavedZeroBubble", "looped-bfs": "ScheduleLoopedBFS"}


def _torchtitan():
    pytest.importorskip("torchtitan")
    try:
        importlib.import_module("torchtitan.models.llama3.config_registry")
    except ImportError as exc:  # torchtitan's model code imports triton
        pytest.skip(f"torchtitan's llama3 config registry does not import here: {exc}")
    from torchtitan.config import ConfigManager

    return ConfigManager


def _parse_titan(argv):
    cm = _torchtitan()
    return cm().parse_args(list(argv))


def _titan_exports(plan_file):
    out = []
    for plan in list(plan_file.plans) + hand_plans():
        try:
            out.append((plan, export_plan(plan, "torchtitan", inputs=plan_file.inputs)))
        except Exception as exc:  # refusals are tested elsewhere
            assert "torchtitan" in str(exc)
    assert len(out) >= 5
    return out


@pytest.mark.slow
def test_torchtitan_config_manager_parses_every_export(llama_plan_file):
    _torchtitan()  # skips where torchtitan (and torch) are not installed
    from torch.distributed.pipelining.schedules import get_schedule_class
    from torchtitan.distributed.activation_checkpoint import FullAC

    for plan, exp in _titan_exports(llama_plan_file):
        cfg = _parse_titan(exp["argv"])
        par, tr = cfg.parallelism, cfg.training
        m, mbs = plan.num_micro_batches, plan.micro_batch_size
        assert exp["argv"][:4] == ["--module", "llama3", "--config", "llama3_8b"]
        assert par.pipeline_parallel_degree == plan.pp
        assert get_schedule_class(par.pipeline_parallel_schedule).__name__ == TORCH_CLASS[plan.schedule]
        assert par.pipeline_parallel_microbatch_size == mbs
        assert tr.global_batch_size == mbs * m * plan.dp
        if plan.pp > 1:  # _build_pipeline_schedule: local // microbatch size micro-batches
            assert tr.local_batch_size // par.pipeline_parallel_microbatch_size == m
        else:  # no pipeline: each forward is local_batch_size samples, m accumulation steps (Trainer.__init__)
            assert tr.local_batch_size == mbs
            assert tr.global_batch_size // (tr.local_batch_size * plan.dp) == m
        assert (par.data_parallel_replicate_degree, par.data_parallel_shard_degree) == (plan.dp, 1)
        assert par.tensor_parallel_degree == plan.tp
        assert tr.seq_len == 8192
        assert tr.disable_cuda_graphs is (plan.pp > 1)
        rc = dict(plan.extra).get("recompute", "none")
        ac = cfg.activation_checkpoint
        # fused attention is pipesearch's selective: no checkpointing but for full
        assert isinstance(ac, FullAC.Config) if rc == "full" else ac is None
        parts = par.module_fqns_per_model_part
        assert len(parts) == plan.pp * plan.vp
        for s, part in enumerate(parts):
            assert [int(f.split(".")[1]) for f in part if f.startswith("layers.")] == stage_blocks(plan, s)
        assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "lm_head"]


@pytest.mark.slow
def test_torchtitan_refuses_pipeline_without_disable_cuda_graphs(llama_plan_file, capsys):
    _torchtitan()
    plan = next(p for p in llama_plan_file.plans if p.pp > 1)
    argv = export_plan(plan, "torchtitan", inputs=llama_plan_file.inputs)["argv"]
    assert "--training.disable_cuda_graphs" in argv
    with pytest.raises(SystemExit) as ei:  # tyro reports the config's ValueError and exits with status 2
        _parse_titan([a for a in argv if a != "--training.disable_cuda_graphs"])
    assert ei.value.code == 2
    assert "CUDA graphs do not support pipeline parallelism" in capsys.readouterr().err


def test_torchtitan_known_configs_have_the_catalog_shape():
    _torchtitan()
    from torchtitan.models.llama3 import model_registry

    from pipesearch.catalog import resolve
    from pipesearch.export.torchtitan import TORCHTITAN_CONFIGS
    from pipesearch.profiles.transformer import load_transformer

    from torchtitan.models.qwen3 import model_registry as qwen3_registry

    flavors = {"llama3_8b": "8B", "llama3_70b": "70B", "qwen3_1_7b": "1.7B", "qwen3_32b": "32B"}
    registries = {"llama3": model_registry, "qwen3": qwen3_registry}
    for name, (module, config) in TORCHTITAN_CONFIGS.items():
        tt = registries[module](flavors[config], attn_backend="flex").model
        ours = load_transformer(resolve("model", name))
        assert len(tt.layers) == ours.num_layers
        assert tt.dim == ours.hidden_size and tt.vocab_size == ours.vocab_size
        attn = tt.layers[0].attention
        assert attn.n_heads == ours.num_attention_heads and attn.n_kv_heads == ours.num_kv_heads


def test_fqn_recipe_matches_torchtitan():
    _torchtitan()
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part

    from pipesearch.errors import InputError
    from pipesearch.export.torchtitan import generate_llm_fqn_per_model_part

    for layers in (1, 2, 5, 6, 32):
        for stages in range(1, 9):
            for iw in (0, 1, 2):
                for ow in (0, 1, 2):
                    try:
                        want = _generate_llm_fqn_per_model_part(stages, layers, iw, ow)
                    except ValueError:
                        with pytest.raises(InputError):
                            generate_llm_fqn_per_model_part(stages, layers, iw, ow)
                        continue
                    assert generate_llm_fqn_per_model_part(stages, layers, iw, ow) == want


@pytest.mark.slow
@pytest.mark.parametrize("counts,vp,schedule", [([3, 2, 3], 1, "1f1b"), ([2, 2, 2, 2], 2, "interleaved-1f1b"),
                                                ([4, 4], 1, "zb-h1")])
def test_torchtitan_splitter_builds_the_plan_stages(counts, vp, schedule):
    """torchtitan's own _split_module on its llama3 debug model (6 blocks):
    each stage keeps exactly the plan's modules, the head stage keeps lm_head,
    and the stages chained reproduce the whole model's logits."""
    _torchtitan()
    import torch
    from torchtitan.distributed.pipeline_parallel import _get_pp_rank_to_stage_indices_mapping, _split_module
    from torchtitan.models.llama3 import model_registry

    torch.manual_seed(0)
    model = model_registry("debugmodel", attn_backend="flex").model.build()
    model.init_weights()
    pp = len(counts) // vp
    plan = make_plan(counts, transformer_names(6), pp=pp, vp=vp, schedule=schedule, m=2 * pp)
    exp = export_plan(plan, "torchtitan")
    parts = exp["parallelism"]["module_fqns_per_model_part"]
    tokens = torch.randint(0, 2048, (2, 16))
    positions = torch.arange(16).repeat(2, 1)
    masks = model.get_attention_masks(positions)
    with torch.no_grad():
        whole = model(tokens, positions, masks)
        h = tokens
        for s, part in enumerate(parts):
            chunk = _split_module(model, part)
            kept = {n for n, c in chunk.named_children() if c is not None and not (n == "layers" and len(c) == 0)}
            names = plan.stages[s].layer_names
            want = ({"tok_embeddings"} if "embedding" in names else set()) | (
                {"layers"} if stage_blocks(plan, s) else set()) | ({"norm", "lm_head"} if "head" in names else set())
            assert kept == want
            assert sorted(int(k) for k in chunk.layers.keys()) == stage_blocks(plan, s)
            h = chunk(h, positions, masks)
    assert h.shape == whole.shape == (2, 16, 2048)  # logits, not hidden states
    torch.testing.assert_close(h, whole)
    for r in range(pp):  # torchtitan's rank -> stages: the plan's stage s on rank s % pp
        got = _get_pp_rank_to_stage_indices_mapping(r, pp, exp["parallelism"]["pipeline_parallel_schedule"],
                                                    len(parts))
        assert list(got) == [s for s in range(len(parts)) if s % pp == r]


# ---------------------------------------------------------------- megatron-core 0.16.1


def _megatron_exports(plan_file):
    out = []
    for plan in list(plan_file.plans) + hand_plans():
        try:
            out.append((plan, export_plan(plan, "megatron", inputs=plan_file.inputs)))
        except Exception as exc:
            assert "megatron" in str(exc)
    assert len(out) >= 4
    return out


def _core_config(flags):
    """megatron-core TransformerConfig from the export's flags, the way
    Megatron-LM's core_transformer_config_from_args maps them."""
    import torch
    from megatron.core.transformer import TransformerConfig

    L = int(flags["--num-layers"])
    p = int(flags["--pipeline-model-parallel-size"])
    kw = dict(num_layers=L, hidden_size=64, num_attention_heads=4, pipeline_model_parallel_size=p,
              pipeline_dtype=torch.bfloat16 if p > 1 else None)
    if "--pipeline-model-parallel-layout" in flags:
        kw["pipeline_model_parallel_layout"] = flags["--pipeline-model-parallel-layout"]
    ae = "--account-for-embedding-in-pipeline-split" in flags
    al = "--account-for-loss-in-pipeline-split" in flags
    kw.update(account_for_embedding_in_pipeline_split=ae, account_for_loss_in_pipeline_split=al)
    if "--num-layers-per-virtual-pipeline-stage" in flags:  # arguments.py: vp = layers per rank / this
        kw["virtual_pipeline_model_parallel_size"] = (L + ae + al) // p // int(
            flags["--num-layers-per-virtual-pipeline-stage"])
    if "--decoder-first-pipeline-num-layers" in flags:
        kw["num_layers_in_first_pipeline_stage"] = int(flags["--decoder-first-pipeline-num-layers"])
    if "--decoder-last-pipeline-num-layers" in flags:
        kw["num_layers_in_last_pipeline_stage"] = int(flags["--decoder-last-pipeline-num-layers"])
    return TransformerConfig(**kw)


def _core_stage_layers(config, pp, vp):
    """Blocks per stage (stage = vp_stage * pp + pp_rank) by megatron-core's own code."""
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    layout = config.pipeline_model_parallel_layout
    out = []
    for v in range(vp):
        for r in range(pp):
            if layout is not None:
                out.append(layout.layout[r][v].count(LayerType.decoder))
            else:
                out.append(get_num_layers_to_build(config, vp_stage=v if vp > 1 else None, pp_rank=r))
    return out


def test_megatron_core_reproduces_every_split(llama_plan_file):
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.enums import LayerType

    from pipesearch.export.megatron import parse_args

    for plan, exp in _megatron_exports(llama_plan_file):
        flags = parse_args(exp["args"])
        config = _core_config(flags)
        want = [len(stage_blocks(plan, s)) for s in range(plan.pp * plan.vp)]
        assert _core_stage_layers(config, plan.pp, plan.vp) == want
        if exp["layout"] is not None:  # the layout form too, embedding and loss placed
            config = _core_config({"--num-layers": flags["--num-layers"],
                                   "--pipeline-model-parallel-size": flags["--pipeline-model-parallel-size"],
                                   "--pipeline-model-parallel-layout": exp["layout"]})
            layout = config.pipeline_model_parallel_layout
            for s in range(plan.pp * plan.vp):
                v, r = divmod(s, plan.pp)
                names = plan.stages[s].layer_names
                assert layout.layout[r][v].count(LayerType.embedding) == ("embedding" in names)
                assert layout.layout[r][v].count(LayerType.loss) == ("head" in names)


# ---------------------------------------------------------------- Megatron-LM's parser (core_v0.16.1)


def _megatron_lm():
    try:
        return importlib.import_module("megatron.training.arguments")
    except ImportError as exc:
        pytest.skip(f"Megatron-LM (megatron.training) is not importable: {exc}")


def _megatron_lm_args(mod, exp, monkeypatch, env):
    monkeypatch.setattr(sys, "argv", ["pretrain_gpt.py", *exp["args"], *exp["data_args"]])
    monkeypatch.setenv("WORLD_SIZE", str(exp["world_size"]))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    # validate_args asks the GPU for its architecture; answer as an H100 (sm_90) would
    monkeypatch.setattr(mod, "get_device_arch_version", lambda: 9)
    args = mod.parse_args()
    mod.validate_args(args)
    return args


def test_megatron_lm_validate_args_accepts_every_export(llama_plan_file, monkeypatch):
    mod = _megatron_lm()
    for plan, exp in _megatron_exports(llama_plan_file):
        with monkeypatch.context() as mp:
            args = _megatron_lm_args(mod, exp, mp, exp["env"])
        m, mbs = plan.num_micro_batches, plan.micro_batch_size
        assert (args.num_layers, args.hidden_size, args.num_attention_heads) == (32, 4096, 32)
        assert (args.ffn_hidden_size, args.num_query_groups, args.seq_length) == (14336, 8, 8192)
        assert args.swiglu and args.normalization == "RMSNorm" and args.position_embedding_type == "rope"
        assert args.untie_embeddings_and_output_weights and not args.add_bias_linear and args.bf16
        assert args.pipeline_model_parallel_size == plan.pp and args.tensor_model_parallel_size == plan.tp
        assert args.data_parallel_size == plan.dp
        assert args.global_batch_size // (args.micro_batch_size * args.data_parallel_size) == m
        assert args.micro_batch_size == mbs
        assert (args.virtual_pipeline_model_parallel_size or 1) == plan.vp
        assert args.sequence_parallel is (plan.tp > 1 and dict(plan.extra).get("sequence_parallel", False))
        rc = dict(plan.extra).get("recompute", "none")
        assert args.recompute_granularity == (None if rc == "none" else rc)
        # the split megatron-core builds from the parsed arguments
        from megatron.training.arguments import core_transformer_config_from_args

        args.apply_rope_fusion = False  # the fused RoPE kernel needs Transformer Engine, absent on CPU
        config = core_transformer_config_from_args(args)
        assert _core_stage_layers(config, plan.pp, plan.vp) == [len(stage_blocks(plan, s))
                                                               for s in range(plan.pp * plan.vp)]


def test_megatron_lm_needs_the_exported_environment(llama_plan_file, monkeypatch):
    mod = _megatron_lm()
    plan, exp = next((p, e) for p, e in _megatron_exports(llama_plan_file) if p.tp > 1)
    assert exp["env"] == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    with pytest.raises(AssertionError, match="CUDA_DEVICE_MAX_CONNECTIONS"):
        _megatron_lm_args(mod, exp, monkeypatch, {})


def test_megatron_lm_refuses_a_command_without_model_flags(llama_plan_file, monkeypatch):
    """What the exporter wrote before it took the model's shape: Megatron-LM
    refuses it ("hidden_size argument is None")."""
    mod = _megatron_lm()
    plan, exp = _megatron_exports(llama_plan_file)[0]
    bare = export_plan(plan, "megatron")  # no inputs: no model flags
    assert "--hidden-size" not in bare["args"] and any("no model shape" in n for n in bare["notes"])
    with pytest.raises(AssertionError, match="hidden_size"):
        _megatron_lm_args(mod, bare, monkeypatch, exp["env"])


# ---------------------------------------------------------------- DeepSpeed 0.19.8


class _Grid:
    """The parts of PipelineParallelGrid that DeepSpeedConfig asks (mpu)."""

    def __init__(self, pp, dp, tp):
        self.pp, self.dp, self.tp = pp, dp, tp

    def get_data_parallel_world_size(self):
        return self.dp

    def get_data_parallel_rank(self):
        return 0

    def get_model_parallel_world_size(self):
        return self.tp

    def get_model_parallel_rank(self):
        return 0

    def get_pipe_parallel_world_size(self):
        return self.pp


def _deepspeed_exports(plan_file):
    plans = list(plan_file.plans) + hand_plans() + [
        make_plan([3, 5, 4], schedule="1f1b", m=6, mbs=4, dp=2), make_plan([4, 4, 4], m=6, mbs=1, dp=1)]
    out = []
    for plan in plans:
        try:
            out.append((plan, export_plan(plan, "deepspeed", inputs=plan_file.inputs)))
        except Exception as exc:
            assert "deepspeed" in str(exc)
    assert len(out) >= 4
    return out


def test_deepspeed_config_class_accepts_ds_config(llama_plan_file, monkeypatch):
    pytest.importorskip("deepspeed")
    import deepspeed.runtime.config as ds_config
    from deepspeed.runtime.config import DeepSpeedConfig

    # as inside PipelineEngine: a process group exists (rank 0) and the grid gives the data-parallel size
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)

    for plan, exp in _deepspeed_exports(llama_plan_file):
        cfg = DeepSpeedConfig(json.loads(exp["files"]["ds_config.json"]), mpu=_Grid(plan.pp, plan.dp, plan.tp))
        m, mbs = plan.num_micro_batches, plan.micro_batch_size
        assert cfg.train_micro_batch_size_per_gpu == mbs
        assert cfg.gradient_accumulation_steps == m
        assert cfg.train_batch_size == mbs * m * plan.dp
        assert cfg.zero_optimization_stage == 0
        assert cfg.bfloat16_config.enabled  # transformer plans: bf16
    # a wrong batch is refused by the same class (the check can fail)
    bad = dict(json.loads(exp["files"]["ds_config.json"]), train_batch_size=mbs * m * plan.dp + 1)
    with pytest.raises(AssertionError, match="train_batch_size"):
        DeepSpeedConfig(bad, mpu=_Grid(plan.pp, plan.dp, plan.tp))


def test_deepspeed_partition_recipe_sets_the_plan_bounds(llama_plan_file):
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.pipe.topology import ProcessTopology
    from deepspeed.runtime.utils import partition_uniform

    for plan, exp in _deepspeed_exports(llama_plan_file):
        ns: dict = {}
        exec(compile(exp["files"]["partition.py"], "partition.py", "exec"), ns)
        cls = ns["ExactPartitionPipelineModule"]
        topo = ns["topology"]()  # the recipe's own topology: DeepSpeed's class, the plan's degrees
        assert isinstance(topo, ProcessTopology)
        assert (topo.get_dim("pipe"), topo.get_dim("data"), max(1, topo.get_dim("model"))) == (plan.pp, plan.dp,
                                                                                               plan.tp)
        assert ns["ACTIVATION_CHECKPOINT_INTERVAL"] == exp["pipeline_module"]["activation_checkpoint_interval"]
        n = sum(b - a for a, b in (st.layers for st in plan.stages))
        for s, st in enumerate(plan.stages):
            mod = object.__new__(cls)  # PipelineModule's own _partition_layers path, one stage at a time
            mod._topo, mod._layer_specs, mod._exact_parts = topo, [None] * n, ns["PARTS"]
            mod.global_rank = topo.get_rank(**{axis: s if axis == "pipe" else 0 for axis in topo.get_axis_names()})
            mod._partition_layers()
            assert (mod._local_start, mod._local_stop) == tuple(st.layers)
        if exp["pipeline_module"]["partition_method"] == "uniform":
            assert [int(x) for x in partition_uniform(n, plan.pp)] == exp["parts"]


# ---------------------------------------------------------------- DeepSpeed PipelineModule, two processes

DS_WORKER = r"""
import json, os, sys
try:
    import torch
    import deepspeed
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
except Exception as exc:  # DeepSpeed cannot initialise on this CPU host
    open(sys.argv[2], "w").write(json.dumps({"init_failed": f"{type(exc).__name__}: {exc}"}))
    raise SystemExit(0)
cases, out = json.loads(open(sys.argv[1]).read()), []
for case in cases:
    layers = [torch.nn.Linear(4, 4) for _ in range(case["num_layers"])]
    topo = PipeDataParallelTopology(num_pp=case["num_stages"], num_dp=1)
    if case["partition_method"] is None:  # the export's recipe, exact bounds
        ns = {}
        exec(compile(case["recipe"], "partition.py", "exec"), ns)
        mod = ns["ExactPartitionPipelineModule"](layers=layers, topology=topo, parts=ns["PARTS"])
    else:  # the built-in method the export names as equivalent
        mod = PipelineModule(layers=layers, topology=topo, partition_method=case["partition_method"])
    out.append({"stage_id": mod.stage_id, "start": mod._local_start, "stop": mod._local_stop,
                "parts": [int(x) for x in mod.parts], "local_layers": len(mod.forward_funcs),
                "local_params": sum(p.numel() for p in mod.parameters())})
open(sys.argv[2], "w").write(json.dumps({"rank": int(os.environ["RANK"]), "cases": out}))
"""


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_deepspeed_pipeline_module_in_two_processes_holds_the_plan_split(tmp_path):
    """Two CPU processes (gloo) build DeepSpeed's own PipelineModule from the
    export of two 2-stage plans of 5 layers: an uneven split [1 | 4] (no
    built-in method gives it: the export's recipe with ``parts``) and an even
    one [3 | 3] of 6 layers (``partition_method='uniform'``). Each rank's
    ``_local_start .. _local_stop`` must be its stage's layers in the plan,
    ``parts`` the plan's boundaries, and the rank must hold exactly those
    layers (each Linear(4, 4) has 20 parameters)."""
    pytest.importorskip("deepspeed")
    import os
    import subprocess

    plans = [make_plan([1, 4], schedule="1f1b", m=4, mbs=1), make_plan([3, 3], schedule="1f1b", m=4, mbs=1)]
    cases = []
    for plan in plans:
        exp = export_plan(plan, "deepspeed")
        cases.append({"num_layers": sum(b - a for a, b in (st.layers for st in plan.stages)), "num_stages": plan.pp,
                      "partition_method": exp["pipeline_module"]["partition_method"],
                      "recipe": exp["files"]["partition.py"]})
    assert [c["partition_method"] for c in cases] == [None, "uniform"]
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    (tmp_path / "worker.py").write_text(DS_WORKER)
    port = _free_port()
    procs = []
    for rank in range(2):
        env = {**os.environ, "DS_ACCELERATOR": "cpu", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
               "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, str(tmp_path / "worker.py"), str(tmp_path / "cases.json"),
                                       str(tmp_path / f"rank{rank}.json")], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=420)[0])
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        pytest.fail("DeepSpeed's two CPU processes did not finish within 420 s")
    results = []
    for rank, (proc, log) in enumerate(zip(procs, logs)):
        path = tmp_path / f"rank{rank}.json"
        assert proc.returncode == 0 and path.exists(), log[-3000:]
        results.append(json.loads(path.read_text()))
    failed = [r["init_failed"] for r in results if "init_failed" in r]
    if failed:
        pytest.skip(f"DeepSpeed cannot initialise a gloo process group on this CPU host: {failed[0]}")
    for rank, res in enumerate(results):
        assert res["rank"] == rank
        for plan, got in zip(plans, res["cases"]):
            a, b = plan.stages[rank].layers
            assert got["stage_id"] == rank
            assert (got["start"], got["stop"]) == (a, b)
            assert got["parts"] == [0] + [st.layers[1] for st in plan.stages]
            assert got["local_layers"] == b - a and got["local_params"] == 20 * (b - a)


# ---------------------------------------------------------------- torch 2.13's own interleaved order


@pytest.mark.parametrize("pp,vp,m", [(2, 2, 4), (4, 2, 8), (4, 2, 12), (2, 3, 6), (4, 2, 4)])
def test_torch_interleaved_1f1b_order_equals_the_exported_csv(pp, vp, m):
    """ScheduleInterleaved1F1B's own _calculate_single_rank_operations (what
    it runs without a CSV) gives, rank by rank, the compute actions of the
    export's pipeline_order_csv."""
    import csv
    import io

    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    sched = object.__new__(schedules.ScheduleInterleaved1F1B)  # the order needs no process group
    sched.pp_group_size, sched.n_local_stages, sched._n_microbatches = pp, vp, m
    sched.number_of_rounds = max(1, m // pp)  # as its __init__ sets them
    sched.microbatches_per_round = m // sched.number_of_rounds
    exp = export_plan(make_plan([2] * (pp * vp), pp=pp, vp=vp, schedule="interleaved-1f1b", m=m), "torch")
    rows = list(csv.reader(io.StringIO(exp["pipeline_order_csv"])))
    for rank in range(pp):
        torch_ops = [str(a) for a in sched._calculate_single_rank_operations(rank) if a is not None]
        assert torch_ops == [c.strip() for c in rows[rank] if c.strip()]


def test_deepspeed_config_class_reads_the_optimizer_offload(monkeypatch, tmp_path):
    """A plan whose every stage keeps its optimizer state in host memory
    (Qwen3-32B on 8x RTX 4090, which does not fit without it) exports
    DeepSpeed's ZeRO-Offload (stage 1, optimizer on the CPU), and DeepSpeed's
    own config class reads it so; other runtimes refuse the plan."""
    pytest.importorskip("deepspeed")
    import deepspeed.runtime.config as ds_config
    from deepspeed.runtime.config import DeepSpeedConfig
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    out = tmp_path / "q32.json"
    res = CliRunner().invoke(main, ["plan", "--model", "qwen3-32b", "--cluster", "1x8-rtx4090-pcie4", "-b", "512",
                                    "--optimizer-offload", "--schedule", "1f1b", "--top", "1", "-q", "-o", str(out)])
    assert res.exit_code == 0, res.output
    pf = load_plan_file(out)
    plan = pf.plans[0]
    assert all("offload" in st.memory_option for st in plan.stages)
    exp = export_plan(plan, "deepspeed", inputs=pf.inputs)
    cfg = DeepSpeedConfig(json.loads(exp["files"]["ds_config.json"]), mpu=_Grid(plan.pp, plan.dp, plan.tp))
    assert cfg.zero_optimization_stage == 1
    assert cfg.zero_config.offload_optimizer is not None and cfg.zero_config.offload_optimizer.device == "cpu"
    for fmt in ("megatron", "torch", "torchtitan"):
        with pytest.raises(InputError, match="optimizer state in host memory"):
            export_plan(plan, fmt, inputs=pf.inputs)


@pytest.mark.slow
def test_fp32_profile_plans_export_to_torchtitan_in_float32_and_deepspeed_without_16_bits(tmp_path, monkeypatch):
    """vgg16's profile has 4-byte parameters: its plans are timed and sized
    in fp32, so on V100s (no bf16) torchtitan is not refused but told
    ``mixed_precision_param float32`` (its ConfigManager parses it so), and
    DeepSpeed's config has no fp16 / bf16 block (DeepSpeedConfig: fp32). The
    same profile at 2-byte parameters trains in 16 bits: fp16 with loss
    scaling in DeepSpeed on the V100s, torchtitan refused with deepspeed
    named (megatron takes transformer tables only)."""
    from pipesearch.profiles import load_model
    from pipesearch.profiles.csv_profile import write_profile_csv

    half = tmp_path / "vgg16-fp16.csv"
    prof = load_model("vgg16")
    write_profile_csv(replace(prof, bytes_per_param=2.0, layers=tuple(
        replace(lay, param_bytes=lay.param_bytes / 2) for lay in prof.layers)), half)
    for model, sixteen in (("vgg16", False), (str(half), True)):
        out = tmp_path / f"{sixteen}.json"
        res = CliRunner().invoke(main, ["plan", "-q", "--model", model, "--cluster", "4x4-v100-10gbe", "-b", "256",
                                        "--pp", "2", "--schedule", "1f1b", "--top", "1", "-o", str(out)])
        assert res.exit_code == 0, res.output
        titan = CliRunner().invoke(main, ["export", str(out), "--format", "torchtitan"])
        if sixteen:
            assert titan.exit_code == 2 and "export to deepspeed, which trains in fp16" in titan.output
        else:
            assert titan.exit_code == 0, titan.output
            argv = json.loads(titan.stdout)["argv"]
            assert argv[:4] == ["--module", "MODULE", "--config", "CONFIG"]  # no torchtitan model of vgg16's
            cfg = _parse_titan(["--module", "llama3", "--config", "llama3_8b"] + argv[4:])
            assert cfg.training.mixed_precision_param == "float32"
        ds = json.loads(CliRunner().invoke(main, ["export", str(out), "--format", "deepspeed"]).stdout)["config"]
        assert ("fp16" in ds, "bf16" in ds) == (sixteen, False)
        pytest.importorskip("deepspeed")
        import deepspeed.runtime.config as ds_config
        from deepspeed.runtime.config import DeepSpeedConfig

        monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)  # as inside PipelineEngine
        plan = load_plan_file(out).plans[0]
        parsed = DeepSpeedConfig(ds, mpu=_Grid(plan.pp, plan.dp, plan.tp))
        assert (parsed.float16_config.enabled, parsed.bfloat16_config.enabled) == (sixteen, False)


@pytest.mark.slow
def test_torchtitan_parses_qwen3_exports(tmp_path):
    """Qwen3-32B (torchtitan 0.3.0's qwen3_32b: 64 layers, width 5120, 64
    heads, 8 key/value heads) exports with its config, and torchtitan's
    ConfigManager takes every ranked plan's command; Qwen3-1.7B (tied
    embeddings) with pp 2 is refused, as torchtitan refuses weight tying with
    pipeline parallelism."""
    _torchtitan()
    out = tmp_path / "qwen.json"
    res = CliRunner().invoke(main, ["plan", "--model", "qwen3-32b", "--cluster", "4x8-h100", "-b", "256",
                                    "--seq-len", "4096", "--runtime", "torchtitan", "--top", "4", "-q", "-o", str(out)])
    assert res.exit_code == 0, res.output
    pf = load_plan_file(out)
    for plan in pf.plans:
        argv = export_plan(plan, "torchtitan", inputs=pf.inputs)["argv"]
        assert argv[:4] == ["--module", "qwen3", "--config", "qwen3_32b"]
        cfg = _parse_titan(argv)
        assert cfg.parallelism.pipeline_parallel_degree == plan.pp
        assert cfg.training.seq_len == 4096
    small = ["plan", "--model", "qwen3-1.7b", "--cluster", "4x8-h100", "--nodes", "1", "-b", "64", "--pp", "2", "-q"]
    res = CliRunner().invoke(main, [*small, "--runtime", "torchtitan"])
    assert res.exit_code == 2 and "Weight tying is not supported with Pipeline Parallel" in res.output
    # planned for any runtime on one node: torchtitan's own order of the node's devices is no refusal, the tying is
    out = tmp_path / "small.json"
    res = CliRunner().invoke(main, [*small, "-o", str(out)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["export", str(out), "--rank", "1", "--format", "torchtitan"])
    assert res.exit_code == 2 and "Weight tying is not supported with Pipeline Parallel" in res.output
