"""Export a plan as Megatron-LM command-line arguments.

Megatron-LM (github.com/NVIDIA/Megatron-LM) builds GPT-style models from
``--num-layers`` transformer layers plus an embedding (first stage) and the
output layer + loss (last stage), so only transformer layer tables are
exported: an optional ``embedding``, ``block_00`` .. ``block_{L-1}``, an
optional ``head``. Everything else is refused.

Rules (read through the code corpus; megatron/training/arguments.py
``validate_args``, megatron/core/transformer/transformer_block.py
``get_num_layers_to_build``, megatron/core/transformer/
pipeline_parallel_layer_layout.py, megatron/core/pipeline_parallel/
schedules.py):

* Interleaving: ``--num-layers-per-virtual-pipeline-stage N`` (the long-standing
  flag) or ``--num-virtual-stages-per-pipeline-rank V`` (newer); upstream has
  no ``--virtual-pipeline-model-parallel-size`` flag (``args.virtual_pipeline_
  model_parallel_size`` is derived; only forks add the flag). At most one of
  these two and ``--pipeline-model-parallel-layout`` may be set.
* Even split (no split flags): ``num_layers (+1 with
  --account-for-embedding-in-pipeline-split) (+1 with
  --account-for-loss-in-pipeline-split)`` must be divisible by the pipeline
  size; with ``--num-layers-per-virtual-pipeline-stage`` the layers per
  pipeline rank must be divisible by it; each (virtual) stage builds
  ``per_rank / vp`` layers, one fewer on the very first stage with the
  embedding flag and on the very last with the loss flag.
* Uneven split: ``--decoder-first-pipeline-num-layers`` /
  ``--decoder-last-pipeline-num-layers`` give the first / last pipeline rank's
  layers; "the left over layers must be divisible by left over stages"; they
  cannot be combined with the account-for flags ("Does not support standalone
  embedding stage and standalone loss stage with uneven pp"), nor with
  ``--num-layers-per-virtual-pipeline-stage``.
* ``--pipeline-model-parallel-layout``: stages separated by ``|`` in stage
  order ``vpp_rank * pp + pp_rank`` (pipesearch's stage ``s`` on rank
  ``s % pp``); ``E`` embedding, ``t`` transformer layer, ``L`` loss, ``m`` MTP;
  ``x*n`` and ``(...)*n`` repeat, commas are cosmetic; the number of stages
  must be divisible by the pipeline size (its quotient is the vp size); ``E``
  first and ``L`` last, exactly once each; ``t`` count = ``--num-layers``.
  Example from Megatron: ``"Et*3|(tt|)*29,m|L"``. Requires a Megatron-LM
  with the layout option (megatron-core 2025 or later).
* Interleaved schedule (``forward_backward_pipelining_with_interleaving``):
  "number of microbatches (..) is not divisible by
  pipeline-model-parallel-size (..) when using interleaved schedule" ->
  ``m % pp == 0``; "Interleaving is not supported with an encoder and decoder
  model". ``validate_args``: with interleaving the pipeline size must be > 2
  unless p2p overlap is on (``--no-overlap-p2p-communication`` turns it off;
  on by default).
* Megatron runs 1F1B without interleaving and interleaved 1F1B with it; it has
  no GPipe, ZB-H1 or looped-BFS schedule, so those plans are refused (it
  would run 1F1B instead).
* ``--recompute-granularity {full,selective}``; ``selective`` (core attention)
  takes no ``--recompute-method``; ``full`` with ``--recompute-method uniform
  --recompute-num-layers 1`` recomputes every layer from its input.
* ``validate_args`` sets ``args.sequence_parallel = False`` when
  ``--tensor-model-parallel-size`` is 1, so ``--sequence-parallel`` is only
  written with ``tp > 1``.
* Batch: ``num_microbatches = global_batch_size / (micro_batch_size * dp)``,
  ``dp = world_size / (tp * pp * cp)``.

Choice of flags: the export uses the simplest flags that reproduce the plan's
split exactly, in this order: even split; the account-for flags; first/last
stage layers (``vp = 1``); the layout string (only when the plan has explicit
``embedding`` and ``head`` layers: a layout must place ``E`` and ``L``, and a
blocks-only plan does not say where they go). Stages without transformer
layers go through the layout only; an empty first or last stage is refused
(Megatron builds the embedding on the first stage and the loss on the last).
The equivalent layout string is also given under ``"layout"`` whenever it can
be built.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace

from ..errors import InputError
from ..overlap import MEGATRON_BUCKET_PARAMS
from ..runtimes import megatron_overlap_refusal
from ..types import Plan
from . import (
    FORMAT_VERSION,
    Inputs,
    model_kind_refusal,
    plan_layers,
    refuse_rank_order,
    shell_command,
    shell_line,
    stored_scores_note,
    node_rank_preamble,
    torchrun_prefix,
    recompute_mode,
    sequence_parallel,
    transformer_shape,
)

RUNTIME = "megatron-lm"

_LAYER_CHARS = {"E": "embedding", "L": "loss", "t": "decoder", "m": "mtp"}
_VALUE_FLAGS = frozenset({
    "--num-layers", "--pipeline-model-parallel-size", "--tensor-model-parallel-size",
    "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
    "--pipeline-model-parallel-layout", "--micro-batch-size", "--global-batch-size",
    "--recompute-granularity", "--recompute-method", "--recompute-num-layers",
    "--hidden-size", "--num-attention-heads", "--ffn-hidden-size", "--seq-length", "--max-position-embeddings",
    "--vocab-size", "--kv-channels", "--num-query-groups", "--normalization", "--position-embedding-type",
    "--attention-dropout", "--hidden-dropout", "--make-vocab-size-divisible-by", "--tokenizer-type",
})


# ---------------------------------------------------------------- layout grammar


def parse_layout(layout: str) -> list[list[str]]:
    """Parse a ``--pipeline-model-parallel-layout`` string as Megatron does
    (``PipelineParallelLayerLayout.parse_str_to_list``): drop commas, unroll
    ``(...)*n`` then ``x*n``, split stages on ``|``.

    Returns:
        One list of layer characters (``E``, ``t``, ``L``, ``m``) per stage.

    Raises:
        InputError: a character other than ``E t L m``.
    """
    s = layout.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        s = re.sub(pattern, lambda x: x.group(1) * int(x.group(2)), s)
    out = []
    for stage in s.split("|"):
        for ch in stage:
            if ch not in _LAYER_CHARS:
                raise InputError(
                    f"megatron layout {layout!r}: invalid layer character {ch!r} (known: {', '.join(_LAYER_CHARS)})"
                )
        out.append(list(stage))
    return out


def _stage_text(tokens: Sequence[str]) -> str:
    out, i = [], 0
    while i < len(tokens):
        j = i
        while j < len(tokens) and tokens[j] == tokens[i]:
            j += 1
        n = j - i
        out.append(tokens[i] if n == 1 else f"{tokens[i]}*{n}")
        i = j
    return "".join(out)


def format_layout(stages: Sequence[Sequence[str]]) -> str:
    """A layout string for per-stage layer characters; runs of two or more
    identical stages (not the last) are written ``(X|)*n,`` as in Megatron's
    own examples. ``parse_layout(format_layout(s)) == s``."""
    texts = [_stage_text(t) for t in stages]
    out, i, n = [], 0, len(texts)
    while i < n:
        j = i
        while j < n - 1 and texts[j] == texts[i]:
            j += 1
        run = j - i  # stages i .. j-1 identical, j is the next different one (or the last)
        if run >= 2 and texts[i]:
            out.append(f"({texts[i]}|)*{run},")
            i = j
        else:
            out.append(texts[i] + ("|" if i < n - 1 else ""))
            i += 1
    return "".join(out)


def validate_layout(stages: Sequence[Sequence[str]], pp: int, num_layers: int) -> None:
    """Megatron's checks of a parsed layout (``PipelineParallelLayerLayout``
    ``__init__`` and ``validate_layer_layout``, without MTP).

    Raises:
        InputError: the failed check.
    """
    if len(stages) % pp:
        raise InputError(f"megatron layout: {len(stages)} stages is not divisible by the pipeline size {pp}")
    flat = [c for st in stages for c in st]
    if not flat or flat[0] != "E" or flat.count("E") != 1:
        raise InputError("megatron layout: the first layer must be embedding 'E', exactly once")
    if flat[-1] != "L" or flat.count("L") != 1:
        raise InputError("megatron layout: the last layer must be loss 'L', exactly once")
    if flat.count("t") != num_layers:
        raise InputError(f"megatron layout: {flat.count('t')} decoder layers 't' must match num_layers {num_layers}")


# ---------------------------------------------------------------- Megatron's split rules


def megatron_stage_layers(num_layers: int, pp: int, vp: int = 1, *, first: int | None = None,
                          last: int | None = None, account_embedding: bool = False,
                          account_loss: bool = False) -> list[int]:
    """Transformer layers per stage (stage ``s = vpp_rank * pp + pp_rank``) that
    Megatron builds from the count-based flags (``get_num_layers_to_build``).

    Raises:
        InputError: where Megatron's asserts fail.
    """
    if pp == 1:
        if vp != 1:
            raise InputError("megatron: virtual pipeline stages need pipeline-model-parallel-size > 1")
        return [num_layers]
    if first is not None or last is not None:
        if account_embedding or account_loss:
            raise InputError(
                "megatron: --decoder-first/last-pipeline-num-layers cannot be combined with the account-for "
                "flags ('Does not support standalone embedding stage and standalone loss stage with uneven pp')"
            )
        left = pp - (first is not None) - (last is not None)
        rest = num_layers - (first or 0) - (last or 0)
        if rest < 0 or (left > 0 and rest % left) or (left == 0 and rest != 0):
            raise InputError(
                f"megatron: with uneven pipelining the left over layers ({rest}) must be divisible by the "
                f"left over stages ({left})"
            )
        mid = rest // left if left else 0
        per_rank = [mid] * pp
        if first is not None:
            per_rank[0] = first
        if last is not None:
            per_rank[-1] = last
    else:
        total = num_layers + int(account_embedding) + int(account_loss)
        if total % pp:
            raise InputError(
                f"megatron: number of layers {total} (num_layers {num_layers}"
                + (" + embedding" if account_embedding else "") + (" + loss" if account_loss else "")
                + f") should be divisible by the pipeline-model-parallel size {pp}"
            )
        per_rank = [total // pp] * pp
    for r, n in enumerate(per_rank):
        if n % vp:
            raise InputError(f"megatron: pipeline rank {r} has {n} layers, not divisible by vp size {vp}")
    counts = [per_rank[s % pp] // vp for s in range(pp * vp)]
    if account_embedding:
        counts[0] -= 1
    if account_loss:
        counts[-1] -= 1
    if min(counts) < 0:
        raise InputError("megatron: not enough layers in the first/last virtual pipeline stage")
    return counts


def _stage_tokens(counts: Sequence[int], has_emb: bool, has_head: bool) -> list[list[str]]:
    out = [["t"] * c for c in counts]
    if has_emb:
        out[0].insert(0, "E")
    if has_head:
        out[-1].append("L")
    return out


# ---------------------------------------------------------------- export


RUNTIME_VERSION = "core_v0.16.1"
"""The Megatron-LM tag whose ``megatron/training/arguments.py`` (``parse_args``,
``validate_args``) and megatron-core 0.16.1 functions the tests check the
export against."""


def _state_note(job: Mapping, dp: int) -> str | None:
    """A note when the plan's memory counted a training state
    (``inputs.job.optimizer_state``) other than what Megatron-LM keeps with
    the flags written (:data:`pipesearch.memory.PRESETS` ``megatron``: 16-bit
    weights, fp32 main gradients, fp32 master weights and Adam moments, the
    last two sharded over the ``dp`` replicas by ``--use-distributed-optimizer``
    when the plan shards its state): a warning when Megatron-LM keeps more
    bytes per parameter on each device, a note when the plan's 32-bit weights
    become 16-bit ones (``--bf16``: the plan's layer times are 16-bit
    compute) and Megatron-LM keeps fewer; None when they agree, or without
    the record."""
    from ..memory import PRESETS, SHARDINGS, ParamState

    state = job.get("optimizer_state")
    parts = state.get("bytes_per_param") if isinstance(state, Mapping) else None
    if not isinstance(parts, Mapping) or not all(isinstance(v, (int, float)) for v in parts.values()):
        return None
    sharding = state.get("sharding") if state.get("sharding") in SHARDINGS else "none"
    planned_state = ParamState(*(float(parts.get(k, 0.0)) for k in (
        "weights", "grads", "main_grads", "master_weights", "optimizer_moments")), sharding=sharding)
    megatron_state = replace(PRESETS["megatron"], sharding="none" if sharding == "none" else "zero1")
    planned, megatron = planned_state.bytes_per_param(dp), megatron_state.bytes_per_param(dp)
    name = state.get("name", "its optimizer state")
    at = "" if sharding == "none" else f" on each device at dp={dp}"
    kept = ("fp32 main gradients beside 16-bit weights, fp32 master weights and Adam moments"
            + ("" if sharding == "none" else ", the last two sharded over the replicas"))
    if planned < megatron:
        return (f"warning: the plan's memory counts {planned:g} bytes of training state per parameter{at} ({name}); "
                f"Megatron-LM keeps {megatron:g} ({kept}), so its stages hold more than planned and may not fit: "
                f"re-plan with --optimizer-state megatron (what --runtime megatron plans with when no "
                f"--optimizer-state is given).")
    if planned > megatron and planned_state.weight_bytes > PRESETS["megatron"].weight_bytes:
        return (f"the plan keeps {planned_state.weight_bytes:g}-byte weights ({name}); Megatron-LM trains them in "
                f"16-bit (--bf16, the precision of the plan's layer times) and keeps {megatron:g} bytes of training "
                f"state per parameter{at} ({kept}) against the {planned:g} planned.")
    return None


def model_args(t: Mapping, seq_len: int | None) -> tuple[list[str], list[str]]:
    """Megatron-LM model shape and type flags for a transformer config.

    Args:
        t: the fields of a :class:`~pipesearch.profiles.transformer.TransformerConfig`
            (the plan file's ``inputs.model.transformer``).
        seq_len: the planned sequence length (tokens per sample); ``None``
            takes ``t["seq_len"]``.

    Returns:
        ``(argv items, notes)``. Flags: ``--hidden-size``,
        ``--num-attention-heads``, ``--ffn-hidden-size``, ``--seq-length``,
        ``--max-position-embeddings`` (at least the sequence length:
        ``validate_args`` asserts it), ``--vocab-size``, ``--kv-channels``
        when heads are not ``hidden / heads`` wide, ``--group-query-attention
        --num-query-groups g`` for GQA, ``--swiglu`` for a gated MLP,
        ``--normalization RMSNorm``, ``--position-embedding-type rope`` /
        ``none``, ``--untie-embeddings-and-output-weights``,
        ``--disable-bias-linear`` (with ``--add-qkv-bias`` for Q/K/V
        biases alone), ``--qk-layernorm``, ``--rotary-base`` (the config's
        ``rope_theta``), ``--norm-epsilon``, ``--attention-dropout 0.0
        --hidden-dropout 0.0`` without dropout,
        ``--make-vocab-size-divisible-by`` when not Megatron's 128, ``--bf16``.
        Megatron's defaults (LayerNorm, learned absolute positions, biases,
        tied embeddings, dropout 0.1, GELU) are not written.

    Raises:
        InputError: an encoder-decoder config (Megatron trains those with
            pretrain_t5.py and other flags) or a field of the wrong type.
    """
    def num(key, default=None):
        v = t.get(key, default)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"megatron: inputs.model.transformer.{key} = {v!r}; expected a positive integer")
        return v

    reason = model_kind_refusal("megatron", t)
    if reason:
        raise InputError(f"megatron: {reason}")
    h, a, f, vocab = num("hidden_size"), num("num_attention_heads"), num("ffn_hidden_size"), num("vocab_size")
    s = seq_len or num("seq_len")
    pos = t.get("position_embedding", "learned")
    max_pos = num("max_position_embeddings") or s
    if pos != "learned":
        max_pos = max(max_pos, s)
    args = ["--hidden-size", str(h), "--num-attention-heads", str(a), "--ffn-hidden-size", str(f),
            "--seq-length", str(s), "--max-position-embeddings", str(max_pos), "--vocab-size", str(vocab)]
    notes = []
    d = num("head_dim")
    if d is not None and d * a != h:
        args += ["--kv-channels", str(d)]
    g = num("num_kv_heads")
    if g is not None and g != a:
        args += ["--group-query-attention", "--num-query-groups", str(g)]
    if t.get("gated_mlp"):
        args.append("--swiglu")
        notes.append("gated MLP written as --swiglu (SwiGLU); a GEGLU model needs its own activation.")
    if t.get("norm", "layernorm") == "rmsnorm":
        args += ["--normalization", "RMSNorm"]
    if pos == "rotary":
        args += ["--position-embedding-type", "rope"]
        theta = t.get("rope_theta")
        if theta is not None:  # Megatron-LM's --rotary-base is an integer
            base = max(1, round(float(theta)))
            args += ["--rotary-base", str(base)]
            if base != float(theta):
                notes.append(f"rope_theta {theta!r} written as --rotary-base {base}: Megatron-LM takes an integer "
                             f"base; the model's rotary frequencies differ slightly from its config's.")
        scaling, factor = t.get("rope_scaling_type"), t.get("rope_scaling_factor")
        if scaling == "llama3":  # Megatron-LM's llama3.x scaling (low / high frequency factors 1 and 4, 8192 positions)
            args += ["--use-rope-scaling", "--rope-scaling-factor", f"{float(factor or 8.0):g}"]
            notes.append("rope scaling 'llama3' as Megatron-LM applies it: low_freq_factor 1, high_freq_factor 4 and "
                         "an original context of 8192 positions (Llama 3.1's); check the config's own values.")
        elif scaling == "linear" and factor is not None and float(factor) == int(factor) and factor >= 1:
            args += ["--rotary-seq-len-interpolation-factor", str(int(factor))]  # positions divided by the factor
        elif scaling is not None:
            notes.append(f"rope scaling {scaling!r} (factor {factor!r}): Megatron-LM's flags set the llama3 kind "
                         "(--use-rope-scaling) and an integer linear factor (--rotary-seq-len-interpolation-factor) "
                         "only; apply it in the model code.")
        if theta is None:
            notes.append("rotary embeddings: Megatron's --rotary-base defaults to 10000; set the model's own base "
                         "(its config's rope_theta, e.g. 500000 for Llama 3) and --rotary-percent if not 1.0. "
                         "pipesearch's costs do not depend on it.")
    elif pos == "none":
        args += ["--position-embedding-type", "none"]
    elif pos != "learned":
        raise InputError(f"megatron: position_embedding {pos!r} has no pretrain_gpt.py flag")
    if t.get("tied_embeddings", True) is False:
        args.append("--untie-embeddings-and-output-weights")
    if t.get("bias", True) is False:
        args.append("--disable-bias-linear")
        if t.get("qkv_bias"):
            args.append("--add-qkv-bias")
    if t.get("qk_norm"):
        args.append("--qk-layernorm")
    if t.get("norm_eps") is not None:
        args += ["--norm-epsilon", f"{t['norm_eps']:g}"]
    if t.get("dropout", True) is False:
        args += ["--attention-dropout", "0.0", "--hidden-dropout", "0.0"]
    div = num("make_vocab_size_divisible_by", 128)
    if div != 128:
        args += ["--make-vocab-size-divisible-by", str(div)]
    args.append("--bf16")
    return args, notes


#: how Megatron-LM numbers its ranks (megatron.core.parallel_state.initialize_model_parallel's ``order``)
MEGATRON_RANK_ORDER = ("numbers its ranks tp-cp-ep-dp-pp (tp-cp-ep-pp-dp with --use-tp-pp-dp-mapping), each "
                       "tensor-parallel group on consecutive ranks")


def _check_schedule(plan: Plan) -> None:
    """Refuse a schedule Megatron-LM does not run as planned: 1F1B with
    virtual stages, interleaved 1F1B without them or with a micro-batch
    count that is not a multiple of pp (its schedules.py), or any other
    schedule; one stage needs none (Megatron accumulates the micro-batches'
    gradients).

    Raises:
        InputError: the rule and the schedule to re-plan with.
    """
    p, v, m = plan.pp, plan.vp, plan.num_micro_batches
    if p == 1 and v == 1:
        pass
    elif plan.schedule == "1f1b":
        if v != 1:
            raise InputError(f"megatron: schedule '1f1b' with vp={v}; Megatron runs interleaved 1F1B when vp > 1")
    elif plan.schedule == "interleaved-1f1b":
        if v < 2 or p < 2:
            raise InputError(
                f"megatron: interleaved 1F1B needs pp > 1 and vp > 1 (got pp={p}, vp={v}); with vp=1 Megatron "
                f"runs plain 1F1B, use schedule '1f1b'"
            )
        if m % p:
            raise InputError(
                f"megatron: number of microbatches ({m}) is not divisible by pipeline-model-parallel-size "
                f"({p}) when using interleaved schedule (Megatron-LM schedules.py); use a multiple of {p}"
            )
    else:
        raise InputError(
            f"megatron: Megatron-LM has no {plan.schedule!r} schedule (it runs 1F1B, or interleaved 1F1B "
            f"with virtual stages) and would run 1F1B instead; re-plan with '1f1b' or 'interleaved-1f1b'"
        )


def _split(layers, explicit: bool, p: int, v: int, L: int, allow_layout: bool):
    """The plan's split in Megatron's terms: ``(transformer layers per
    stage, layout string or None, the split flags, how they were chosen)``.
    The layout (``--pipeline-model-parallel-layout``) is built when the plan
    has explicit embedding and head layers on the first and last stage;
    the flags are the first of even split, the account-for flags, the
    first/last-stage layer counts (vp 1) or the layers per virtual stage
    (vp > 1) that gives the plan's counts (:func:`megatron_stage_layers`),
    else the layout where allowed.

    Raises:
        InputError: no flag and no allowed layout expresses the split; the
            reasons each form fails.
    """
    # per-stage structure of the plan
    counts, emb_stage, head_stage = [], None, None
    for i, (a, b) in enumerate(layers.ranges):
        names = layers.names[a:b]
        counts.append(sum(1 for n in names if n.startswith("block_")))
        if "embedding" in names:
            emb_stage = i
        if "head" in names:
            head_stage = i
    S = len(counts)
    plan_tokens = _stage_tokens(counts, False, False)
    if emb_stage is not None:
        plan_tokens[emb_stage].insert(0, "E")
    if head_stage is not None:
        plan_tokens[head_stage].append("L")
    # Megatron builds the embedding on the first stage and the loss on the last
    # (pre_process / post_process); a plan with an empty first or last stage
    # puts them elsewhere, which no flag or layout can say.
    first_empty = layers.ranges[0][0] == layers.ranges[0][1]
    last_empty = layers.ranges[-1][0] == layers.ranges[-1][1]
    ends_ok = emb_stage in (None, 0) and head_stage in (None, S - 1) and not first_empty and not last_empty
    layout = format_layout(plan_tokens) if explicit and ends_ok else None
    if layout is not None:
        validate_layout(parse_layout(layout), p, L)

    # pick the split flags
    split_args: list[str] | None = None
    how = ""
    cands: list[tuple[str, dict, list[str]]] = []
    if p > 1 and v == 1:
        cands.append(("even split", {}, []))
        for ae, al in ((True, True), (True, False), (False, True)):
            flags = (["--account-for-embedding-in-pipeline-split"] if ae else []) + (
                ["--account-for-loss-in-pipeline-split"] if al else [])
            cands.append(("account-for flags", {"account_embedding": ae, "account_loss": al}, flags))
        # (stages with zero transformer layers are left to the layout form, which
        # Megatron documents for them)
        if min(counts) > 0:
            cands.append(("first-stage layers", {"first": counts[0]},
                          ["--decoder-first-pipeline-num-layers", str(counts[0])]))
            cands.append(("last-stage layers", {"last": counts[-1]},
                          ["--decoder-last-pipeline-num-layers", str(counts[-1])]))
        if p >= 3 and min(counts) > 0:
            cands.append(("first/last-stage layers", {"first": counts[0], "last": counts[-1]},
                          ["--decoder-first-pipeline-num-layers", str(counts[0]),
                           "--decoder-last-pipeline-num-layers", str(counts[-1])]))
    elif p > 1 and L % (p * v) == 0:
        k = L // (p * v)
        cands.append(("even split", {}, ["--num-layers-per-virtual-pipeline-stage", str(k)]))
    elif p == 1:
        cands.append(("no pipeline", {}, []))
    if ends_ok:
        for label, kw, flags in cands:
            try:
                got = megatron_stage_layers(L, p, v, **kw)
            except InputError:
                continue
            if got == counts:
                split_args, how = flags, label
                break
    if split_args is None and layout is not None and allow_layout:
        split_args, how = ["--pipeline-model-parallel-layout", layout], "layout"
    if split_args is None:
        reasons = []
        if v > 1:
            reasons.append(
                f"--num-layers-per-virtual-pipeline-stage needs the {L} layers divisible into pp*vp = {p * v} "
                f"equal virtual stages ({L} % {p * v} = {L % (p * v)})" if L % (p * v) else
                f"--num-layers-per-virtual-pipeline-stage gives each of the pp*vp = {p * v} virtual stages "
                f"{L // (p * v)} layers, and the plan's have {counts}"
            )
        else:
            reasons.append(
                f"no even / account-for / first-last flag gives the plan's layers per stage {counts} "
                f"(even split needs {L} (+1 per account-for flag) divisible by pp={p}; first/last flags need the "
                f"middle stages equal)"
            )
        if not ends_ok:
            reasons.append("the first or last stage is empty or does not hold the embedding / head "
                           "(Megatron builds the embedding on the first stage and the loss on the last)")
        if not explicit:
            reasons.append(
                "no --pipeline-model-parallel-layout can be built because the plan has no explicit embedding "
                "and head layers (a layout must place E and L)"
            )
        elif not allow_layout and ends_ok:
            reasons.append("the layout string was not allowed (allow_layout=False)")
        raise InputError(
            f"megatron: cannot express the split (pp={p}, vp={v}, layers per stage {counts}): " + "; ".join(reasons)
        )
    return counts, layout, split_args, how


def _overlap_args(plan: Plan, inputs: Inputs) -> list[str]:
    """The plan's communication overlap as Megatron-LM flags (gradient
    reduce, parameter gather with the distributed optimizer, tensor-parallel
    overlap at tp > 1, a bucket size other than Megatron's).

    Raises:
        InputError: an overlap Megatron does not run with the plan's other
            settings (:func:`pipesearch.runtimes.megatron_overlap_refusal`).
    """
    args = []
    overlap = inputs.comm_overlap
    refusal = megatron_overlap_refusal(bool(overlap.get("param_gather")) and inputs.zero1,
                                       bool(overlap.get("grad_reduce")),
                                       bool(overlap.get("tp_forward")) and plan.tp > 1, sequence_parallel(plan))
    if refusal:
        raise InputError(f"megatron: the plan's communication overlap does not run there: {refusal}, then "
                         "re-plan (--runtime megatron checks this before the search)")
    if overlap.get("grad_reduce"):
        args.append("--overlap-grad-reduce")
    if overlap.get("param_gather") and inputs.zero1:
        args.append("--overlap-param-gather")
    if overlap.get("tp_forward") and plan.tp > 1:
        args.append("--tp-comm-overlap")
    bucket = overlap.get("bucket_params")
    if overlap.get("grad_reduce") and isinstance(bucket, (int, float)) and bucket != MEGATRON_BUCKET_PARAMS:
        args += ["--ddp-bucket-size", str(int(bucket))]
    return args


def _plan_notes(plan: Plan, inputs: Inputs, explicit: bool, layout: str | None, how: str, module_names,
                env: dict) -> list[str]:
    """The export's notes on what the command assumes (interleaving's p2p
    overlap, encoder-decoder models, where Megatron puts the embedding and
    head, the layout form, the world size and micro-batches, the all-reduce
    and tp overlap, the environment), in the order they are listed."""
    p, v, m = plan.pp, plan.vp, plan.num_micro_batches
    overlap = inputs.comm_overlap
    notes = []
    if v > 1 and p == 2:
        notes.append("interleaving with pp=2 needs p2p overlap (Megatron's default; do not pass "
                     "--no-overlap-p2p-communication).")
    if v > 1 and inputs.transformer is None:  # a transformer config is decoder-only here (T5 is refused)
        notes.append("Megatron refuses interleaving for encoder-decoder (T5) models.")
    if not explicit:
        notes.append("the plan has no explicit embedding/head layers; Megatron puts the embedding on the "
                     "first stage and the output layer + loss on the last.")
    if layout is not None and how != "layout":
        notes.append("the same split as a layout string is under 'layout' (--pipeline-model-parallel-layout, "
                     "newer Megatron-LM); pass one form, not both.")
    if module_names:
        notes.append("module_names is unused: Megatron-LM names its own modules.")
    world = plan.tp * p * plan.dp
    notes.append(f"launch with world size tp*pp*dp = {world}; Megatron derives "
                 f"dp = {plan.dp} and {m} micro-batches = global / (micro * dp).")
    if not overlap.get("grad_reduce"):
        notes.append("the gradient all-reduce runs after the backward, as pipesearch timed it (Megatron's default); "
                     "--overlap-grad-reduce overlaps it with the backward and can only shorten the step.")
    if overlap.get("tp_forward") and plan.tp > 1:
        notes.append("--tp-comm-overlap needs Transformer Engine with userbuffers (--transformer-impl "
                     "transformer_engine, the default) and sequence parallelism.")
    if env:
        notes.append("CUDA_DEVICE_MAX_CONNECTIONS=1: validate_args requires it with tensor parallelism on GPUs "
                     "before Blackwell.")
    return notes


def export_megatron(plan: Plan, *, module_names: Mapping[str, str | Sequence[str]] | None = None,
                    inputs: Inputs | None = None, allow_layout: bool = True) -> dict:
    """Export ``plan`` as Megatron-LM arguments.

    Args:
        plan: the plan; its layers must be a transformer layer table.
        module_names: unused (Megatron names its own modules); noted if given.
        inputs: the plan file's inputs: the model's shape gives the model
            flags (:func:`model_args`), ``job.zero1`` the distributed
            optimizer, the cluster's node size the ``torchrun`` line. Without
            a transformer config only the parallelism flags are written
            (noted: Megatron then refuses the command).
        allow_layout: ``False`` for a Megatron-LM without
            ``--pipeline-model-parallel-layout``; splits that only a layout can
            express are then refused.

    Returns:
        ``{"runtime", "runtime_version", "format_version", "args": [argv
        items of pretrain_gpt.py], "data_args": [a mock-data smoke run],
        "env": {name: value}, "command_line": str (env, torchrun,
        pretrain_gpt.py, args, data_args), "layout": str | None,
        "num_layers", "world_size", "num_microbatches", "has_embedding",
        "has_head", "files": {"launch_megatron.sh": text}, "notes"}``
        (``has_*``: whether the plan's layer list has those layers, which the
        parse-back needs to index layers).

    Raises:
        InputError: a plan that is not a transformer, a schedule Megatron does
            not run, an interleaved plan with ``m % pp != 0``, or a split that
            no flag (or allowed layout) expresses; each with the rule.
    """
    layers = plan_layers(plan, "megatron")
    shape = transformer_shape(layers.names)
    if shape is None:
        sample = ", ".join(layers.names[:4])
        raise InputError(
            f"megatron: the plan's layers ({sample}, ...) are not a transformer layer table "
            f"(embedding, block_00 .. block_<L-1>, head); Megatron-LM builds GPT-style models from "
            f"--num-layers transformer layers and cannot take this split"
        )
    has_emb, L, has_head = shape
    explicit = has_emb and has_head
    p, v, m, mbs = plan.pp, plan.vp, plan.num_micro_batches, plan.micro_batch_size

    _check_schedule(plan)

    counts, layout, split_args, how = _split(layers, explicit, p, v, L, allow_layout)

    inputs = inputs or Inputs()
    if inputs.sharding not in ("none", "zero1"):
        raise InputError(
            f"megatron: sharding {inputs.sharding!r}: Megatron-LM's distributed optimizer shards the optimizer "
            f"state only (ZeRO-1: --use-distributed-optimizer), so the plan's memory would not be what runs; "
            f"re-plan with --sharding zero1 or none"
        )
    args = [
        "--num-layers", str(L),
        "--pipeline-model-parallel-size", str(p),
        "--tensor-model-parallel-size", str(plan.tp),
        *split_args,
        "--micro-batch-size", str(mbs),
        "--global-batch-size", str(mbs * m * plan.dp),
    ]
    notes = [f"split written with: {how}."]
    order = refuse_rank_order(plan, "megatron", ("data", "pipeline"), MEGATRON_RANK_ORDER, inputs)
    if order == "pipeline":
        # initialize_model_parallel(order="tp-cp-ep-pp-dp"): each replica's stages on consecutive ranks
        args.append("--use-tp-pp-dp-mapping")
        notes.append("--use-tp-pp-dp-mapping: ranks in the order tp-cp-ep-pp-dp, each data-parallel replica's "
                     "pipeline stages on consecutive ranks, as planned (the default tp-cp-ep-dp-pp would put the "
                     "replicas of a stage there instead).")
    t = inputs.transformer
    if t is not None:
        margs, mnotes = model_args(t, inputs.seq_len)
        half = inputs.fp16_note(plan, "--fp16", "Megatron-LM")
        if half:  # no bf16 on those devices: fp16 with dynamic loss scaling (Megatron's default for --fp16)
            margs = ["--fp16" if a == "--bf16" else a for a in margs]
            mnotes.append(half)
        args += margs
        notes += mnotes
    else:
        notes.append("warning: no model shape in the export's inputs (export from a plan file written by pipesearch plan "
                     "for a transformer config): add --hidden-size, --num-attention-heads, --seq-length, "
                     "--max-position-embeddings and the model's type flags, or validate_args refuses the command.")
    if inputs.zero1:
        args.append("--use-distributed-optimizer")
    args += _overlap_args(plan, inputs)
    env = {}
    if plan.tp > 1:
        # validate_args asserts it for tp > 1 before Blackwell (compute capability < 10)
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    rc = recompute_mode(plan, "megatron")
    if rc == "selective":
        args += ["--recompute-granularity", "selective"]
    elif rc == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    elif rc == "none" and t is not None:  # a transformer: Transformer Engine's attention keeps no scores
        notes.append(stored_scores_note("Megatron-LM's default attention (--transformer-impl transformer_engine, "
                                        "--attention-backend auto: a flash or fused kernel where the device and "
                                        "shapes allow)", "no --recompute-granularity"))
    sp = sequence_parallel(plan)
    if sp and plan.tp > 1:
        args.append("--sequence-parallel")
    elif sp:
        notes.append("sequence_parallel has no effect with tp=1 (Megatron turns it off); not written.")
    notes += _plan_notes(plan, inputs, explicit, layout, how, module_names, env)
    world = plan.tp * p * plan.dp
    state_note = _state_note(inputs.job, plan.dp)
    if state_note:
        notes.insert(0, state_note)
    # a smoke run: validate_args takes the command without a schedule, but training needs --lr and an end
    data_args = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--train-iters", "10", "--lr", "1.0e-4"]
    notes.append("data_args (--mock-data --tokenizer-type NullTokenizer --train-iters 10 --lr 1.0e-4) make the "
                 "command a 10-step run on synthetic data; replace them with --data-path, the model's tokenizer "
                 "and the run's --train-iters, --lr schedule and checkpoint options.")
    launch, launch_note = torchrun_prefix(world, inputs, plan, order)
    if launch_note:
        notes.append(launch_note)
    command = [*launch, "pretrain_gpt.py", *args, *data_args]
    warnings = "".join(f"# {n}\n" for n in notes if n.startswith("warning:"))  # what to fix before it runs
    script = ("#!/usr/bin/env bash\n# Megatron-LM (" + RUNTIME_VERSION + ") launch for the plan (pipesearch export); "
              "run from a Megatron-LM checkout\n" + warnings + "set -euo pipefail\n"
              + node_rank_preamble(plan, inputs, order) + shell_command(command, env) + "\n")
    return {
        "runtime": RUNTIME,
        "runtime_version": RUNTIME_VERSION,
        "format_version": FORMAT_VERSION,
        "args": args,
        "data_args": data_args,
        "env": env,
        "command_line": shell_line(command, env),
        "layout": layout,
        "num_layers": L,
        "world_size": plan.tp * p * plan.dp,
        "num_microbatches": m,
        "has_embedding": has_emb,
        "has_head": has_head,
        "files": {"launch_megatron.sh": script},
        "notes": notes,
    }


# ---------------------------------------------------------------- parse back


def _ranges_from_tokens(stages: Sequence[Sequence[str]], embedding: bool, head: bool) -> list[tuple[int, int]]:
    out, pos = [], 0
    for st in stages:
        n = sum(1 for c in st if c == "t" or (embedding and c == "E") or (head and c == "L"))
        out.append((pos, pos + n))
        pos += n
    return out


def stages_from_megatron_layout(layout: str, pp: int, num_layers: int | None = None) -> list[tuple[int, int]]:
    """Stage boundaries from a layout string, over the layers
    ``embedding, block_0 .. block_{L-1}, head`` (indices ``0 .. L + 1``).

    Raises:
        InputError: a malformed layout (Megatron's own checks).
    """
    stages = parse_layout(layout)
    if num_layers is None:
        num_layers = sum(c == "t" for st in stages for c in st)
    validate_layout(stages, pp, num_layers)
    if any(c == "m" for st in stages for c in st):
        raise InputError("megatron layout: MTP layers 'm' have no pipesearch layer")
    return _ranges_from_tokens(stages, True, True)


def parse_args(args: Sequence[str]) -> dict[str, str | bool]:
    """The Megatron flags in an argv list: ``{"--flag": value}`` (``True`` for
    switches)."""
    out: dict[str, str | bool] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if a in _VALUE_FLAGS:
            if i + 1 >= len(args):
                raise InputError(f"megatron args: {a} has no value")
            out[a] = args[i + 1]
            i += 2
        else:
            out[a] = True
            i += 1
    return out


def stages_from_megatron_args(args: Sequence[str], *, embedding: bool = True,
                              head: bool = True) -> list[tuple[int, int]]:
    """Stage boundaries that Megatron derives from an argv list (the export's
    ``args``), by its rules (see :func:`megatron_stage_layers`).

    Args:
        args: argv items.
        embedding, head: whether the plan's layer list has an ``embedding`` /
            ``head`` layer (the export's ``has_embedding`` / ``has_head``); the
            ranges index the plan's layers (``embedding?, block.., head?``).

    Returns:
        Half-open layer index ranges, one per stage.
    """
    f = parse_args(args)
    L = int(f["--num-layers"])
    p = int(f.get("--pipeline-model-parallel-size", 1))
    if "--pipeline-model-parallel-layout" in f:
        stages = parse_layout(str(f["--pipeline-model-parallel-layout"]))
        validate_layout(stages, p, L)
        return _ranges_from_tokens(stages, embedding, head)
    ae = bool(f.get("--account-for-embedding-in-pipeline-split", False))
    al = bool(f.get("--account-for-loss-in-pipeline-split", False))
    first = int(f["--decoder-first-pipeline-num-layers"]) if "--decoder-first-pipeline-num-layers" in f else None
    last = int(f["--decoder-last-pipeline-num-layers"]) if "--decoder-last-pipeline-num-layers" in f else None
    v = 1
    if "--num-virtual-stages-per-pipeline-rank" in f:
        v = int(f["--num-virtual-stages-per-pipeline-rank"])
    elif "--num-layers-per-virtual-pipeline-stage" in f:
        per_rank = (L + ae + al) // p
        k = int(f["--num-layers-per-virtual-pipeline-stage"])
        if per_rank % k:
            raise InputError("megatron: number of layers per pipeline stage must be divisible by the number of "
                             "layers per virtual pipeline stage")
        v = per_rank // k
    counts = megatron_stage_layers(L, p, v, first=first, last=last, account_embedding=ae, account_loss=al)
    return _ranges_from_tokens(_stage_tokens(counts, embedding, head), embedding, head)
