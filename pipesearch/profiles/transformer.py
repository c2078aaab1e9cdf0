"""Transformer models from hyper-parameters to analytic layer tables.

A :class:`TransformerConfig` holds the shape of a GPT/LLaMA-style decoder or a
T5-style encoder-decoder. :func:`layer_table` turns it into a
:class:`~pipesearch.types.ModelProfile` (layers ``embedding``, ``block_00`` ...,
``head``) for one device type and one choice of tensor parallelism, sequence
parallelism and activation recomputation, so that the pipeline search can treat
the model like a measured profile. :func:`parameter_count` counts its
parameters; :func:`megatron_params_eq2` and :func:`megatron_flops_eq3` are the
closed forms of Narayanan et al. (SC'21) the tests check against.

Sources of the formulas (full derivations in ``docs/transformer_costs.md``):

* FLOPs: ``2 m n k`` per GEMM, backward = 2x forward; Narayanan et al.,
  "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM", SC'21, sec. 5.1 / appendix, eq. (2) params, eq. (3) FLOPs.
* Tensor-parallel communication: 2 all-reduces of ``b s h`` in the forward and
  2 in the backward of each block (Shoeybi et al. 2019, Megatron-LM, Fig. 3;
  SC'21 sec. 2.3 and 3.3); with sequence parallelism each all-reduce becomes an
  all-gather plus a reduce-scatter of the same total volume (Korthikanti et al.,
  "Reducing Activation Recomputation in Large Transformer Models", 2022,
  sec. 4.2.2). Ring all-reduce ``2 (t-1)/t * bytes / bw + 2 (t-1) * latency``
  (Patarasuk & Yuan 2009).
* Activation memory: Korthikanti et al. 2022, sec. 4 and Table 2.

Every term of a layer at micro-batch size ``b`` is ``b`` times the term at
``b = 1`` (FLOPs, bytes, bandwidth time), except the per-message latency of
the tensor-parallel collectives, which does not grow with ``b``.

Units: seconds, bytes, FLOPs. Errors: :class:`~pipesearch.errors.InputError`
naming the file (or config), the key and the value.
"""

from __future__ import annotations

import difflib
import json
import math
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

from ..errors import InputError
from ..input_files import parse_failure, read_input_text, unique_keys
from ..limits import MAX_COUNT, MAX_TRANSFORMER_BLOCKS
from ..types import DeviceSpec, Layer, Link, ModelProfile

__all__ = [
    "TransformerConfig",
    "KINDS",
    "POSITION_EMBEDDINGS",
    "NORMS",
    "RECOMPUTE",
    "load_transformer",
    "load_transformer_toml",
    "load_hf_config",
    "is_transformer_toml",
    "layer_table",
    "parameter_count",
    "padded_vocab_size",
    "tied_layers",
    "tied_embedding_param_bytes",
    "block_parameters",
    "norm_parameters",
    "palm_model_flops",
    "forward_flops",
    "megatron_params_eq2",
    "megatron_flops_eq3",
]

KINDS = ("decoder", "encoder-decoder")
POSITION_EMBEDDINGS = ("learned", "rotary", "relative", "none")
NORMS = ("layernorm", "rmsnorm")
#: HuggingFace ``rope_scaling`` types (``rope_type``, or ``type`` in older configs); None: none
ROPE_SCALINGS = (None, "llama3", "linear", "dynamic", "yarn", "longrope")
RECOMPUTE = ("none", "selective", "full")

#: bytes of one dropout-mask element (Korthikanti et al. 2022 sec. 4.1 count
#: masks as 1 byte per element)
MASK_BYTES = 1
#: bytes of one element of the fp32 softmax the vocab-parallel cross entropy
#: keeps for its backward (Megatron ``vocab_parallel_cross_entropy``)
LOSS_BYTES = 4
#: bytes of one token id (int64, as PyTorch embedding lookups take them)
TOKEN_ID_BYTES = 8


# --------------------------------------------------------------------------- #
# the config


@dataclass(frozen=True)
class TransformerConfig:
    """Shape of a transformer language model.

    Attributes:
        name: model name (catalog name or file stem).
        num_layers: transformer blocks of a decoder-only model; encoder blocks
            of an encoder-decoder model.
        hidden_size: model width ``h`` (``d_model``).
        num_attention_heads: query heads ``a``.
        ffn_hidden_size: MLP inner width ``f`` (``4h`` for GPT; ``d_ff``).
        vocab_size: tokenizer vocabulary ``V`` as published (unpadded; see
            ``make_vocab_size_divisible_by``).
        seq_len: default sequence length (tokens per sample) of
            :func:`layer_table`; for learned position embeddings also the
            default ``max_position_embeddings``.
        kind: ``"decoder"`` (GPT, LLaMA) or ``"encoder-decoder"`` (T5).
        decoder_seq_len: default decoder tokens per sample of an
            encoder-decoder model (``None``: ``seq_len``; T5's span-corruption
            pre-training at 15% noise, mean span 3, runs 512 encoder and 114
            decoder tokens: the ``t5`` library's ``random_spans_helper``);
            must be ``None`` for a decoder.
        num_decoder_layers: decoder blocks of an encoder-decoder model
            (0 here means ``num_layers``; a file gives at least 1, or no key
            for ``num_layers``); must be 0 for a decoder.
        num_kv_heads: key/value heads ``g`` (grouped-query attention, Ainslie
            et al. 2023); ``None`` means ``num_attention_heads`` (MHA).
        head_dim: size of one head ``d``; ``None`` means ``hidden_size /
            num_attention_heads``. T5 sets it (``d_kv``) and then
            ``a * d`` need not equal ``h``.
        gated_mlp: SwiGLU/GEGLU MLP with three GEMMs (gate, up, down;
            Shazeer 2020) instead of two.
        tied_embeddings: the LM head reuses the input embedding matrix.
        position_embedding: ``"learned"`` (GPT-2/3: a ``P x h`` table),
            ``"rotary"`` (no parameters), ``"relative"`` (T5: a
            ``buckets x heads`` bias per stack), ``"none"``.
        max_position_embeddings: rows ``P`` of a learned position table
            (``None``: ``seq_len``).
        norm: ``"layernorm"`` (weight and bias, ``2h`` parameters) or
            ``"rmsnorm"`` (weight only, ``h``).
        bias: linear layers have biases (GPT-2/3, GPT-NeoX) or not (LLaMA, T5).
        dropout: the model trains with dropout (GPT-3, T5); changes the saved
            activations (masks), not the FLOPs.
        qkv_bias: the query, key and value projections have biases though
            the other linear layers have none (Qwen2; Megatron-LM
            ``--add-qkv-bias``); implied by ``bias``.
        qk_norm: an RMSNorm on each query and key head (Qwen3; Megatron-LM
            ``--qk-layernorm``); its ``2 d`` weights per block are left out
            of the layer table.
        rope_theta: the rotary base (``None``: the runtime's default, 10000).
        rope_scaling_type, rope_scaling_factor: the rotary frequencies'
            scaling of a HuggingFace config's ``rope_scaling`` (``rope_type``
            and ``factor``; Llama 3.1: ``"llama3"``, 8), or ``None``: no
            cost depends on it, the Megatron-LM export sets it.
        norm_eps: the norms' epsilon (``None``: the runtime's default).
        relative_attention_num_buckets: T5 relative-position buckets.
        make_vocab_size_divisible_by: Megatron-LM pads the vocabulary to a
            multiple of this times the tensor-parallel degree
            (``--make-vocab-size-divisible-by``, default 128); 1 disables.
        source: provenance, free text.

    Raises:
        InputError: a non-positive size, an unknown kind/norm/position
            embedding, ``hidden_size`` not divisible by the heads (without
            ``head_dim``), heads not divisible by the kv heads.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    vocab_size: int
    seq_len: int
    kind: str = "decoder"
    decoder_seq_len: int | None = None
    num_decoder_layers: int = 0
    num_kv_heads: int | None = None
    head_dim: int | None = None
    gated_mlp: bool = False
    tied_embeddings: bool = True
    position_embedding: str = "learned"
    max_position_embeddings: int | None = None
    norm: str = "layernorm"
    bias: bool = True
    dropout: bool = True
    relative_attention_num_buckets: int = 32
    make_vocab_size_divisible_by: int = 128
    qkv_bias: bool = False
    qk_norm: bool = False
    rope_theta: float | None = None
    rope_scaling_type: str | None = None
    rope_scaling_factor: float | None = None
    norm_eps: float | None = None
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        _validate(values, f"transformer config {self.name!r}", {})
        resolved = _resolve(values)
        for key in ("num_decoder_layers", "num_kv_heads", "head_dim", "max_position_embeddings"):
            object.__setattr__(self, key, resolved[key])

    @property
    def is_encoder_decoder(self) -> bool:
        return self.kind == "encoder-decoder"

    @property
    def total_blocks(self) -> int:
        """Encoder plus decoder blocks."""
        return self.num_layers + (self.num_decoder_layers if self.is_encoder_decoder else 0)

    @property
    def q_dim(self) -> int:
        """Width of the query projection, ``a * d``."""
        return self.num_attention_heads * self.head_dim  # type: ignore[operator]

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection, ``g * d``."""
        return self.num_kv_heads * self.head_dim  # type: ignore[operator]


#: field -> (kind of value, required in a file)
_FIELD_KINDS: dict[str, tuple[str, bool]] = {
    "name": ("str", False),
    "num_layers": ("pos_int", True),
    "hidden_size": ("pos_int", True),
    "num_attention_heads": ("pos_int", True),
    "ffn_hidden_size": ("pos_int", True),
    "vocab_size": ("pos_int", True),
    "seq_len": ("pos_int", True),
    "kind": (KINDS, False),
    "decoder_seq_len": ("opt_pos_int", False),
    "num_decoder_layers": ("nonneg_int", False),
    "num_kv_heads": ("opt_pos_int", False),
    "head_dim": ("opt_pos_int", False),
    "gated_mlp": ("bool", False),
    "tied_embeddings": ("bool", False),
    "position_embedding": (POSITION_EMBEDDINGS, False),
    "max_position_embeddings": ("opt_pos_int", False),
    "norm": (NORMS, False),
    "bias": ("bool", False),
    "dropout": ("bool", False),
    "relative_attention_num_buckets": ("pos_int", False),
    "make_vocab_size_divisible_by": ("pos_int", False),
    "qkv_bias": ("bool", False),
    "qk_norm": ("bool", False),
    "rope_theta": ("opt_pos_float", False),
    "rope_scaling_type": (ROPE_SCALINGS, False),
    "rope_scaling_factor": ("opt_pos_float", False),
    "norm_eps": ("opt_pos_float", False),
    "source": ("str", False),
}


def _show(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else repr(value)


#: per family the config keys transformers reads as one setting (the config class's ``attribute_map``):
#: GPT-2's and T5's own names and the common ones
_HF_ALIASES = {
    "gpt2": (("n_layer", "num_hidden_layers"), ("n_embd", "hidden_size"), ("n_head", "num_attention_heads"),
             ("n_positions", "max_position_embeddings")),
    "t5": (("num_layers", "num_hidden_layers"), ("d_model", "hidden_size"), ("num_heads", "num_attention_heads")),
}


def _bad(where: str, key: str, value: Any, expected: str) -> InputError:
    return InputError(f"{where}: key '{key}' = {_show(value)}: expected {expected}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _validate(values: dict[str, Any], where: str, keys: dict[str, str]) -> None:
    """Check field values; ``keys`` maps a field to the key name the input
    used for it (HF names), so the message names what the user wrote."""

    def k(name: str) -> str:
        return keys.get(name, name)

    for name, (kind, _) in _FIELD_KINDS.items():
        v = values.get(name)
        if kind == "str":
            if not isinstance(v, str):
                raise _bad(where, k(name), v, "a string")
            if name == "name" and not (v.strip() and v.isprintable()):  # the engines' command lines and tables show it
                raise _bad(where, k(name), v, "a non-blank one-line string without tabs or control characters")
        elif kind == "bool":
            if not isinstance(v, bool):
                raise _bad(where, k(name), v, "true or false")
        elif kind == "pos_int":
            if not _is_int(v) or not 0 < v <= MAX_COUNT:
                raise _bad(where, k(name), v, f"a positive integer <= {MAX_COUNT}")
        elif kind == "nonneg_int":
            if not _is_int(v) or not 0 <= v <= MAX_COUNT:
                raise _bad(where, k(name), v, f"an integer in [0, {MAX_COUNT}]")
        elif kind == "opt_pos_int":
            if v is not None and (not _is_int(v) or not 0 < v <= MAX_COUNT):
                raise _bad(where, k(name), v, f"a positive integer <= {MAX_COUNT}")
        elif kind == "opt_pos_float":
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf):
                raise _bad(where, k(name), v, "a positive number")
        elif v not in kind:
            raise _bad(where, k(name), v, "one of " + ", ".join(repr(c) for c in kind))

    h, a = values["hidden_size"], values["num_attention_heads"]
    if values.get("head_dim") is None and h % a:
        raise InputError(
            f"{where}: key '{k('hidden_size')}' = {h} is not divisible by "
            f"'{k('num_attention_heads')}' = {a} (the head size h/a must be an integer; "
            f"give head_dim when a*head_dim differs from the hidden size)"
        )
    g = values.get("num_kv_heads")
    if g is not None and a % g:
        raise InputError(
            f"{where}: key '{k('num_attention_heads')}' = {a} is not divisible by "
            f"'{k('num_kv_heads')}' = {g} (each key/value head serves a whole group of "
            f"query heads)"
        )
    if values["kind"] == "decoder" and values["num_decoder_layers"]:
        raise _bad(where, k("num_decoder_layers"), values["num_decoder_layers"],
                   "0 (or no key) for kind = 'decoder'; decoder blocks are num_layers")
    if values["kind"] == "decoder" and values.get("decoder_seq_len") is not None:
        raise _bad(where, k("decoder_seq_len"), values["decoder_seq_len"],
                   "no key for kind = 'decoder' (only an encoder-decoder model has a decoder length; "
                   "seq_len is the decoder's)")
    blocks = values["num_layers"] + (values["num_decoder_layers"] or 0)
    if blocks > MAX_TRANSFORMER_BLOCKS:
        raise InputError(f"{where}: key '{k('num_layers')}' = {values['num_layers']} makes {blocks} blocks, more than "
                         f"the {MAX_TRANSFORMER_BLOCKS} a transformer config may have (each has a row in every layer "
                         "table); is it the right value?")
    mp = values.get("max_position_embeddings")
    if values["position_embedding"] == "learned" and mp is not None and values["seq_len"] > mp:
        raise InputError(
            f"{where}: key '{k('seq_len')}' = {values['seq_len']} exceeds "
            f"'{k('max_position_embeddings')}' = {mp} (learned position table)"
        )


def _resolve(values: dict[str, Any]) -> dict[str, Any]:
    out = dict(values)
    if out["num_kv_heads"] is None:
        out["num_kv_heads"] = out["num_attention_heads"]
    if out["head_dim"] is None:
        out["head_dim"] = out["hidden_size"] // out["num_attention_heads"]
    if out["kind"] == "encoder-decoder" and not out["num_decoder_layers"]:
        out["num_decoder_layers"] = out["num_layers"]
    if out["max_position_embeddings"] is None and out["position_embedding"] == "learned":
        out["max_position_embeddings"] = out["seq_len"]
    return out


def _build(values: dict[str, Any], where: str, keys: dict[str, str]) -> TransformerConfig:
    _validate(values, where, keys)
    return TransformerConfig(**values)


# --------------------------------------------------------------------------- #
# loaders


def _read_text(path: Path) -> str:
    return read_input_text(path, "transformer config")


def _read_toml(path: Path) -> dict[str, Any]:
    text = _read_text(path)  # its own refusal names the file once
    try:
        return tomllib.loads(text)  # read_input_text drops a byte-order mark
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"{path}: TOML syntax error: {e}") from None
    except (ValueError, RecursionError) as e:  # an integer of over 4300 digits, arrays nested too deeply
        raise InputError(f"{path}: cannot read TOML: {parse_failure(e)}") from None


def is_transformer_toml(path: str | Path) -> bool:
    """Whether ``path`` is a TOML file with a ``[transformer]`` table (the
    catalog format of :func:`load_transformer_toml`); False for unreadable or
    other files, never raises."""
    p = Path(path)
    if p.suffix != ".toml" or not p.is_file():  # never open a FIFO or a device
        return False
    try:
        with open(p, "rb") as f:
            return isinstance(tomllib.load(f).get("transformer"), dict)
    except (OSError, ValueError, RecursionError):  # TOMLDecodeError and UnicodeDecodeError are ValueErrors
        return False


def load_transformer_toml(path: str | Path, seq_len: int | None = None) -> TransformerConfig:
    """Load a catalog transformer config (``cost_models/*.toml``).

    The file holds one ``[transformer]`` table whose keys are the field names
    of :class:`TransformerConfig` (see ``docs/transformer_costs.md``);
    ``name`` defaults to the file stem. ``seq_len``: the sequence length
    where the file gives none (``--seq-len``, a serving request's tokens);
    the file's own is kept otherwise.

    Raises:
        InputError: unreadable file, TOML syntax error, no ``[transformer]``
            table, an unknown or missing key, or a bad value (message names the
            file, the key and the value).
    """
    p = Path(path)
    data = _read_toml(p)
    table = data.get("transformer")
    if not isinstance(table, dict):
        if "devices_per_node" in data or "groups" in data:
            raise InputError(f"{p}: no [transformer] table: this is a cluster file; give it to --cluster, "
                             f"and --model a catalog model, a transformer config or a layer profile")
        if "memory_GiB" in data or "memory_GB" in data:
            raise InputError(f"{p}: no [transformer] table: this is a device file; a cluster file names it "
                             f"(device = ...), and --model takes a catalog model, a transformer config or a profile")
        raise InputError(
            f"{p}: no [transformer] table (a transformer config is a [transformer] "
            f"table with num_layers, hidden_size, ...; see docs/transformer_costs.md)"
        )
    for key in data:
        if key != "transformer":
            raise InputError(f"{p}: unknown top-level key '{key}' (only [transformer] is allowed)")
    allowed = list(_FIELD_KINDS)
    for key in table:
        if key not in _FIELD_KINDS:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise InputError(
                f"{p}: unknown key 'transformer.{key}' ({hint}allowed keys: {', '.join(allowed)})"
            )
    for key, (_, required) in _FIELD_KINDS.items():
        if required and key not in table and not (key == "seq_len" and seq_len is not None):
            fix = "; add it, or pass --seq-len" if key == "seq_len" else ""
            raise InputError(f"{p}: missing key 'transformer.{key}' (a positive integer){fix}")
    values = {f.name: f.default for f in fields(TransformerConfig) if f.name != "name"}
    values["name"] = p.stem
    values["source"] = str(p)
    values.update(table)
    keys = {f: f"transformer.{f}" for f in _FIELD_KINDS}
    if "seq_len" not in table:
        values["seq_len"], keys["seq_len"] = seq_len, "seq_len (--seq-len)"
    if table.get("kind") == "encoder-decoder" and _is_int(table.get("num_decoder_layers")) \
            and table["num_decoder_layers"] == 0:
        raise _no_decoder_blocks(str(p), keys["num_decoder_layers"])
    return _build(values, str(p), keys)


def _no_decoder_blocks(where: str, key: str) -> InputError:
    """An encoder-decoder file that gives ``key`` = 0 decoder blocks."""
    return _bad(where, key, 0, "at least 1 decoder block for an encoder-decoder model (no key: as many as the "
                               "encoder's num_layers)")


_T5_TYPES = ("t5", "mt5", "umt5")
_GPT2_TYPES = ("gpt2",)
#: GPT-NeoX-style decoders (rotary, LayerNorm, biases, a two-matrix GELU MLP); Phi-1/2 are this family
_NEOX_TYPES = ("gpt_neox", "phi")
#: LLaMA-style decoders; Gemma's GeGLU MLP is gated as SwiGLU is (three matrices)
_LLAMA_TYPES = ("llama", "mistral", "gemma", "gemma2")
#: model types whose config leaves tie_word_embeddings out when the embedding is tied (HF's own default)
_TIED_BY_DEFAULT = ("gemma", "gemma2")
#: model types the dense decoder / encoder-decoder cost model cannot read, and why (refused by name)
_REFUSED_TYPES = {
    **{t: "an encoder-only model (masked-language-model pretraining, no causal decoder or LM head): "
          "pipesearch costs decoders and encoder-decoders"
       for t in ("bert", "roberta", "xlm-roberta", "deberta", "deberta-v2", "distilbert", "electra", "albert")},
    **{t: "multi-query attention beside the MLP (parallel blocks) with a four-times-wide GELU MLP, which no "
          "family of pipesearch's cost model reads from its keys"
       for t in ("falcon", "refinedweb", "refinedwebmodel")},
    "gpt_bigcode": "multi-query attention (multi_query: one key/value head) in a GPT-2 layout, which the GPT-2 "
                   "family would cost as full multi-head attention (its KV cache as many times too large as it has "
                   "heads)",
    "starcoder2": "a non-gated GELU MLP with biases beside grouped-query attention, which the LLaMA family its keys "
                  "suggest would cost as a gated MLP (a third more weights)",
}
#: LLaMA-like model types whose attention has Q/K/V biases without a config key, and those with QK-norm
_QKV_BIAS_TYPES = ("qwen2",)
_QK_NORM_TYPES = ("qwen3",)


def load_hf_config(
    path: str | Path, seq_len: int | None = None, *, name: str | None = None
) -> TransformerConfig:
    """Read a HuggingFace ``config.json`` of a GPT-2, GPT-NeoX, LLaMA/Mistral
    or T5 model.

    Key names per family (``model_type``; when it is missing or unknown, the
    family is guessed from the keys present):

    * GPT-2: ``n_layer, n_embd, n_head, n_inner`` (null: ``4 n_embd``),
      ``n_positions`` (or ``n_ctx``), ``vocab_size``, ``tie_word_embeddings``
      (default true); learned positions, LayerNorm, biases, dropout when any
      ``*_pdrop`` > 0 (default 0.1).
    * GPT-NeoX: ``num_hidden_layers, hidden_size, num_attention_heads,
      intermediate_size, max_position_embeddings, vocab_size,
      tie_word_embeddings`` (default false); rotary, LayerNorm, biases.
    * LLaMA/Mistral: as NeoX plus ``num_key_value_heads`` (default: heads),
      optional ``head_dim``; SwiGLU, RMSNorm, rotary, no biases (unless
      ``attention_bias``/``mlp_bias``), untied unless ``tie_word_embeddings``.
    * T5: ``d_model, d_ff, d_kv, num_heads, num_layers, num_decoder_layers``
      (default ``num_layers``), ``vocab_size``, ``feed_forward_proj``
      (``gated-gelu``/``gated-silu``: gated MLP), ``tie_word_embeddings``
      (default true), ``relative_attention_num_buckets``, ``dropout_rate``,
      ``n_positions`` for the default sequence length; RMSNorm, no biases.

    Args:
        path: the ``config.json``.
        seq_len: sequence length; default the config's maximum positions
            (``n_positions`` / ``max_position_embeddings``), or the
            pre-training context of a rotary scaling that extends it
            (``rope_scaling.original_max_position_embeddings``: 8192 for
            Llama 3.1's 131072).
        name: model name; default ``_name_or_path``'s last part, else the
            directory name of a ``config.json``, else the file stem.

    Raises:
        InputError: unreadable file or bad JSON, a mixture-of-experts model, an
            unrecognised family, a missing or bad key (message names the file,
            the HF key and the value), or no sequence length anywhere.
    """
    p = Path(path)
    d = _read_hf_json(p)
    model_type = str(d.get("model_type") or "").lower()
    _refuse_model_kind(p, d, model_type)
    family = _family(d, model_type)
    tag = str(d.get("format") or d.get("schema") or "")  # pipesearch.serve/1, pipesearch.plan/1
    if family is None and tag.startswith("pipesearch."):
        raise InputError(f"{p}: a pipesearch output ({tag}), not a model config; give the model the plans were "
                         "made for (its catalog name, TOML or HuggingFace config.json)")
    if family is None:
        raise InputError(
            f"{p}: unrecognised config (model_type {model_type or 'missing'!r}); expected a "
            f"GPT-2 (n_layer, n_embd), GPT-NeoX/LLaMA (num_hidden_layers, hidden_size) or "
            f"T5 (d_model, d_kv) config.json"
        )
    for key, alias in _HF_ALIASES.get(family, ()):  # transformers maps one onto the other: which one wins is order
        if key in d and alias in d and d[key] != d[alias]:
            raise InputError(f"{p}: key '{key}' = {_show(d[key])} and its alias '{alias}' = {_show(d[alias])} "
                             f"disagree (transformers reads them as one setting); keep one of them")
    r = _HFReader(p, d, model_type)
    if family == "gpt2":
        default_seq, pos_key = r.gpt2()
    elif family in ("neox", "llama"):
        default_seq, pos_key = r.rotary(family)
    else:
        default_seq, pos_key = r.t5()
    if seq_len is None:
        if default_seq is None:
            raise InputError(
                f"{p}: no sequence length: the config has no '{pos_key}'; pass --seq-len (seq_len in the Python API)"
            )
        r.values["seq_len"], r.keys["seq_len"] = default_seq, pos_key
    else:
        r.values["seq_len"], r.keys["seq_len"] = seq_len, "seq_len (--seq-len)"
    if name is None:
        ref = _hub_reference(d)
        folder = p.resolve().parent.name  # a relative "config.json" still names its folder
        name = ref.rsplit("/", 1)[-1] if ref else (folder if p.name == "config.json" and folder else p.stem)
        if ref:
            r.keys["name"] = "_name_or_path"
    r.values["name"] = name
    r.values["source"] = f"{p} (HuggingFace {family} config)"
    full = {f.name: f.default for f in fields(TransformerConfig)}
    full.update(r.values)
    return _build(full, str(p), r.keys)


def _read_hf_json(p: Path) -> dict:
    """The JSON object of a ``config.json`` (raises InputError naming the
    file: unreadable, bad JSON, repeated keys, not an object)."""
    text = _read_text(p)  # its own refusal names the file once
    try:
        d = json.loads(text, object_pairs_hook=unique_keys(p))
    except InputError:
        raise
    except json.JSONDecodeError as e:
        raise InputError(f"{p}: JSON syntax error: {e}") from None
    except (ValueError, RecursionError) as e:  # an integer of over 4300 digits, arrays nested too deeply
        raise InputError(f"{p}: cannot read JSON: {parse_failure(e)}") from None
    if not isinstance(d, dict):
        raise InputError(f"{p}: expected a JSON object (a HuggingFace config.json)")
    return d


def _refuse_model_kind(p: Path, d: Mapping, model_type: str) -> None:
    """Raise InputError for the model types the dense cost model cannot
    read (:data:`_REFUSED_TYPES`) and for mixture-of-experts configs."""
    if model_type in _REFUSED_TYPES:
        raise InputError(f"{p}: model_type {model_type!r}: {_REFUSED_TYPES[model_type]}; describe the model in a "
                         f"transformer TOML (cost_models/*.toml, docs/transformer_costs.md) if its blocks are one "
                         f"of those families")
    for moe_key in ("num_local_experts", "num_experts", "n_routed_experts"):
        if d.get(moe_key):
            raise InputError(
                f"{p}: key '{moe_key}' = {d[moe_key]!r}: mixture-of-experts models are not "
                f"supported by the dense transformer cost model"
            )


class _HFReader:
    """Reads one family's keys of a config's object ``d`` into
    :class:`TransformerConfig` field ``values``, with ``keys``: the HF key
    each field came from (for the messages of :func:`_build`)."""

    def __init__(self, p: Path, d: dict, model_type: str):
        self.p, self.where, self.d, self.model_type = p, str(p), d, model_type
        self.values: dict[str, Any] = {}
        self.keys: dict[str, str] = {}

    def get(self, key: str, default: Any = ..., *alts: str) -> Any:
        """The first of ``key``, ``alts`` not null, else ``default``
        (raises InputError when there is none: missing, or null)."""
        d, p, model_type = self.d, self.p, self.model_type
        for k in (key, *alts):
            if d.get(k) is not None:
                return d[k]
        if default is not ...:
            return default
        if model_type and model_type not in _KNOWN_TYPES:  # its keys are not a family's: adding one is no fix
            raise InputError(f"{p}: missing key '{key}': model_type {model_type!r} is not one pipesearch reads "
                             f"(its keys are not those of a GPT-2, GPT-NeoX, LLaMA or T5 config); describe the "
                             f"model in a transformer TOML (cost_models/*.toml, docs/transformer_costs.md)")
        given = next((k for k in (key, *alts) if k in d), None)  # there, but null
        if given is not None:
            raise InputError(f"{p}: key '{given}' = null (model_type {model_type or '?'}): give its value")
        raise InputError(f"{p}: missing key '{key}' (model_type {model_type or '?'})")

    def rate(self, key: str, default: float) -> float:
        """A dropout probability (raises InputError outside [0, 1])."""
        v = self.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
            raise _bad(self.where, key, v, "a dropout probability, a number in [0, 1]")
        return v

    def take(self, field_name: str, key: str, default: Any = ..., *alts: str) -> None:
        """Field ``field_name`` from HF key ``key`` (:meth:`get`)."""
        self.keys[field_name] = key
        self.values[field_name] = self.get(key, default, *alts)

    def gpt2(self) -> tuple[Any, str]:
        """GPT-2's keys; returns the default sequence length and its key."""
        take, values = self.take, self.values
        take("num_layers", "n_layer")
        take("hidden_size", "n_embd")
        take("num_attention_heads", "n_head")
        h = values["hidden_size"]
        take("ffn_hidden_size", "n_inner", 4 * h if _is_int(h) else None)
        take("vocab_size", "vocab_size")
        take("max_position_embeddings", "n_positions", None, "n_ctx")
        take("tied_embeddings", "tie_word_embeddings", True)
        take("norm_eps", "layer_norm_epsilon", None)
        drops = [self.rate(k, 0.1) for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop")]
        values.update(kind="decoder", position_embedding="learned", norm="layernorm",
                      bias=True, gated_mlp=False, dropout=any(x > 0 for x in drops))
        return values["max_position_embeddings"], "n_positions"

    def rotary(self, family: str) -> tuple[Any, str]:
        """GPT-NeoX's or LLaMA's keys (rotary positions, their scaling);
        returns the default sequence length and its key."""
        take, values, d = self.take, self.values, self.d
        take("num_layers", "num_hidden_layers")
        take("hidden_size", "hidden_size")
        take("num_attention_heads", "num_attention_heads")
        take("ffn_hidden_size", "intermediate_size")
        take("vocab_size", "vocab_size")
        take("tied_embeddings", "tie_word_embeddings", self.model_type in _TIED_BY_DEFAULT)
        take("max_position_embeddings", "max_position_embeddings", None)  # the context (rotary: no table)
        default_seq, pos_key = self._rope_scaling(values["max_position_embeddings"])
        values.update(kind="decoder", position_embedding="rotary")
        window = d.get("sliding_window")  # costed as full attention (sliding_window_note), checked all the same
        if window is not None and not (_is_int(window) and window >= 0):
            raise _bad(self.where, "sliding_window", window, "a non-negative integer (the attention window in tokens) "
                       "or null")
        take("rope_theta", "rope_theta", None, "rotary_emb_base")
        scale_key, scaling = self._scaling()
        if values["rope_theta"] is None and isinstance(scaling, dict) and scaling.get("rope_theta") is not None:
            values["rope_theta"] = scaling["rope_theta"]
            self.keys["rope_theta"] = f"{scale_key}.rope_theta"
        drops = self._neox() if family == "neox" else self._llama()
        values["dropout"] = any(x > 0 for x in drops)
        return default_seq, pos_key

    def _scaling(self) -> tuple[str, Any]:
        """``(key, value)`` of the rotary scaling: ``rope_scaling``, or
        transformers 5's ``rope_parameters``."""
        key = "rope_scaling" if self.d.get("rope_scaling") is not None else "rope_parameters"
        return key, self.d.get(key)

    def _rope_scaling(self, pos: Any) -> tuple[Any, str]:
        """The rotary scaling (``rope_scaling``, or transformers 5's
        ``rope_parameters``, which holds ``rope_theta`` too): its type and
        factor, the context it stretches to (linear, dynamic: the config's
        times the factor, as vLLM's ``_get_and_verify_max_len``; llama3,
        longrope, yarn: the config's own), and the default sequence length
        with its key: a pre-training context below the config's (Llama 3.1:
        8192 of 131072) where the scaling names one."""
        where, values, keys = self.where, self.values, self.keys
        scale_key, scaling = self._scaling()
        if scaling is not None and not isinstance(scaling, dict):
            raise _bad(where, scale_key, scaling, "an object (rope_type, factor, ...) or null")
        kind = (scaling or {}).get("rope_type", (scaling or {}).get("type"))
        if kind in (None, "default"):
            return pos, "max_position_embeddings"
        if pos is not None and not (_is_int(pos) and 0 < pos <= MAX_COUNT):  # before any arithmetic on it
            raise _bad(where, "max_position_embeddings", pos, f"a positive integer <= {MAX_COUNT}")
        default_seq, pos_key = pos, "max_position_embeddings"
        factor = scaling.get("factor")
        if kind in ("linear", "dynamic"):
            ok = isinstance(factor, (int, float)) and not isinstance(factor, bool) and 1 <= factor < math.inf
            if not ok:  # a context of its own would be a guess: the engines refuse it too
                raise _bad(where, f"{scale_key}.factor", factor, f"a number >= 1 (rope_type {kind} stretches "
                           f"the positions by it)")
            values["max_position_embeddings"] = int(pos * factor) if pos else None
        values["rope_scaling_type"], keys["rope_scaling_type"] = kind, f"{scale_key}.rope_type"
        values["rope_scaling_factor"], keys["rope_scaling_factor"] = factor, f"{scale_key}.factor"
        # a context extended after pre-training: train at the pre-training length by default; --seq-len asks for more
        original = scaling.get("original_max_position_embeddings")
        if original is not None and not (_is_int(original) and original > 0):
            raise _bad(where, f"{scale_key}.original_max_position_embeddings", original,
                       "a positive integer (the pre-training context) or no key")
        if original is not None and (default_seq is None or original < default_seq):
            default_seq, pos_key = original, f"{scale_key}.original_max_position_embeddings"
        return default_seq, pos_key

    def _neox(self) -> list[float]:
        """GPT-NeoX's own keys (no grouped-query attention; LayerNorm, biases);
        returns its dropout rates."""
        values = self.values
        kv = self.d.get("num_key_value_heads")
        if kv is not None and kv != values["num_attention_heads"]:
            raise _bad(self.where, "num_key_value_heads", kv, f"no key, or num_attention_heads "
                       f"({values['num_attention_heads']}): a GPT-NeoX model has no grouped-query attention "
                       "(model_type gpt_neox); give the llama model_type if the model has it")
        drops = [self.rate(k, 0.0) for k in ("attention_dropout", "hidden_dropout")]
        values.update(norm="layernorm", bias=bool(self.get("use_bias", True)), gated_mlp=False)
        self.take("norm_eps", "layer_norm_eps", None)
        return drops

    def _llama(self) -> list[float]:
        """LLaMA's own keys (kv heads, head width, biases; RMSNorm, a gated
        MLP); returns its dropout rates. Qwen2's attention has Q/K/V biases
        by its architecture (its config has no key for them); Qwen3
        normalises every query and key head. MLP biases bias every linear
        (Megatron-LM cannot bias the MLP alone; the attention's few bias
        parameters are then over-counted)."""
        take, values = self.take, self.values
        take("num_kv_heads", "num_key_value_heads", None)
        take("head_dim", "head_dim", None)
        drops = [self.rate("attention_dropout", 0.0)]
        take("qkv_bias", "attention_bias", False)
        take("bias", "mlp_bias", False)
        values.update(norm="rmsnorm", gated_mlp=True, qk_norm=self.model_type in _QK_NORM_TYPES)
        if self.model_type in _QKV_BIAS_TYPES and values["qkv_bias"] is False:
            values["qkv_bias"] = True
        take("norm_eps", "rms_norm_eps", None)
        return drops

    def t5(self) -> tuple[Any, str]:
        """T5's keys; returns the default sequence length and its key."""
        take, values = self.take, self.values
        take("num_layers", "num_layers")
        take("num_decoder_layers", "num_decoder_layers", values["num_layers"])
        if _is_int(values["num_decoder_layers"]) and values["num_decoder_layers"] == 0:  # HF keeps a 0: no decoder
            raise _no_decoder_blocks(self.where, "num_decoder_layers")
        take("hidden_size", "d_model")
        take("num_attention_heads", "num_heads")
        take("head_dim", "d_kv")
        take("ffn_hidden_size", "d_ff")
        take("vocab_size", "vocab_size")
        take("tied_embeddings", "tie_word_embeddings", True)
        take("relative_attention_num_buckets", "relative_attention_num_buckets", 32)
        proj = str(self.get("feed_forward_proj", "relu")).lower()
        values.update(kind="encoder-decoder", position_embedding="relative", norm="rmsnorm",
                      bias=False, gated_mlp=proj.startswith("gated-"), dropout=self.rate("dropout_rate", 0.1) > 0)
        return self.get("n_positions", None), "n_positions"


def _family(d: Mapping, model_type: str) -> str | None:
    """The cost model's family of a HuggingFace config (``t5``, ``gpt2``,
    ``neox``, ``llama``): by ``model_type`` where it is one of those, else
    guessed from the keys present; None when neither says."""
    if model_type in _T5_TYPES or (not model_type and "d_model" in d and "d_kv" in d):
        return "t5"
    if model_type in _GPT2_TYPES or (model_type not in _NEOX_TYPES + _LLAMA_TYPES and "n_embd" in d):
        return "gpt2"
    if model_type in _NEOX_TYPES:
        return "neox"
    if model_type in _LLAMA_TYPES:
        return "llama"
    if "num_hidden_layers" in d and "hidden_size" in d:
        act = str(d.get("hidden_act", "")).lower()
        return "llama" if ("num_key_value_heads" in d or act in ("silu", "swiglu")) else "neox"
    return None


#: model types read by their keys as one of the families without a note (LLaMA-style decoders)
_KNOWN_TYPES = _T5_TYPES + _GPT2_TYPES + _NEOX_TYPES + _LLAMA_TYPES + _QKV_BIAS_TYPES + _QK_NORM_TYPES


def guessed_family_note(path: str | Path) -> str | None:
    """A warning for a HuggingFace ``config.json`` (read by
    :func:`load_hf_config`) whose ``model_type`` pipesearch does not know:
    its layers are costed as the family its keys look like, which may not
    be its architecture (a state-space or hybrid model). None otherwise."""
    d = json.loads(_read_text(Path(path)))
    model_type = str(d.get("model_type") or "").lower()
    if not model_type or model_type in _KNOWN_TYPES:
        return None
    names = {"t5": "T5 encoder-decoder", "gpt2": "GPT-2", "neox": "GPT-NeoX", "llama": "LLaMA-style"}
    return (f"{path}: model_type {model_type!r} is not one pipesearch knows; its layers are costed as a "
            f"{names[_family(d, model_type)]} transformer read from its keys (check the architecture matches)")


def sliding_window_note(path: str | Path, seq_len: int) -> str | None:
    """A warning for a HuggingFace ``config.json`` whose attention looks at
    a sliding window of ``sliding_window`` tokens shorter than ``seq_len``
    (Mistral-7B-v0.1: 4096): pipesearch costs full causal attention, so its
    attention FLOPs and time are too high at that length. None otherwise."""
    window = used_sliding_window(json.loads(_read_text(Path(path))), seq_len)
    if window is None:
        return None
    return (f"{path}: sliding_window {window} < sequence length {seq_len}: pipesearch costs full causal attention "
            f"over all {seq_len} tokens, so the attention core's FLOPs and time are too high; --seq-len {window} "
            f"or less costs what the window does")


def used_sliding_window(config: Mapping, seq_len: int) -> int | None:
    """The attention window of a HuggingFace config's model where it is
    shorter than ``seq_len`` tokens and used (``sliding_window``, unless
    Qwen2's ``use_sliding_window`` is false), else None."""
    window = config.get("sliding_window")
    if isinstance(window, bool) or not isinstance(window, int) or not 0 < window < seq_len:
        return None
    return None if config.get("use_sliding_window") is False else window


def _hub_reference(config: Mapping) -> str:
    """A HuggingFace config's ``_name_or_path`` (a Hub id or a local path,
    no trailing slash), or ``""``."""
    ref = config.get("_name_or_path")
    return ref.rstrip("/") if isinstance(ref, str) else ""


def hf_checkpoint(path: str | Path) -> str | None:
    """What an inference engine loads for the HuggingFace ``config.json`` at
    ``path`` (already read by :func:`load_hf_config`): its
    ``_name_or_path``, else the folder that holds it when the file is that
    folder's ``config.json`` (a checkpoint directory); None for a config
    under another name (its folder is no checkpoint an engine can load)."""
    p = Path(path)
    return _hub_reference(json.loads(_read_text(p))) or (str(p.resolve().parent) if p.name == "config.json" else None)


def hf_quantization_config(path: str | Path) -> dict | None:
    """The ``quantization_config`` object of the HuggingFace ``config.json``
    at ``path`` (already read by :func:`load_hf_config`), None when it has
    none: the format the checkpoint's weights are stored in.

    Raises:
        InputError: ``quantization_config`` is not an object.
    """
    q = json.loads(_read_text(Path(path))).get("quantization_config")
    if q is not None and not isinstance(q, dict):
        raise InputError(f"{path}: quantization_config = {q!r}; expected an object (the checkpoint's quantization)")
    return q


def load_transformer(path: str | Path, seq_len: int | None = None) -> TransformerConfig:
    """Load a transformer config: ``.toml`` (catalog format) or ``.json``
    (HuggingFace ``config.json``). ``seq_len`` overrides the file's default.

    Raises:
        InputError: another suffix, or whatever the loader raises.
    """
    p = Path(path)
    if p.suffix == ".toml":
        cfg = load_transformer_toml(p, seq_len)
        if seq_len is not None:
            values = {f.name: getattr(cfg, f.name) for f in fields(cfg)}
            values["seq_len"] = seq_len
            table_key = "transformer.max_position_embeddings"
            if cfg.position_embedding == "learned":
                values["max_position_embeddings"] = cfg.max_position_embeddings
                if "max_position_embeddings" not in _read_toml(p)["transformer"]:  # the table's rows: its seq_len
                    table_key = ("transformer.seq_len (the learned position table's rows without "
                                 "max_position_embeddings)")
            _validate(values, str(p), {"seq_len": "seq_len (--seq-len)", "max_position_embeddings": table_key})
            cfg = replace(cfg, seq_len=seq_len)
        return cfg
    if p.suffix == ".json":
        return load_hf_config(p, seq_len=seq_len)
    raise InputError(f"{p}: expected a .toml transformer config or a HuggingFace config.json")


# --------------------------------------------------------------------------- #
# counts


def padded_vocab_size(cfg: TransformerConfig, tp: int = 1) -> int:
    """Vocabulary rows Megatron-LM allocates: ``vocab_size`` rounded up to a
    multiple of ``make_vocab_size_divisible_by * tp`` (Megatron
    ``_vocab_size_with_padding``), so that each tensor-parallel rank holds an
    equal, GEMM-friendly slice. GPT-2's 50257 becomes 50304 at tp=1 and 51200
    at tp=8 (the V of SC'21 Table 1)."""
    m = cfg.make_vocab_size_divisible_by * tp
    return -(-cfg.vocab_size // m) * m


def _norm_params(cfg: TransformerConfig) -> int:
    return 2 * cfg.hidden_size if cfg.norm == "layernorm" else cfg.hidden_size


@dataclass(frozen=True)
class _Params:
    split: int  # divided across tensor-parallel ranks
    replicated: int  # held whole by every tensor-parallel rank

    @property
    def total(self) -> int:
        return self.split + self.replicated

    def per_rank(self, tp: int) -> float:
        return self.split / tp + self.replicated


def _attention_params(cfg: TransformerConfig) -> _Params:
    h, q, kv = cfg.hidden_size, cfg.q_dim, cfg.kv_dim
    split = h * q + 2 * h * kv + q * h
    replicated = 0
    if cfg.bias or cfg.qkv_bias:
        split += q + 2 * kv  # column-parallel QKV bias
    if cfg.bias:
        replicated += h  # row-parallel output bias
    return _Params(split, replicated)


def _mlp_params(cfg: TransformerConfig) -> _Params:
    h, f = cfg.hidden_size, cfg.ffn_hidden_size
    n_in = 2 if cfg.gated_mlp else 1
    split = (n_in + 1) * h * f
    replicated = 0
    if cfg.bias:
        split += n_in * f
        replicated += h
    return _Params(split, replicated)


def _block_params(cfg: TransformerConfig, index: int) -> _Params:
    """Parameters of block ``index`` (encoder blocks first for T5)."""
    decoder_block = cfg.is_encoder_decoder and index >= cfg.num_layers
    att, mlp = _attention_params(cfg), _mlp_params(cfg)
    n_att = 2 if decoder_block else 1
    n_norm = n_att + 1
    split = n_att * att.split + mlp.split
    replicated = n_att * att.replicated + mlp.replicated + n_norm * _norm_params(cfg)
    if cfg.position_embedding == "relative" and (index == 0 or (cfg.is_encoder_decoder and index == cfg.num_layers)):
        split += cfg.relative_attention_num_buckets * cfg.num_attention_heads
    if cfg.is_encoder_decoder and index == cfg.num_layers - 1:
        replicated += _norm_params(cfg)  # final encoder norm
    return _Params(split, replicated)


def _embedding_params(cfg: TransformerConfig, vocab: int) -> _Params:
    pos = cfg.max_position_embeddings * cfg.hidden_size if cfg.position_embedding == "learned" else 0
    return _Params(vocab * cfg.hidden_size, pos)  # type: ignore[operator]


def _head_params(cfg: TransformerConfig, vocab: int) -> _Params:
    return _Params(0 if cfg.tied_embeddings else vocab * cfg.hidden_size, _norm_params(cfg))


def parameter_count(cfg: TransformerConfig, *, vocab_size: int | None = None) -> int:
    """Number of distinct parameters of the model.

    Counts every weight and bias: embeddings (``V h``, plus ``P h`` learned
    positions or the T5 relative-position biases), per block attention
    (``h(a d) + 2 h (g d) + (a d) h`` and biases), MLP (``2 h f`` or gated
    ``3 h f`` and biases), norms (``2h`` LayerNorm or ``h`` RMSNorm each), the
    final norm(s) and, when untied, the LM head ``V h``. Tied embeddings are
    counted once.

    Args:
        vocab_size: vocabulary to count with; default the published
            ``cfg.vocab_size`` (not the Megatron-padded one).

    For a GPT block this is ``12 h^2 + 13 h``, so the total is SC'21 eq. (2)
    plus the final LayerNorm's ``2h`` (and without the pad rows).
    """
    vocab = cfg.vocab_size if vocab_size is None else vocab_size
    total = _embedding_params(cfg, vocab).total + _head_params(cfg, vocab).total
    total += sum(_block_params(cfg, i).total for i in range(cfg.total_blocks))
    return total


def block_parameters(cfg: TransformerConfig, index: int = 0) -> tuple[int, int]:
    """Parameters of block ``index`` as ``(split, replicated)``: ``split`` are
    the GEMM weights (and column-parallel biases) a tensor-parallel group
    divides among its ranks, ``replicated`` the norms and row-parallel biases
    every rank holds whole. ``split / tp + replicated`` is one rank's share.
    Same counts as :func:`parameter_count`."""
    p = _block_params(cfg, index)
    return p.split, p.replicated


def norm_parameters(cfg: TransformerConfig) -> int:
    """Parameters of one norm: ``2h`` (LayerNorm weight and bias) or ``h``
    (RMSNorm weight)."""
    return _norm_params(cfg)


def tied_layers(cfg: TransformerConfig) -> dict[str, str]:
    """``{"head": "embedding"}`` when the LM head reuses the embedding matrix
    (its parameters are counted on the ``embedding`` layer only), else ``{}``."""
    return {"head": "embedding"} if cfg.tied_embeddings else {}




def tied_embedding_param_bytes(cfg: TransformerConfig, *, tp: int = 1, dtype_bytes: float = 2) -> float:
    """Bytes of the shared word-embedding matrix per device: what the stage
    holding ``head`` must additionally keep (weights, and their gradient and
    optimizer state alike) when it is not the stage holding ``embedding``.
    Megatron-LM keeps a copy on the last stage and all-reduces the two copies'
    gradients between the first and last stage every iteration. 0 when untied."""
    if not cfg.tied_embeddings:
        return 0.0
    return padded_vocab_size(cfg, tp) * cfg.hidden_size / tp * dtype_bytes


def megatron_params_eq2(l: int, h: int, V: int, s: int) -> float:
    """Parameters of a GPT model, Narayanan et al. SC'21 eq. (2):
    ``P = 12 l h^2 (1 + 13/(12 h) + (V + s)/(12 l h))`` (learned positions,
    tied embeddings, 4h MLP; leaves out the final LayerNorm)."""
    return 12 * l * h**2 * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))


def megatron_flops_eq3(B: int, s: int, l: int, h: int, V: int) -> float:
    """FLOPs of one training iteration of batch ``B`` with full activation
    recomputation, Narayanan et al. SC'21 eq. (3):
    ``F = 96 B s l h^2 (1 + s/(6 h) + V/(16 l h))`` (forward, recomputed
    forward and 2x backward of every block: 4 passes; forward and backward of
    the LM head: 3 passes; GEMMs only)."""
    return 96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))


# --------------------------------------------------------------------------- #
# per-layer analytic costs at micro-batch size b, before tensor parallelism


@dataclass(frozen=True)
class _Acts:
    """Saved activation bytes of a block (Korthikanti et al. 2022 sec. 4.1):
    ``replicated`` is held whole by every TP rank without sequence parallelism
    (norm inputs, inputs of the column-parallel GEMMs, dropout masks after the
    row-parallel GEMMs), ``split`` is divided by ``t`` by tensor parallelism
    (Q, K, V, MLP inner activations, inputs of the row-parallel GEMMs),
    ``core`` is the attention core (softmax output, its dropout mask and
    output), divided by ``t`` and dropped by selective recomputation;
    ``block_input`` is what full recomputation keeps; ``masks`` the
    dropout masks among ``replicated``."""

    replicated: float
    split: float
    core: float
    block_input: float
    masks: float = 0.0  # the dropout masks among ``replicated``


def _self_attention(cfg: TransformerConfig, s: int, b: int, D: float):
    """(linear GEMM flops, core GEMM flops, acts, column-parallel GEMM flops)
    of causal/self attention over ``s`` tokens, forward, micro-batch ``b``;
    the column-parallel GEMM is the QKV projection, whose input gradient the
    sub-layer's backward collective reduces."""
    h, q, kv, a = cfg.hidden_size, cfg.q_dim, cfg.kv_dim, cfg.num_attention_heads
    lin = 2 * b * s * h * q + 2 * 2 * b * s * h * kv + 2 * b * s * q * h
    core = 2 * 2 * b * s * s * q  # Q K^T and softmax(.) V
    mask = MASK_BYTES if cfg.dropout else 0
    replicated = D * b * s * h + mask * b * s * h  # QKV input; dropout mask after out proj
    split = D * b * s * (q + kv) + D * b * s * kv + D * b * s * q  # Q, K; V; out-proj input
    core_bytes = a * b * s * s * (D + ((mask + D) if cfg.dropout else 0))
    qkv = 2 * b * s * h * q + 4 * b * s * h * kv
    return lin, core, _Acts(replicated, split, core_bytes, 0.0, mask * b * s * h), qkv


def _cross_attention(cfg: TransformerConfig, s_dec: int, s_enc: int, b: int, D: float):
    """Like :func:`_self_attention` for T5 cross-attention: queries from the
    ``s_dec`` decoder tokens, keys/values from the ``s_enc`` encoder outputs.
    The encoder output itself is shared by all decoder blocks and not counted
    here. Its column-parallel GEMM here is the query projection (the key and
    value projection reads the encoder output, whose gradient has its own
    collective: :func:`_raw_layers`)."""
    h, q, kv, a = cfg.hidden_size, cfg.q_dim, cfg.kv_dim, cfg.num_attention_heads
    lin = 2 * b * s_dec * h * q + 2 * 2 * b * s_enc * h * kv + 2 * b * s_dec * q * h
    core = 2 * 2 * b * s_dec * s_enc * q
    mask = MASK_BYTES if cfg.dropout else 0
    replicated = D * b * s_dec * h + mask * b * s_dec * h
    split = D * b * s_dec * q + 2 * D * b * s_enc * kv + D * b * s_dec * q
    core_bytes = a * b * s_dec * s_enc * (D + ((mask + D) if cfg.dropout else 0))
    return lin, core, _Acts(replicated, split, core_bytes, 0.0, mask * b * s_dec * h), 2 * b * s_dec * h * q


def _mlp(cfg: TransformerConfig, s: int, b: int, D: float):
    """As :func:`_self_attention` for the MLP: its column-parallel GEMMs are
    fc1 (gated: gate and up)."""
    h, f = cfg.hidden_size, cfg.ffn_hidden_size
    n_gemm = 3 if cfg.gated_mlp else 2
    lin = n_gemm * 2 * b * s * h * f
    mask = MASK_BYTES if cfg.dropout else 0
    replicated = D * b * s * h + mask * b * s * h  # fc1 input; dropout mask after fc2
    # GPT: activation input and fc2 input (2 x f); gated: gate and up outputs, fc2 input (3 x f)
    split = (3 if cfg.gated_mlp else 2) * D * b * s * f
    return lin, 0, _Acts(replicated, split, 0.0, 0.0, mask * b * s * h), (n_gemm - 1) * 2 * b * s * h * f


@dataclass(frozen=True)
class _Raw:
    """One layer before tensor parallelism, at micro-batch size b."""

    lin_flops: float  # forward FLOPs of weight GEMMs
    core_flops: float  # forward FLOPs of the attention core (no weights)
    params: _Params
    acts: _Acts | None  # blocks
    saved_fixed: tuple[float, float]  # (replicated, split) saved bytes of embedding/head
    output_bytes: float  # unsplit
    saved_whole: float = 0.0  # saved bytes held whole by every TP rank, with or without sp
    # tensor-parallel collectives, each given by the bytes of the full
    # (unsharded) tensor; which lists count depends on sequence parallelism:
    fwd_pairs: tuple[float, ...] = ()  # forward: all-reduce, or AG + RS with sp (same time)
    bwd_pairs: tuple[float, ...] = ()  # backward: likewise
    fwd_ar_only: tuple[float, ...] = ()  # forward all-reduces with or without sp (loss statistics)
    fwd_single: tuple[float, ...] = ()  # forward, only with sp: one all-gather or reduce-scatter each
    bwd_single: tuple[float, ...] = ()  # backward, only with sp: likewise
    fwd_ar_nosp: tuple[float, ...] = ()  # forward, only without sp: all-reduces
    bwd_ar_nosp: tuple[float, ...] = ()  # backward, only without sp: all-reduces
    # blocks: forward FLOPs of the (column-parallel, row-parallel) GEMMs of each backward pair's sub-layer, and
    # of the column-parallel GEMM of each bwd_single / bwd_ar_nosp collective (cross-attention keys and values;
    # the LM head); the embedding's backward collective has no GEMM (none given: charged in full)
    bwd_pair_gemms: tuple[tuple[float, float], ...] = ()
    bwd_single_gemms: tuple[float, ...] = ()


def _raw_layers(cfg: TransformerConfig, s_enc: int, s_dec: int, b: int, D: float,
                vocab: int) -> list[tuple[str, _Raw]]:
    """``(name, raw)`` of every layer; blocks alike share one :class:`_Raw`."""
    h = cfg.hidden_size
    layers: list[tuple[str, _Raw]] = []
    ed = cfg.is_encoder_decoder
    s_tok = s_enc + s_dec if ed else s_enc  # tokens embedded (and carried along the chain)
    mask = MASK_BYTES if cfg.dropout else 0

    # embedding: lookup (no GEMM); vocab-parallel embedding all-reduces its
    # output in forward (reduce-scatter with sp, whose backward is an all-gather)
    emb_out = D * b * s_tok * h
    # saved: the int64 token ids (the weight gradient's scatter-add indices,
    # whole on every TP rank) and the dropout mask on the embedding output
    ids = TOKEN_ID_BYTES * b * s_tok
    layers.append(("embedding", _Raw(
        0.0, 0.0, _embedding_params(cfg, vocab), None,
        (mask * b * s_tok * h, 0.0), emb_out, saved_whole=ids,
        fwd_ar_nosp=(emb_out,), fwd_single=(emb_out,), bwd_single=(emb_out,),
    )))

    width = max(2, len(str(cfg.total_blocks - 1)))
    built: dict[tuple, _Raw] = {}  # a block's terms depend on its index only through these three
    for i in range(cfg.total_blocks):
        decoder_block = ed and i >= cfg.num_layers
        key = (decoder_block, ed and i == cfg.num_layers - 1,
               cfg.position_embedding == "relative" and (i == 0 or (ed and i == cfg.num_layers)))
        if key in built:
            layers.append((f"block_{i:0{width}d}", built[key]))
            continue
        s = s_dec if decoder_block else s_enc
        parts = [_self_attention(cfg, s, b, D), _mlp(cfg, s, b, D)]
        if decoder_block:
            parts.append(_cross_attention(cfg, s_dec, s_enc, b, D))
        n_norm = len(parts)
        if ed and i == cfg.num_layers - 1:
            n_norm += 1  # final encoder norm
        lin = sum(p[0] for p in parts)
        core = sum(p[1] for p in parts)
        kv_gemm = 4 * b * s_enc * h * cfg.kv_dim  # cross-attention keys and values over the encoder output
        acts = _Acts(
            replicated=sum(p[2].replicated for p in parts) + n_norm * D * b * s * h,
            split=sum(p[2].split for p in parts),
            core=sum(p[2].core for p in parts),
            block_input=D * b * s * h,
            masks=sum(p[2].masks for p in parts),
        )
        hidden = D * b * s * h
        out = D * b * s_tok * h if ed else hidden
        n_sub = len(parts)  # sub-layers, each one collective each way
        enc_out = D * b * s_enc * h
        built[key] = _Raw(
            lin, core, _block_params(cfg, i), acts, (0.0, 0.0), out,
            fwd_pairs=(hidden,) * n_sub, bwd_pairs=(hidden,) * n_sub,
            # cross-attention K/V read the encoder output: its gradient is
            # all-reduced in backward; with sp it is all-gathered in forward
            # and reduce-scattered in backward
            fwd_single=(enc_out,) if decoder_block else (),
            bwd_single=(enc_out,) if decoder_block else (),
            bwd_ar_nosp=(enc_out,) if decoder_block else (),
            bwd_pair_gemms=tuple((p[3], p[0] - p[3] - (kv_gemm if k == 2 else 0)) for k, p in enumerate(parts)),
            bwd_single_gemms=(kv_gemm,) if decoder_block else (),
        )
        layers.append((f"block_{i:0{width}d}", built[key]))

    # head: final norm + LM head GEMM + vocab-parallel cross entropy
    s = s_dec if ed else s_enc
    hidden = D * b * s * h
    # saved: norm input and LM-head input (replicated without sp),
    # fp32 softmax of the logits (split by vocab)
    saved = (2 * D * b * s * h, LOSS_BYTES * b * s * vocab)
    layers.append(("head", _Raw(
        2 * b * s * h * vocab, 0.0, _head_params(cfg, vocab), None, saved, 0.0,
        # cross entropy: all-reduce max, sum of exp, target logit (fp32, per token)
        fwd_ar_only=(4 * b * s,) * 3,
        fwd_single=(hidden,), bwd_single=(hidden,), bwd_ar_nosp=(hidden,),
        bwd_single_gemms=(2 * b * s * h * vocab,),  # the LM head: a column-parallel GEMM (vocab-parallel)
    )))
    return layers


def decoder_tokens(cfg: TransformerConfig, seq_len: int, decoder_seq_len: int | None = None) -> int:
    """Decoder tokens per sample of an encoder-decoder model: ``decoder_seq_len``
    when given, else the config's ``decoder_seq_len``, else ``seq_len`` (the
    encoder's)."""
    if decoder_seq_len is not None:
        return decoder_seq_len
    return seq_len if cfg.decoder_seq_len is None else cfg.decoder_seq_len


def forward_flops(cfg: TransformerConfig, seq_len: int | None = None, *,
                  decoder_seq_len: int | None = None, vocab_size: int | None = None) -> dict[str, float]:
    """Forward GEMM FLOPs of each layer for one sample, no tensor parallelism:
    layer name -> FLOPs (``2 m n k`` per GEMM; the embedding is 0). Default
    ``seq_len`` ``cfg.seq_len``, default vocabulary ``cfg.vocab_size``."""
    s = cfg.seq_len if seq_len is None else seq_len
    sd = decoder_tokens(cfg, s, decoder_seq_len)
    V = cfg.vocab_size if vocab_size is None else vocab_size
    return {name: r.lin_flops + r.core_flops for name, r in _raw_layers(cfg, s, sd, 1, 2, V)}


def palm_model_flops(cfg: TransformerConfig, seq_len: int | None = None, *,
                     decoder_seq_len: int | None = None) -> float:
    """Model FLOPs of one training sample (forward + backward, no
    recomputation, published vocabulary): ``3 x`` the forward GEMM FLOPs of
    :func:`forward_flops`. For a GPT model this is PaLM's definition
    (Chowdhery et al. 2022, Appendix B): ``(6 N + 12 L H Q T)`` per token,
    ``N`` the parameters in GEMMs (``12 l h^2 + V h``), ``L H Q T = l h s`` the
    attention scores and context, i.e. ``72 s l h^2 (1 + s/(6h) + V/(12 l h))``
    per sample, Megatron-LM's model-FLOPs count (the denominator of MFU)."""
    return 3.0 * sum(forward_flops(cfg, seq_len, decoder_seq_len=decoder_seq_len).values())


# --------------------------------------------------------------------------- #
# the layer table


def _allreduce_s(nbytes: float, t: int, link: Link) -> float:
    """Ring all-reduce of ``nbytes`` over ``t`` ranks:
    ``2 (t-1)/t * nbytes / bw + 2 (t-1) * latency`` (Patarasuk & Yuan 2009)."""
    if t <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (t - 1) / t * nbytes / link.bandwidth_bytes_per_s + 2 * (t - 1) * link.latency_s


def _gather_s(nbytes: float, t: int, link: Link) -> float:
    """Ring all-gather (or reduce-scatter) of a tensor of ``nbytes`` in total:
    ``(t-1)/t * nbytes / bw + (t-1) * latency``; an all-gather plus a
    reduce-scatter cost one all-reduce."""
    if t <= 1 or nbytes <= 0:
        return 0.0
    return (t - 1) / t * nbytes / link.bandwidth_bytes_per_s + (t - 1) * link.latency_s


def _check_int(name: str, value: Any, minimum: int = 1) -> None:
    if not _is_int(value) or value < minimum:
        raise InputError(f"layer_table: {name} = {_show(value)}: expected an integer >= {minimum}")


def _rank_bytes(replicated: float, split: tuple[float, ...], t: int, sp: bool) -> float:
    """A block's activation bytes on one of ``t`` tensor-parallel ranks:
    the ``split`` terms divided by ``t``, the ``replicated`` ones whole
    unless sequence parallelism divides them too (Korthikanti et al. 2022
    sec. 4.2)."""
    if sp:
        total = replicated
        for x in split:
            total = total + x
        return total / t
    inner = split[0]
    for x in split[1:]:
        inner = inner + x
    return replicated + inner / t


def layer_table(
    cfg: TransformerConfig,
    *,
    seq_len: int | None = None,
    device: DeviceSpec,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    tp_link: Link | None = None,
    dtype_bytes: float = 2,
    micro_batch_size: int = 1,
    decoder_seq_len: int | None = None,
    overlap_tp_backward: bool = True,
    overlap_tp_forward: bool = False,
) -> ModelProfile:
    """Analytic layer table of a transformer on one device type.

    Layers: ``embedding``, ``block_00`` .. ``block_{L-1}`` (T5: encoder blocks,
    then decoder blocks with cross-attention; zero-padded to the width of the
    largest index), ``head`` (final norm, LM head, loss). All figures are per
    device of a tensor-parallel group of ``tp`` devices, for one micro-batch of
    ``micro_batch_size`` samples (the profile's ``profiled_batch_size``).

    Per layer:

    * ``flops``: forward + backward (+ recomputed forward) GEMM FLOPs divided
      by ``tp``. Forward counts ``2 m n k`` for each GEMM: Q, K, V projections
      (``g`` kv heads), ``Q K^T`` and ``softmax V`` (``2 * 2 b s^2 (a d)``),
      output projection, 2 (or gated 3) MLP GEMMs, LM head ``2 b s h V``.
      Backward is 2x forward. Full recomputation adds one block forward;
      selective recomputation the attention-core GEMMs. Element-wise work
      (norms, softmax, activations, dropout) is not counted.
    * ``fwd_s = fwd FLOPs / (peak_fp16_flops * achieved_fraction)`` plus the
      forward tensor-parallel collectives; ``bwd_s`` = 2x that compute plus
      the backward collectives plus the recomputation (full: the forward
      again, collectives included). ``bwd_input_s``: the input-gradient part
      of the backward for zero-bubble schedules = weight-GEMM forward time
      (their input gradient) + the attention core's whole backward + the
      recomputation + the backward collectives (the weight-gradient GEMMs are
      the rest).
    * Tensor-parallel collectives (``tp > 1``, over ``tp_link``): each block
      all-reduces ``b s h dtype_bytes`` twice in forward and twice in backward
      (T5 decoder blocks three times each, plus the encoder-output gradient);
      with sequence parallelism each becomes an all-gather plus a
      reduce-scatter (same volume, same time). The embedding all-reduces its
      output in forward (reduce-scatter forward, all-gather backward with sp);
      the head all-reduces its input gradient in backward (all-gather forward,
      reduce-scatter backward with sp) and three ``4 b s``-byte loss
      statistics in forward.
    * ``param_bytes``: parameters held by one device times ``dtype_bytes``:
      GEMM weights and column-parallel biases divided by ``tp``, norms and
      row-parallel biases whole, the (padded) vocabulary matrices split by
      ``tp``. With tied embeddings the shared matrix is on ``embedding`` only
      (see :func:`tied_embedding_param_bytes` for the head's copy).
    * ``output_bytes``: ``b s h dtype_bytes`` (divided by ``tp`` with
      sequence parallelism); T5 carries encoder and decoder streams together,
      ``b (s_enc + s_dec) h``; 0 for the head.
    * ``saved_bytes``: activations kept for backward, Korthikanti et al. 2022
      Table 2 per block (for a GPT block at 2 bytes: ``sbh(34 + 5as/h)``;
      ``sbh(10 + 24/t + 5as/(ht))`` with tp; ``sbh(34/t + 5as/(ht))`` with tp
      and sp; selective ``sbh(10 + 24/t)`` or ``34 sbh/t`` with sp; full
      ``2 sbh``, divided by ``t`` with sp), generalised term by term for GQA,
      gated MLPs, other MLP widths and models without dropout. Embedding:
      its dropout mask (1 byte per element) and the int64 token ids. Head: final-norm and LM-head inputs (``2 x 2bsh``,
      divided by ``t`` with sp) and the fp32 softmax ``4 b s V / t``.

    Args:
        cfg: the model.
        seq_len: tokens per sample (encoder tokens for T5); default
            ``cfg.seq_len``.
        device: device type; its ``peak_fp16_flops * achieved_fraction`` is
            the GEMM rate (also used for ``dtype_bytes`` other than 2).
        tp: tensor-parallel degree; must divide the heads, the kv heads and
            the MLP width (and, with sp, the sequence length).
        sequence_parallel: Korthikanti et al. sequence parallelism.
        recompute: ``"none"``, ``"selective"`` (attention core recomputed, as
            FlashAttention effectively does) or ``"full"`` (block input kept,
            block forward recomputed in backward).
        tp_link: link between the devices of a tensor-parallel group; required
            when ``tp > 1``.
        dtype_bytes: bytes per parameter and per activation element (2 for
            fp16/bf16); the profile's ``bytes_per_param``.
        micro_batch_size: samples per micro-batch of the table (default 1).
        decoder_seq_len: decoder tokens per sample of an encoder-decoder
            model; default ``seq_len``.
        overlap_tp_backward: a block's backward tensor-parallel collectives
            run under GEMMs linear by linear, as Megatron-LM's
            ``LinearWithGradAccumulationAndAsyncCommunication`` runs them
            (Korthikanti et al. 2022 sec. 5: the measured backward of Table 4
            is 1.55x the forward, not 2x plus the collectives): the reduction
            of each column-parallel GEMM's input gradient (QKV, fc1; the
            all-reduce, or reduce-scatter with sp) under that GEMM's own
            weight gradient, only ``max(0, collective - its weight-gradient
            time)`` exposed (the LM head's too); with sp each column-parallel
            GEMM's gather of its saved input under its input gradient, and
            the all-gather of each row-parallel GEMM's output gradient (out
            projection, fc2) before that GEMM's backward in full (with
            ``overlap_tp_forward``, Transformer Engine's userbuffers pipeline
            it with the GEMM's input gradient: ``max(0, all-gather - that
            time)``). The zero-bubble input-gradient pass keeps the
            reductions whole (its weight gradients, and with sp their input
            gathers, run later). False: charged in full, as the zero-bubble
            tables are (:attr:`pipesearch.search_options.ModelVariant.split_backward`).
        overlap_tp_forward: a block's forward tensor-parallel collectives
            run under its weight GEMMs (Megatron-LM ``--tp-comm-overlap``:
            Transformer Engine's userbuffers split each all-gather /
            reduce-scatter into chunks pipelined with the column- and
            row-parallel GEMM that consumes or produces them; Wang et al.,
            "Overlap communication with dependent computation via
            decomposition", ASPLOS'23); only ``max(0, collectives - forward
            weight-GEMM time)`` is exposed, also in a full recomputation.
            Default False (charged in full).

    Returns:
        ModelProfile with ``profiled_batch_size = micro_batch_size``,
        ``profiled_device = device.name``, ``bytes_per_param = dtype_bytes``.

    Raises:
        InputError: a bad option (tp not dividing heads/kv heads/MLP width,
            sequence length not divisible by tp with sp, tp > 1 without
            tp_link, unknown recompute, seq_len beyond a learned position
            table, decoder_seq_len for a decoder-only model).
    """
    s, sd = _table_lengths(cfg, seq_len, decoder_seq_len)
    _check_int("tp", tp)
    _check_int("micro_batch_size", micro_batch_size)
    rate = _table_rate(cfg, device, recompute, sequence_parallel, dtype_bytes)
    sp = sequence_parallel and tp > 1
    _check_tp(cfg, tp, sp, s, sd, tp_link)
    link = tp_link if tp_link is not None else Link(math.inf, 0.0)
    t, b, D = tp, micro_batch_size, float(dtype_bytes)
    vocab = padded_vocab_size(cfg, t)
    ctx = _TableRates(t, sp, rate, link, recompute, overlap_tp_backward, overlap_tp_forward)
    layers = []
    made: dict[int, Layer] = {}  # blocks alike (one shared raw) are one layer, renamed
    for name, r in _raw_layers(cfg, s, sd, b, D, vocab):
        if id(r) in made:
            layers.append(made[id(r)].renamed(name))
        else:
            layers.append(made.setdefault(id(r), _layer_of(name, r, ctx, D)))
    return ModelProfile(
        name=cfg.name,
        layers=tuple(layers),
        profiled_batch_size=b,
        profiled_device=device.name,
        bytes_per_param=D,
        source=_table_source(cfg, s, sd, t, sp, recompute, dtype_bytes, vocab),
        tied_param_bytes=tied_embedding_param_bytes(cfg, tp=t, dtype_bytes=D) if cfg.tied_embeddings else 0.0,
        wgrad_saved_fraction=min((lay.wgrad_saved_bytes / lay.saved_bytes for lay in layers if lay.saved_bytes > 0),
                                 default=1.0),
        tokens_per_sample=s + sd if cfg.is_encoder_decoder else s,
        model_flops_per_sample=palm_model_flops(cfg, s, decoder_seq_len=sd if cfg.is_encoder_decoder else None),
        gemm_size=float(cfg.hidden_size),
    )


def _table_lengths(cfg: TransformerConfig, seq_len: int | None, decoder_seq_len: int | None) -> tuple[int, int]:
    """``(s, s_dec)`` of :func:`layer_table`: tokens per sample (encoder
    tokens for T5) and decoder tokens (``s`` for a decoder-only model),
    checked against the model (raises InputError)."""
    s = cfg.seq_len if seq_len is None else seq_len
    _check_int("seq_len", s)
    if cfg.is_encoder_decoder:
        sd = decoder_tokens(cfg, s, decoder_seq_len)
        _check_int("decoder_seq_len", sd)
    elif decoder_seq_len is not None:
        raise InputError(
            f"layer_table: decoder_seq_len = {decoder_seq_len!r} given for the decoder-only "
            f"model {cfg.name!r} (only encoder-decoder models have one)"
        )
    else:
        sd = s
    if cfg.position_embedding == "learned" and max(s, sd) > cfg.max_position_embeddings:  # type: ignore[operator]
        raise InputError(
            f"layer_table: seq_len = {max(s, sd)} exceeds the learned position table of "
            f"{cfg.name!r} (max_position_embeddings = {cfg.max_position_embeddings})"
        )
    return s, sd


def _table_rate(cfg: TransformerConfig, device: DeviceSpec, recompute: str, sequence_parallel: bool,
                dtype_bytes: float) -> float:
    """The GEMM rate of :func:`layer_table` (FLOP/s: ``peak_fp16_flops *
    achieved_fraction`` at the model's hidden size), after checking the
    recompute, sequence-parallel and dtype options (raises InputError)."""
    if recompute not in RECOMPUTE:
        raise InputError(f"layer_table: recompute = {recompute!r}: expected one of {', '.join(RECOMPUTE)}")
    if not isinstance(sequence_parallel, bool):
        raise InputError(f"layer_table: sequence_parallel = {sequence_parallel!r}: expected true or false")
    if not (isinstance(dtype_bytes, (int, float)) and not isinstance(dtype_bytes, bool) and dtype_bytes > 0):
        raise InputError(f"layer_table: dtype_bytes = {dtype_bytes!r}: expected a positive number")
    rate = device.peak_fp16_flops * device.achieved_fraction_at(cfg.hidden_size)
    if not (rate > 0 and math.isfinite(rate)):
        raise InputError(
            f"layer_table: device {device.name!r}: peak_fp16_flops * achieved_fraction = {rate!r}: "
            f"expected a positive number"
        )
    return rate


def _check_tp(cfg: TransformerConfig, tp: int, sp: bool, s: int, sd: int, tp_link: Link | None) -> None:
    """Raise InputError where :func:`layer_table`'s ``tp`` does not divide
    the heads, kv heads or MLP width, or (with sequence parallelism ``sp``)
    the sequence lengths, or has no link."""
    for what, n in (("num_attention_heads", cfg.num_attention_heads), ("num_kv_heads", cfg.num_kv_heads),
                    ("ffn_hidden_size", cfg.ffn_hidden_size)):
        if n % tp:  # type: ignore[operator]
            raise InputError(
                f"layer_table: tp = {tp} does not divide {what} = {n} of {cfg.name!r} "
                f"(Megatron-LM splits heads, kv heads and the MLP width evenly)"
            )
    if sp and (s % tp or sd % tp):
        raise InputError(
            f"layer_table: sequence parallelism with tp = {tp} needs the sequence length "
            f"({s}{'' if sd == s else f' / decoder {sd}'}) divisible by tp"
        )
    if tp > 1 and tp_link is None:
        raise InputError(
            f"layer_table: tp = {tp} needs tp_link (the link between the devices of a "
            f"tensor-parallel group, usually the cluster's intra_node link)"
        )


@dataclass(frozen=True)
class _TableRates:
    """What :func:`_layer_of` needs of :func:`layer_table`'s options: ``t``
    (tp), ``sp`` (sequence parallelism with ``t > 1``), the GEMM ``rate``
    (FLOP/s), the tp ``link``, ``recompute`` and the two overlap flags."""

    t: int
    sp: bool
    rate: float
    link: Link
    recompute: str
    overlap_backward: bool
    overlap_forward: bool

    def allreduce_s(self, sizes) -> float:
        """Seconds of all-reducing tensors of these (unsharded) sizes."""
        return sum(_allreduce_s(x, self.t, self.link) for x in sizes)

    def gather_s(self, sizes) -> float:
        """Seconds of one all-gather or reduce-scatter of each size."""
        return sum(_gather_s(x, self.t, self.link) for x in sizes)


def _layer_of(name: str, r: _Raw, c: _TableRates, D: float) -> Layer:
    """The :class:`Layer` of raw layer ``r`` (:func:`layer_table`'s
    docstring gives every formula)."""
    t, rate = c.t, c.rate
    fwd_flops = (r.lin_flops + r.core_flops) / t
    fwd_compute = fwd_flops / rate
    core_compute = r.core_flops / t / rate
    fwd_comm = c.allreduce_s(r.fwd_pairs) + c.allreduce_s(r.fwd_ar_only) + (
        c.gather_s(r.fwd_single) if c.sp else c.allreduce_s(r.fwd_ar_nosp))
    if c.overlap_forward and r.acts is not None:
        fwd_comm = max(0.0, fwd_comm - r.lin_flops / t / rate)
    bwd_comm = c.allreduce_s(r.bwd_pairs) + (c.gather_s(r.bwd_single) if c.sp else c.allreduce_s(r.bwd_ar_nosp))
    # the embedding has no input gradient; its backward collective (with sp) serves the weight gradient
    bwd_input_comm = 0.0 if name == "embedding" else bwd_comm
    recompute_s = recompute_flops = 0.0
    if r.acts is not None and c.recompute == "full":
        recompute_s, recompute_flops = fwd_compute + fwd_comm, fwd_flops
    elif r.acts is not None and c.recompute == "selective":
        recompute_s, recompute_flops = core_compute, r.core_flops / t
    saved, wgrad_held, transient = _saved_bytes(r, c)
    overlapped = c.overlap_backward and bool(r.bwd_pair_gemms or r.bwd_single_gemms)
    bwd_exposed = _bwd_exposed_s(r, c) if overlapped else bwd_comm + _input_gathers_s(r, c)
    bwd_s = 2 * fwd_compute + bwd_exposed + recompute_s
    # (with the collectives exposed beyond the weight-gradient GEMMs the W pass is 0: no rounding above bwd)
    bwd_input_s = min(bwd_s, r.lin_flops / t / rate + 2 * core_compute + recompute_s + bwd_input_comm)
    return Layer(
        name=name,
        fwd_s=fwd_compute + fwd_comm,
        bwd_s=bwd_s,
        param_bytes=r.params.per_rank(t) * D,
        output_bytes=r.output_bytes / (t if c.sp else 1),
        saved_bytes=saved,
        bwd_input_s=bwd_input_s,
        flops=3 * fwd_flops + recompute_flops,
        wgrad_saved_bytes=wgrad_held,
        backward_transient_bytes=transient,
    )


def _bwd_exposed_s(r: _Raw, c: _TableRates) -> float:
    """Seconds of a layer's backward tensor-parallel collectives that its
    GEMMs do not hide, linear by linear (a block's, and the LM head's, a
    column-parallel GEMM). Megatron-LM's
    ``LinearWithGradAccumulationAndAsyncCommunication`` (and Transformer
    Engine's linear backward alike) launches the reduction of a
    column-parallel GEMM's input gradient (all-reduce; with sp a
    reduce-scatter) and computes that GEMM's weight gradient (its forward
    FLOPs) before waiting, so each hides under its own GEMM's weight
    gradient only; with sp it first gathers the GEMM's sequence-sharded
    saved input (for the weight gradient) under the GEMM's input gradient
    (forward FLOPs again); with sp, the all-gather of a row-parallel GEMM's
    output gradient (the backward of its reduce-scatter) must finish before
    that GEMM's backward starts: exposed, unless Transformer Engine's
    userbuffers pipeline it with the GEMM's input-gradient computation
    (``--tp-comm-overlap``, ``overlap_forward``; Wang et al., ASPLOS'23)."""
    out = 0.0
    for x, (col, row) in zip(r.bwd_pairs, r.bwd_pair_gemms):
        out += _column_exposed_s(x, col, c)
        if c.sp:  # the row-parallel GEMM's output-gradient all-gather
            part = _gather_s(x, c.t, c.link)
            out += max(0.0, part - row / c.t / c.rate) if c.overlap_forward else part
    for x, col in zip(r.bwd_single if c.sp else r.bwd_ar_nosp, r.bwd_single_gemms):
        out += _column_exposed_s(x, col, c)
    return out


def _column_exposed_s(x: float, col: float, c: _TableRates) -> float:
    """Seconds of a column-parallel GEMM's backward collectives on a
    tensor of ``x`` bytes that its own ``col`` forward FLOPs do not hide
    (:func:`_bwd_exposed_s`): with sp, the gather of its saved input (under
    its input gradient) and the reduce-scatter of its input gradient (under
    its weight gradient), each an all-gather's time; without, the
    all-reduce of its input gradient under its weight gradient."""
    if c.sp:
        return 2 * max(0.0, _gather_s(x, c.t, c.link) - col / c.t / c.rate)
    return max(0.0, _allreduce_s(x, c.t, c.link) - col / c.t / c.rate)


def _input_gathers_s(r: _Raw, c: _TableRates) -> float:
    """Seconds of gathering, with sp, the sequence-sharded saved input of
    each column-parallel GEMM of a layer for its weight gradient (none
    without sp): charged in full where the backward hides no collective,
    and in a zero-bubble plan's weight pass (where its weight gradients
    run), not its input pass."""
    if not c.sp:
        return 0.0
    return (sum(_gather_s(x, c.t, c.link) for x, _ in zip(r.bwd_pairs, r.bwd_pair_gemms))
            + sum(_gather_s(x, c.t, c.link) for x, _ in zip(r.bwd_single, r.bwd_single_gemms)))


def _saved_bytes(r: _Raw, c: _TableRates) -> tuple[float, float, float | None]:
    """``(saved, held for the weight gradients, transient in backward)``
    bytes of raw layer ``r`` on one tp rank (:func:`layer_table`'s
    docstring: Korthikanti et al. 2022 Table 2, Qi et al. 2023 Table 1)."""
    t, sp = c.t, c.sp
    if r.acts is None:  # embedding and head: all they saved is held for W (never recomputed)
        rep, spl = r.saved_fixed
        saved = (rep / t if sp else rep) + spl / t + r.saved_whole
        return saved, saved, None
    a = r.acts
    if c.recompute == "full":
        saved = a.block_input / (t if sp else 1)
    else:
        saved = _rank_bytes(a.replicated, (a.split, 0.0 if c.recompute == "selective" else a.core), t, sp)
    # while the block runs its backward under full recomputation it holds its whole activations
    # once more (Chen et al. 2016), but for the attention core: the recomputed forward runs the fused
    # attention kernel that selective assumes (FlashAttention: the scores are never whole, so a
    # 128K-token Llama-3 8B is not charged 137 GB of them per GPU at tp 8); selective recomputes the
    # attention core tile by tile, as FlashAttention's backward does, never whole
    transient = _rank_bytes(a.replicated, (a.split,), t, sp) if c.recompute == "full" else None
    # what the weight-gradient step still needs: each GEMM's input and output gradient (Qi et al. 2023,
    # Table 1: 32 of a GPT block's 34 sbh), as many bytes as the block saved outside the attention
    # core less its dropout masks (GPT: 34 - 2 sbh; a gated, GQA block without dropout: all of it);
    # recomputed ones too (full recompute recreates them before I)
    return saved, _rank_bytes(a.replicated - a.masks, (a.split,), t, sp), transient


def _table_source(cfg: TransformerConfig, s: int, sd: int, t: int, sp: bool, recompute: str, dtype_bytes: float,
                  vocab: int) -> str:
    """The ``source`` line of :func:`layer_table`'s profile."""
    parts = [f"seq_len={s}"]
    if cfg.is_encoder_decoder:
        parts.append(f"decoder_seq_len={sd}")
    parts += [f"tp={t}", f"sequence_parallel={str(sp).lower()}", f"recompute={recompute}",
              f"dtype_bytes={dtype_bytes:g}", f"vocab={vocab}"]
    if cfg.tied_embeddings:
        parts.append("tied_with=head:embedding")
    return (
        "analytic transformer cost model (pipesearch.profiles.transformer; Narayanan et al. SC'21, "
        f"Korthikanti et al. 2022): {', '.join(parts)}" + (f"; config {cfg.source}" if cfg.source else "")
    )
