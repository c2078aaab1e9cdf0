"""Serving cost model: per-stage weights, KV capacity and step times.

All figures are per device of one tensor-parallel group of ``tp`` devices
(every rank of a stage holds the same share). Formulas, each with its source,
are derived in ``docs/serving_costs.md``; in short:

* KV bytes per token per layer: ``2 * kv_heads_per_rank * head_dim *
  kv_dtype_bytes`` with ``kv_heads_per_rank = max(1, kv_heads // tp)``: a rank
  holds its share of the key/value heads, and one whole head (replicated) when
  ``tp`` exceeds the KV heads (vLLM ``QKVParallelLinear``,
  ``ModelConfig.get_num_kv_heads``).
* Weights of a stage: its decoder blocks (GEMM weights ``/ tp`` in the weight
  format, the key/value projections of one whole head per rank when ``tp``
  exceeds the KV heads, norms whole in 16-bit), the vocabulary embedding on the first stage
  and final norm + LM head on the last; with tied embeddings the last stage
  still holds the matrix (vLLM builds ``embed_tokens`` on the last rank too).
  Vocabulary rows are padded to a multiple of 64 and split by ``tp``
  (vLLM ``VocabParallelEmbedding``, ``DEFAULT_VOCAB_PADDING_SIZE = 64``).
* KV memory of a stage: vLLM ``memory_fraction * memory - reserve -
  activation peak - weights``; SGLang ``memory_fraction * memory - weights``;
  capacity in whole blocks; the engine's pool is the minimum over stages.
* A step of a micro-batch with ``d`` decode tokens (mean context ``c``) and
  ``p`` prefill tokens (prompt ``n``) on one decoder layer takes
  ``max(FLOPs / (peak * achieved_fraction), bytes / (bandwidth * 0.8))`` (a
  roofline; Williams et al. 2009; weight GEMMs at the FP8 peak for fp8
  weights on devices with FP8 tensor cores, attention at the 16-bit peak)
  plus two tensor-parallel all-reduces of
  ``(d + p) h`` 16-bit values (Shoeybi et al. 2019): FLOPs ``2 (d + p) G / tp
  + 4 (q / tp) (d c + p n / 2)``, bytes the layer's weights once plus the
  decode tokens' KV read and every token's KV write (Pope et al. 2022,
  "Efficiently Scaling Transformer Inference", sec. 3).
* The last stage adds the LM head (``2 t h V / tp`` FLOPs for the ``t`` tokens
  that sample, its matrix read once); each stage boundary sends hidden state
  and residual, ``2 (d + p) h`` 16-bit values (vLLM ``IntermediateTensors``).

Units: seconds, bytes, FLOPs. Errors: :class:`~pipesearch.errors.InputError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..errors import InputError
from ..profiles.transformer import TransformerConfig, block_parameters, norm_parameters
from ..types import DeviceSpec, Link
from .dtypes import HALF_BYTES, WeightFormat
from .engine import EngineSpec

__all__ = ["ServeCosts", "VOCAB_PADDING", "LOGIT_BYTES", "allreduce_s"]

#: vocabulary rows are padded to a multiple of this (vLLM DEFAULT_VOCAB_PADDING_SIZE)
VOCAB_PADDING = 64
#: bytes of one logit kept for sampling (fp32)
LOGIT_BYTES = 4.0


def _num(x):
    """A Python number as a float (the fast scalar path of the simulator),
    anything else as a float array."""
    return float(x) if isinstance(x, (int, float)) else np.asarray(x, dtype=float)


def _maximum(a, b):
    return max(a, b) if isinstance(a, float) and isinstance(b, float) else np.maximum(a, b)


#: the serving engines' own all-reduce: tensor-parallel degrees it runs at,
#: the largest tensor it takes (bytes; NCCL above), and the sizes below which
#: it runs one-shot at up to 4 and up to 8 ranks (vLLM
#: ``custom_all_reduce.py`` and ``csrc/custom_all_reduce.cuh``; SGLang's is
#: the same kernel)
CUSTOM_AR_SIZES, CUSTOM_AR_MAX_BYTES = (2, 4, 6, 8), 8 * 2**20
CUSTOM_AR_ONE_SHOT_BYTES = {4: 512 * 2**10, 8: 256 * 2**10}


def allreduce_s(nbytes, t: int, link: Link):
    """All-reduce of ``nbytes`` over ``t`` ranks linked by ``link``; 0 for
    ``t = 1``. Accepts arrays.

    * NCCL's ring: ``2 (t-1)/t * nbytes / bw + 2 (t-1) * latency``
      (Patarasuk & Yuan 2009);
    * where every pair of devices is linked through NVSwitch
      (``link.nvswitch``), the engines' own all-reduce at ``t`` of 2, 4, 6
      or 8 and tensors under 8 MiB (vLLM enables it only on fully
      NVLink-connected GPUs, beyond two): one-shot, every rank reading the
      others' whole tensors, ``latency + (t-1) nbytes / bw``, at ``t = 2``
      and below 512 KiB (``t <= 4``) or 256 KiB (``t <= 8``); else
      two-shot, a reduce-scatter and an all-gather over the switch, ``2
      latency + 2 (t-1)/t nbytes / bw``, which is also what larger tensors
      and other ``t`` take there (current vLLM's FlashInfer and
      symmetric-memory all-reduce, NCCL over NVSwitch: two switch hops,
      not a ring's ``2 (t-1)``). Decode's all-reduces (a few KiB) then cost
      one hop each."""
    x = _num(nbytes)
    if t <= 1:
        return 0.0 * x
    bw, lat = link.bandwidth_bytes_per_s, link.latency_s
    if not link.nvswitch:
        return 2 * (t - 1) / t * x / bw + 2 * (t - 1) * lat
    two_shot = 2 * lat + 2 * (t - 1) / t * x / bw
    if t not in CUSTOM_AR_SIZES:
        return two_shot
    one_shot = lat + (t - 1) * x / bw
    small = x < CUSTOM_AR_ONE_SHOT_BYTES[4 if t <= 4 else 8] if t > 2 else x < CUSTOM_AR_MAX_BYTES
    return np.where(small, one_shot, two_shot) if not isinstance(x, float) else (one_shot if small else two_shot)


@dataclass(frozen=True)
class ServeCosts:
    """The cost terms of one model served at one tensor-parallel degree.

    Attributes:
        cfg: a decoder-only transformer.
        device: the device type of every rank.
        tp: tensor-parallel degree.
        weights: weight format.
        kv_dtype_bytes: bytes per KV-cache element.
        engine: engine settings.
        tp_link: link inside a tensor-parallel group.
        memory_reserve_bytes: memory kept free per device (CUDA context,
            NCCL buffers, CUDA graphs); vLLM counts it inside its fraction.

    Raises:
        InputError: an encoder-decoder model, ``tp < 1``.
    """

    cfg: TransformerConfig
    device: DeviceSpec
    tp: int
    weights: WeightFormat
    kv_dtype_bytes: float
    engine: EngineSpec
    tp_link: Link
    memory_reserve_bytes: float = 2**30

    def __post_init__(self) -> None:
        if self.cfg.is_encoder_decoder:
            raise InputError(f"model {self.cfg.name!r}: encoder-decoder models are not served by the "
                             f"decoder-only serving cost model")
        if self.tp < 1:
            raise InputError(f"--tp {self.tp}: expected an integer >= 1")

    # ------------------------------------------------------------ sizes
    @property
    def num_layers(self) -> int:
        return self.cfg.num_layers

    @cached_property
    def vocab_rows_per_rank(self) -> int:
        """Vocabulary rows one rank holds: ``ceil(pad64(V) / tp)``."""
        padded = -(-self.cfg.vocab_size // VOCAB_PADDING) * VOCAB_PADDING
        return -(-padded // self.tp)

    @cached_property
    def kv_heads_per_rank(self) -> int:
        return max(1, self.cfg.num_kv_heads // self.tp)  # type: ignore[operator]

    @cached_property
    def kv_bytes_per_token_layer(self) -> float:
        """KV bytes one token takes in one layer on one rank."""
        return 2 * self.kv_heads_per_rank * self.cfg.head_dim * self.kv_dtype_bytes  # type: ignore[operator]

    @cached_property
    def block_gemm_params(self) -> int:
        """GEMM weights of one decoder block (whole, before tp)."""
        return block_parameters(self.cfg, 0)[0]

    @cached_property
    def block_weight_bytes(self) -> float:
        """Bytes of one decoder block on one rank: its share of the GEMM
        weights, plus the key/value projections' replicas when ``tp``
        exceeds the KV heads (each rank holds :attr:`kv_heads_per_rank`
        whole heads, ``2 (h + bias) d`` parameters each, not ``g / tp`` of
        them: vLLM ``QKVParallelLinear``), and the norms whole."""
        c = self.cfg
        split, replicated = block_parameters(c, 0)
        kv_replicas = max(0.0, self.kv_heads_per_rank - c.num_kv_heads / self.tp)  # type: ignore[operator]
        split_per_rank = split / self.tp + kv_replicas * 2 * (c.hidden_size + int(c.bias or c.qkv_bias)) * c.head_dim
        return split_per_rank * self.weights.gemm_bytes_per_param + replicated * self.weights.other_bytes_per_param

    @cached_property
    def embedding_bytes(self) -> float:
        """Vocabulary embedding (and a learned position table) on one rank."""
        c = self.cfg
        pos = c.max_position_embeddings * c.hidden_size if c.position_embedding == "learned" else 0
        return (self.vocab_rows_per_rank * c.hidden_size + pos) * self.weights.other_bytes_per_param

    @cached_property
    def head_matrix_bytes(self) -> float:
        """The LM-head matrix on one rank (the embedding's copy when tied)."""
        return self.vocab_rows_per_rank * self.cfg.hidden_size * self.weights.other_bytes_per_param

    @cached_property
    def final_norm_bytes(self) -> float:
        return norm_parameters(self.cfg) * self.weights.other_bytes_per_param

    def extra_weight_bytes(self, first: bool, last: bool) -> float:
        """Weights a stage holds besides its decoder blocks."""
        out = 0.0
        if first:
            out += self.embedding_bytes
        if last:
            out += self.final_norm_bytes
            if not (first and self.cfg.tied_embeddings):
                out += self.head_matrix_bytes
        return out

    def stage_weight_bytes(self, num_blocks, first: bool, last: bool):
        """Weights of a stage of ``num_blocks`` decoder blocks on one rank."""
        return np.asarray(num_blocks) * self.block_weight_bytes + self.extra_weight_bytes(first, last)

    def activation_peak_bytes(self, last: bool) -> float:
        """Activation peak of the engine's profiling forward pass of
        ``max_num_batched_tokens`` tokens: the MLP's input and residual plus its
        gate/up output and activated half, ``T * 2 * (2h + 3f/tp)``, plus the
        fp32 logits of ``max_num_seqs`` sampled tokens on the last stage."""
        c, e = self.cfg, self.engine
        mlp_out = (3 if c.gated_mlp else 2) * c.ffn_hidden_size / self.tp
        out = e.max_num_batched_tokens * HALF_BYTES * (2 * c.hidden_size + mlp_out)
        if last:
            out += e.max_num_seqs * self.vocab_rows_per_rank * LOGIT_BYTES
        return out

    def budget_bytes(self, last: bool) -> float:
        """Memory for weights and KV on one rank of a stage."""
        e = self.engine
        total = self.device.memory_bytes * e.memory_fraction
        if e.activation_in_budget:
            total -= self.memory_reserve_bytes + self.activation_peak_bytes(last)
        return total

    def stage_kv_tokens(self, num_blocks, first: bool, last: bool):
        """KV capacity in tokens of a stage: whole blocks of the memory left
        after weights (``-1`` where the weights alone do not fit)."""
        n = np.asarray(num_blocks, dtype=float)
        free = self.budget_bytes(last) - self.stage_weight_bytes(n, first, last)
        per_block = self.engine.block_size_tokens * self.kv_bytes_per_token_layer * np.maximum(n, 1)
        blocks = np.floor(free / per_block)
        tokens = np.where(free < 0, -1.0, blocks * self.engine.block_size_tokens)
        return tokens

    def tokens_per_sequence(self, input_len: int, output_len: int) -> int:
        """KV tokens one request holds at its longest (prompt and every
        generated token), rounded up to whole blocks."""
        b = self.engine.block_size_tokens
        return -(-(input_len + output_len) // b) * b

    # ------------------------------------------------------------ times
    @cached_property
    def gemm_flops_rate(self) -> float:
        """16-bit GEMM rate: ``peak_fp16 * achieved_fraction_at(h)``."""
        return self.device.peak_fp16_flops * self.device.achieved_fraction_at(self.cfg.hidden_size)

    @cached_property
    def weight_gemm_flops_rate(self) -> float:
        """Rate of the blocks' weight GEMMs: the FP8 peak (same achieved
        fraction) for fp8 weights on a device with FP8 tensor cores (W8A8,
        as vLLM and SGLang run FP8 on Ada and Hopper), else the 16-bit rate
        (weight-only kernels dequantize to 16-bit)."""
        if self.weights.name == "fp8" and self.device.peak_fp8_flops > 0:
            return self.device.peak_fp8_flops * self.device.achieved_fraction_at(self.cfg.hidden_size)
        return self.gemm_flops_rate

    @cached_property
    def bandwidth(self) -> float:
        return self.device.streaming_bandwidth_bytes_per_s

    def layer_s(self, decode_tokens, decode_context, prefill_tokens, prompt_len):
        """Seconds of one decoder layer for a micro-batch (arrays broadcast):
        roofline of compute and memory traffic plus two all-reduces."""
        c, t = self.cfg, self.tp
        d, p, ctx, n = _num(decode_tokens), _num(prefill_tokens), _num(decode_context), _num(prompt_len)
        q = c.q_dim / t
        gemm = 2 * (d + p) * self.block_gemm_params / t
        attention = 4 * q * (d * ctx + p * n / 2)
        kv = self.kv_bytes_per_token_layer
        nbytes = self.block_weight_bytes + kv * d * ctx + kv * (d + p)
        compute = gemm / self.weight_gemm_flops_rate + attention / self.gemm_flops_rate
        step = _maximum(compute, nbytes / self.bandwidth)
        return step + 2 * allreduce_s((d + p) * c.hidden_size * HALF_BYTES, t, self.tp_link)

    def first_extra_s(self, tokens):
        """Embedding lookup (rows read) and its all-reduce on the first stage."""
        x = _num(tokens) * self.cfg.hidden_size * HALF_BYTES
        return x / self.bandwidth + allreduce_s(x, self.tp, self.tp_link)

    def last_extra_s(self, sampled_tokens):
        """Final norm + LM head for the tokens that sample, on the last stage:
        roofline of ``2 t h V/tp`` FLOPs against the head matrix read once
        plus the logits written, and the logits gathered to one rank."""
        s = _num(sampled_tokens)
        rows = self.vocab_rows_per_rank
        flops = 2 * s * self.cfg.hidden_size * rows
        nbytes = self.head_matrix_bytes + s * rows * LOGIT_BYTES
        step = _maximum(flops / self.gemm_flops_rate, nbytes / self.bandwidth)
        if self.tp > 1:
            gathered = s * rows * self.tp * LOGIT_BYTES
            step = step + (self.tp - 1) / self.tp * gathered / self.tp_link.bandwidth_bytes_per_s \
                + (self.tp - 1) * self.tp_link.latency_s
        return step

    def p2p_bytes(self, tokens):
        """Bytes one stage boundary sends for a micro-batch: hidden state and
        residual, ``2 * tokens * h`` 16-bit values."""
        return 2 * _num(tokens) * self.cfg.hidden_size * HALF_BYTES

