"""Element sizes of served weights and of the KV cache.

Weight formats (what the engines load; ``docs/serving_costs.md``):

* ``bf16``: 2 bytes per parameter.
* ``fp8``: 1 byte per GEMM weight (FP8 E4M3, per-tensor or per-channel
  scales, whose size, 4 bytes per output row at most, is neglected). The
  embedding, the LM head and the norms stay in 16-bit: vLLM's ``fp8``
  quantization method applies to linear layers only (``Fp8Config`` returns
  no method for embeddings and the LM head), as do the published FP8
  checkpoints (``lm_head`` left unquantized).
* ``int4``: 4-bit GEMM weights in groups of 128 (GPTQ / AWQ, the layout
  of vLLM's Marlin kernels and of SGLang): per group one fp16 scale and one
  4-bit zero point, ``0.5 + (2 + 0.5) / 128`` bytes per weight; embedding, head
  and norms 16-bit.

KV cache: ``bf16`` 2 bytes per element, ``fp8`` 1 (vLLM ``--kv-cache-dtype
fp8``, SGLang ``--kv-cache-dtype fp8_e4m3``).

Devices (their ``compute_capability``): FP8 weights need 8.0 or newer (vLLM
runs W8A8 on Ada and Hopper, weight-only FP8 through its Marlin kernels on
Ampere; Volta and Turing have neither), and so does bf16 (before Ampere the
engines serve a bf16 model in fp16, ``--dtype half``: the same bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError
from ..types import MIN_BF16_CAPABILITY, DeviceSpec, has_bf16

__all__ = ["WeightFormat", "WEIGHT_FORMATS", "KV_DTYPES", "weight_format", "kv_dtype_bytes", "check_device_dtype",
           "runs_bf16", "checkpoint_weight_dtype"]

#: bytes of a 16-bit element (embeddings, norms, activations)
HALF_BYTES = 2.0
INT4_GROUP_SIZE = 128


@dataclass(frozen=True)
class WeightFormat:
    """How one weight format stores a model.

    Attributes:
        name: ``bf16``, ``fp8`` or ``int4``.
        gemm_bytes_per_param: bytes per GEMM weight, scales included.
        other_bytes_per_param: bytes per embedding, LM-head and norm parameter.
    """

    name: str
    gemm_bytes_per_param: float
    other_bytes_per_param: float = HALF_BYTES


WEIGHT_FORMATS: dict[str, WeightFormat] = {
    "bf16": WeightFormat("bf16", 2.0),
    "fp8": WeightFormat("fp8", 1.0),
    "int4": WeightFormat("int4", 0.5 + (2.0 + 0.5) / INT4_GROUP_SIZE),
}

KV_DTYPES: dict[str, float] = {"bf16": 2.0, "fp8": 1.0}


def weight_format(name: str) -> WeightFormat:
    """The format called ``name``; InputError naming ``--weight-dtype`` otherwise."""
    try:
        return WEIGHT_FORMATS[name]
    except KeyError:
        raise InputError(f"--weight-dtype {name!r}: expected one of {', '.join(WEIGHT_FORMATS)}") from None


def kv_dtype_bytes(name: str) -> float:
    """Bytes per KV-cache element of ``name``; InputError naming ``--kv-dtype`` otherwise."""
    try:
        return KV_DTYPES[name]
    except KeyError:
        raise InputError(f"--kv-dtype {name!r}: expected one of {', '.join(KV_DTYPES)}") from None


#: the CUDA compute capability from which the engines run FP8 weights (Ampere's weight-only kernel)
MIN_FP8_WEIGHT_CAPABILITY = MIN_BF16_CAPABILITY


def runs_bf16(device: DeviceSpec) -> bool:
    """Whether ``device`` computes in bf16 (:func:`pipesearch.types.has_bf16`);
    else a bf16 model is served in fp16."""
    return has_bf16(device.compute_capability)


def check_device_dtype(device: DeviceSpec, weight_dtype: str) -> None:
    """Refuse FP8 weights on a device whose compute capability is below
    :data:`MIN_FP8_WEIGHT_CAPABILITY` (no engine loads them there).

    Raises:
        InputError: names ``--weight-dtype``, the device and its capability.
    """
    cc = device.compute_capability
    if weight_dtype == "fp8" and cc is not None and cc < MIN_FP8_WEIGHT_CAPABILITY:
        raise InputError(f"--weight-dtype fp8 on {device.name} (compute capability {cc:.1f}): vLLM and SGLang run FP8 "
                         f"weights from compute capability {MIN_FP8_WEIGHT_CAPABILITY:.1f} (Ampere, weight-only; Ada "
                         "and Hopper, FP8 tensor cores); use --weight-dtype bf16 or int4")


#: quant_method values of a checkpoint's quantization_config read as 4-bit GPTQ / AWQ weights
INT4_METHODS = ("gptq", "awq", "gptq_marlin", "awq_marlin", "marlin")


def checkpoint_weight_dtype(quantization: dict) -> str | None:
    """The weight format (:data:`WEIGHT_FORMATS`) a HuggingFace
    ``quantization_config`` stores: ``fp8`` for ``quant_method`` fp8 (or
    compressed-tensors whose weights are 8-bit floats), ``int4`` for 4-bit
    GPTQ / AWQ (:data:`INT4_METHODS`, ``bits`` or ``w_bit`` 4, or
    compressed-tensors with 4-bit integer weights); None for any other (a
    format these costs do not size)."""
    method = str(quantization.get("quant_method", "")).lower()
    if method == "fp8":
        return "fp8"
    if method in INT4_METHODS:
        return "int4" if quantization.get("bits", quantization.get("w_bit")) == 4 else None
    if method == "compressed-tensors":
        groups = quantization.get("config_groups")
        weights = [g.get("weights") for g in groups.values()] if isinstance(groups, dict) else []
        kinds = {(w.get("num_bits"), w.get("type")) for w in weights if isinstance(w, dict)}
        if kinds == {(8, "float")}:
            return "fp8"
        if kinds == {(4, "int")}:
            return "int4"
    return None
