"""A serving plan as the engines' own command lines: vLLM and SGLang.

Formats read in the engines' source:

* vLLM: ``vllm serve MODEL --tensor-parallel-size T --pipeline-parallel-size P``
  (``vllm/engine/arg_utils.py``); the layer split goes in the environment
  variable ``VLLM_PP_LAYER_PARTITION="11,13,12,12"``: decoder layers per stage
  (the embedding and the LM head are not counted), which
  ``vllm/distributed/utils.py::get_pp_indices`` reads and rejects unless it
  has ``P`` integers summing to the model's ``num_hidden_layers``. More
  than one node per replica needs a Ray cluster
  (``--distributed-executor-backend ray``).
* SGLang: ``python -m sglang.launch_server --model-path MODEL --tp-size T
  --pp-size P`` (``python/sglang/srt/server_args.py``) with
  ``SGLANG_PP_LAYER_PARTITION``, checked the same way by SGLang's
  ``get_pp_indices``; several nodes take ``--nnodes N --node-rank I
  --dist-init-addr HOST:PORT``, one process per node.

:func:`engine_refusal` says why an engine would reject a tensor / pipeline
degree (the checks of vLLM ``ModelConfig.verify_with_parallel_config``,
``QKVParallelLinear``, ``MergedColumnParallelLinear`` and
``VocabParallelEmbedding``, which SGLang shares); the exporters refuse such a
plan instead of writing a command that fails at start-up.
"""

from __future__ import annotations

import shlex

from ..errors import InputError
from ..profiles.transformer import TransformerConfig
from ..types import MIN_BF16_CAPABILITY
from .costs import VOCAB_PADDING
from .dtypes import INT4_GROUP_SIZE

__all__ = ["ENGINE_FLAGS", "FLAG_ALIASES", "PARTITION_ENV", "engine_settings", "engine_refusal", "check_partition",
           "parse_partition", "export_serving"]

#: the environment variable each engine reads the layer split from
PARTITION_ENV = {"vllm": "VLLM_PP_LAYER_PARTITION", "sglang": "SGLANG_PP_LAYER_PARTITION"}
#: each engine's command-line flag for each setting of :func:`engine_settings`
ENGINE_FLAGS = {
    "vllm": {"tp": "--tensor-parallel-size", "pp": "--pipeline-parallel-size", "max_num_seqs": "--max-num-seqs",
             "memory_fraction": "--gpu-memory-utilization", "max_model_len": "--max-model-len",
             "max_num_batched_tokens": "--max-num-batched-tokens", "chunked_prefill": "--enable-chunked-prefill",
             "quantization": "--quantization", "kv_cache_dtype": "--kv-cache-dtype",
             "multi_node": "--distributed-executor-backend", "dtype": "--dtype"},
    "sglang": {"tp": "--tp-size", "pp": "--pp-size", "max_num_seqs": "--max-running-requests",
               "memory_fraction": "--mem-fraction-static", "max_model_len": "--context-length",
               "max_num_batched_tokens": "--chunked-prefill-size", "quantization": "--quantization",
               "kv_cache_dtype": "--kv-cache-dtype", "multi_node": "--nnodes", "node_rank": "--node-rank",
               "dist_init_addr": "--dist-init-addr", "dtype": "--dtype"},
}
#: other spellings the engines' parsers accept for a flag (vLLM's ``arg_utils``: ``-tp``, ``-pp``)
FLAG_ALIASES = {"vllm": {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size"}, "sglang": {}}
#: the KV-cache dtype value each engine takes for fp8
FP8_KV = {"vllm": "fp8", "sglang": "fp8_e4m3"}


def engine_settings(engine: str, *, tp: int, pp: int, max_num_seqs: int, memory_fraction: float,
                    max_model_len: int, max_num_batched_tokens: int, weight_dtype: str, kv_dtype: str, nodes: int,
                    half: bool = False) -> list[tuple[str, str | None]]:
    """``(flag, value)`` of every engine setting a replica's command gives,
    in its order (``value`` None: a flag without a value): the degrees, the
    running limit, the memory share, the context, the step token budget
    (vLLM: prompts in chunks where it is below the context, V1's default,
    V0 refuses the budget without), fp8 weights and KV cache, several nodes
    (vLLM: Ray; SGLang: node count, rank and address) and ``--dtype half``
    on devices without bf16. :func:`export_serving` writes them; ``validate``
    checks a file's commands against them."""
    f = ENGINE_FLAGS[engine]
    out = [(f["tp"], str(tp)), (f["pp"], str(pp)), (f["max_num_seqs"], str(max_num_seqs)),
           (f["memory_fraction"], f"{memory_fraction:g}"), (f["max_model_len"], str(max_model_len)),
           (f["max_num_batched_tokens"], str(max_num_batched_tokens))]
    if engine == "vllm" and max_num_batched_tokens < max_model_len:
        out.append((f["chunked_prefill"], None))
    if weight_dtype == "fp8":
        out.append((f["quantization"], "fp8"))
    if kv_dtype == "fp8":
        out.append((f["kv_cache_dtype"], FP8_KV[engine]))
    if nodes > 1:
        out += [(f["multi_node"], "ray")] if engine == "vllm" else [
            (f["multi_node"], str(nodes)), (f["node_rank"], "0"), (f["dist_init_addr"], "HOST:PORT")]
    if half:
        out.append((f["dtype"], "half"))
    return out


def engine_refusal(cfg: TransformerConfig, tp: int, pp: int, engine: str = "vllm",
                   weight_dtype: str | None = None) -> str | None:
    """Why ``engine`` would refuse to run ``cfg`` at ``tp`` x ``pp`` (with
    ``weight_dtype`` weights, when given), or None. int4 weights come in
    groups of :data:`~pipesearch.serve.dtypes.INT4_GROUP_SIZE` along each
    GEMM's input, so the row-parallel GEMMs (the attention output and the
    MLP's down projection) need their input share per rank, ``heads x
    head_dim / tp`` and ``ffn / tp``, a whole number of groups (vLLM's
    GPTQ / AWQ loaders: "The input size is not aligned with the quantized
    weight shape")."""
    a, g = cfg.num_attention_heads, cfg.num_kv_heads
    if a % tp:
        return f"num_attention_heads {a} is not divisible by tp {tp} ({engine} splits query heads evenly)"
    if tp >= g and tp % g:  # type: ignore[operator]
        return f"tp {tp} is not a multiple of num_kv_heads {g} (a replicated KV head must serve whole ranks)"
    if tp < g and g % tp:  # type: ignore[operator]
        return f"num_kv_heads {g} is not divisible by tp {tp}"
    if cfg.ffn_hidden_size % tp:
        return f"ffn_hidden_size {cfg.ffn_hidden_size} is not divisible by tp {tp}"
    padded = -(-cfg.vocab_size // VOCAB_PADDING) * VOCAB_PADDING
    if padded % tp:
        return f"the vocabulary padded to {padded} rows is not divisible by tp {tp}"
    if weight_dtype == "int4":
        for what, size in (("the MLP's down projection", cfg.ffn_hidden_size),
                           ("the attention output", a * cfg.head_dim)):
            if (size // tp) % INT4_GROUP_SIZE:
                return (f"int4 weights in groups of {INT4_GROUP_SIZE}: {what}'s input of {size} splits into "
                        f"{size // tp} per rank at tp {tp}, not a whole number of groups")
    if pp > cfg.num_layers:
        return f"pp {pp} exceeds the {cfg.num_layers} decoder layers"
    if cfg.is_encoder_decoder:
        return "encoder-decoder models are not served with pipeline parallelism"
    return None


def check_partition(split, num_layers: int, pp: int, engine: str) -> None:
    """The engine's check of a layer partition. Raises InputError naming the
    variable when it has the wrong length, sum or an empty stage."""
    var = PARTITION_ENV[engine]
    text = ",".join(map(str, split))
    if len(split) != pp:
        raise InputError(f"{var}={text}: {len(split)} entries but pp is {pp}")
    if sum(split) != num_layers:
        raise InputError(f"{var}={text}: sums to {sum(split)}, the model has {num_layers} decoder layers")
    if min(split) < 1:
        raise InputError(f"{var}={text}: a stage without decoder layers")


def parse_partition(value: str, num_layers: int, pp: int, engine: str) -> tuple[int, ...]:
    """Read a partition variable back as the engine does (comma-separated
    integers, checked by :func:`check_partition`)."""
    try:
        parts = tuple(int(x) for x in value.split(","))
    except ValueError:
        raise InputError(f"{PARTITION_ENV[engine]}={value!r}: invalid partition string") from None
    check_partition(parts, num_layers, pp, engine)
    return parts


def export_serving(plan, cfg: TransformerConfig, *, engine: str, model_path: str, weight_dtype: str,
                   kv_dtype: str, memory_fraction: float, max_model_len: int, max_num_batched_tokens: int,
                   devices_per_node: int, concurrency: int | None = None, model_name_only: bool = False,
                   half: bool = False) -> dict:
    """The engine's command for one replica of ``plan`` (a
    :class:`~pipesearch.serve.search.ServePlan`); ``concurrency``: the
    closed loop's clients, when given (replicas beyond them stay idle);
    ``model_name_only``: ``model_path`` is pipesearch's name of the model, not
    a checkpoint the engine can load (a note says to replace it); ``half``:
    the devices have no bf16 (:func:`pipesearch.serve.dtypes.runs_bf16`), the
    model runs in fp16 (``--dtype half``, the same bytes).

    Returns:
        ``{"engine", "env", "argv", "command", "replicas", "nodes_per_replica",
        "notes"}``; ``command`` is the shell line (environment first),
        ``replicas`` how many to run (no more than the clients).

    Raises:
        InputError: what the engine would reject (see :func:`engine_refusal`).
    """
    reason = engine_refusal(cfg, plan.tp, plan.pp, engine, weight_dtype)
    if reason:
        raise InputError(f"{engine} export of plan {plan.rank}: {reason}")
    check_partition(plan.split, cfg.num_layers, plan.pp, engine)
    devices = plan.tp * plan.pp
    nodes = -(-devices // devices_per_node)
    env = {PARTITION_ENV[engine]: ",".join(map(str, plan.split))} if plan.pp > 1 else {}
    notes = [f"{model_path} is the model's name in pipesearch, not a checkpoint: replace it with its Hugging Face "
             "id or local path (or pass --model-path)"] if model_name_only else []
    settings = engine_settings(engine, tp=plan.tp, pp=plan.pp, max_num_seqs=plan.max_num_seqs,
                               memory_fraction=memory_fraction, max_model_len=max_model_len,
                               max_num_batched_tokens=max_num_batched_tokens, weight_dtype=weight_dtype,
                               kv_dtype=kv_dtype, nodes=nodes, half=half)
    head = ["vllm", "serve", model_path] if engine == "vllm" else ["python", "-m", "sglang.launch_server",
                                                                    "--model-path", model_path]
    argv = head + [x for flag, value in settings for x in ((flag,) if value is None else (flag, value))]
    if nodes > 1:
        notes.append(f"one replica spans {nodes} nodes: start a Ray cluster over them first" if engine == "vllm" else
                     f"one replica spans {nodes} nodes: run the command on each with --node-rank 0..{nodes - 1}")
    if half:
        notes.append(f"--dtype half: these devices have no bf16 (compute capability below {MIN_BF16_CAPABILITY:g}); "
                     "the model runs in fp16, the same bytes")
    if weight_dtype == "int4":
        notes.append("serve a 4-bit (GPTQ / AWQ, group 128) checkpoint: the engine reads its quantization "
                     "from the checkpoint's config")
    busy = plan.replicas if concurrency is None else min(plan.replicas, concurrency)
    if busy > 1:
        how = ""
        if devices_per_node // devices >= 2:  # several replicas share a node: each its own GPUs and port
            sets = [",".join(map(str, range(k * devices, (k + 1) * devices)))
                    for k in range(min(busy, devices_per_node // devices))]
            how = (f": on a node, each on its own GPUs (CUDA_VISIBLE_DEVICES={sets[0]}, then {sets[1]}"
                   f"{', ...' if len(sets) > 2 else ''}) and port (--port 8000, 8001, ...)")
        notes.append(f"run {busy} replicas ({devices} device{'' if devices == 1 else 's'} each) behind a load "
                     f"balancer{how}")
    if busy < plan.replicas:  # a closed loop of fewer clients than replicas leaves some without work
        notes.append(f"{concurrency} client{'s' if concurrency > 1 else ''} keep{'' if concurrency > 1 else 's'} "
                     f"{busy} of the {plan.replicas} replicas busy: the other {plan.replicas - busy} "
                     f"({(plan.replicas - busy) * devices} devices) would stay idle")
    command = " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), *map(shlex.quote, argv)])
    return {"engine": engine, "env": env, "argv": argv, "command": command, "replicas": busy,
            "nodes_per_replica": nodes, "notes": notes}
