"""Turn a ``--model`` value into the layer tables the search weighs.

A profiled model (profile CSV, PipeDream ``graph.txt``) has one layer table.
A transformer (catalog TOML with a ``[transformer]`` table, or a HuggingFace
``config.json``) has one per (tensor-parallel degree, recompute mode): tensor
parallelism changes every layer's time, parameters and activations
(:func:`pipesearch.profiles.transformer.layer_table`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .catalog import resolve
from .errors import InputError
from .hardware import load_device
from .profiles import load_model
from .profiles.transformer import TransformerConfig, layer_table, load_transformer
from .search import ModelVariant
from .types import Cluster, DeviceSpec

RECOMPUTE_MODES = ("none", "selective", "full")


@dataclass(frozen=True)
class ModelSource:
    """What a ``--model`` value resolved to: its variants and a description
    for the plan file's ``inputs.model``."""

    name: str
    variants: tuple[ModelVariant, ...]
    info: dict
    profiled_device: DeviceSpec | None = None
    transformer: TransformerConfig | None = None


def _tp_candidates(cfg: TransformerConfig, cluster: Cluster) -> list[int]:
    per_node = min(g.devices_per_node for g in cluster.groups)
    out = []
    t = 1
    while t <= per_node:
        kv = cfg.num_kv_heads or cfg.num_attention_heads
        if per_node % t == 0 and cfg.num_attention_heads % t == 0 and kv % t == 0 and cfg.ffn_hidden_size % t == 0:
            out.append(t)
        t *= 2
    return out


def load_model_source(
    name_or_path: str,
    cluster: Cluster,
    *,
    tp: int | None = None,
    recompute: str | None = None,
    seq_len: int | None = None,
    sequence_parallel: bool = True,
) -> ModelSource:
    """Resolve ``name_or_path`` (catalog name or file) into layer-table variants.

    Args:
        tp: pin the tensor-parallel degree (transformers only; profiled models
            accept only 1).
        recompute: pin the activation recomputation mode (transformers only).
        seq_len: sequence length for a transformer (default: its config's).
        sequence_parallel: use Korthikanti et al.'s sequence parallelism
            whenever ``tp > 1`` (default); False keeps the non-parallel
            regions (norms, dropout) replicated on every tensor-parallel rank.

    Raises:
        CatalogError / InputError: unknown name, malformed file, a pin that
            does not apply (e.g. ``--tp 2`` on a profiled CNN).
    """
    path = resolve("model", name_or_path)
    if path.suffix in (".json", ".toml"):  # transformer configs (the loader names a malformed key)
        cfg = load_transformer(path, seq_len=seq_len)
        device = cluster.device_spec(0)
        tps = [tp] if tp else _tp_candidates(cfg, cluster)
        modes = [recompute] if recompute else list(RECOMPUTE_MODES)
        variants = []
        first_error = None
        for t in tps:
            for mode in modes:
                try:
                    sp = sequence_parallel and t > 1
                    prof = layer_table(cfg, seq_len=seq_len, device=device, tp=t, sequence_parallel=sp,
                                       recompute=mode, tp_link=cluster.intra_node)
                except InputError as exc:
                    if tp:  # a pinned degree that does not fit the model: say which option
                        raise InputError(f"--tp {tp}: {str(exc).removeprefix('layer_table: ')}") from None
                    first_error = first_error or exc
                    continue
                variants.append(ModelVariant(prof, tp=t, recompute=mode,
                                             extra=(("sequence_parallel", sp),)))
        if not variants:
            raise first_error or InputError(f"{path}: no tensor-parallel degree fits {cluster.name}")
        info = {"name": cfg.name, "kind": "transformer", "file": str(path), "num_layers": variants[0].profile.num_layers,
                "seq_len": seq_len or cfg.seq_len, "hidden_size": cfg.hidden_size,
                "num_attention_heads": cfg.num_attention_heads, "vocab_size": cfg.vocab_size}
        # the layer tables are computed for device 0's type; other types scale by FLOP rate
        return ModelSource(cfg.name, tuple(variants), info, device, cfg)
    if seq_len is not None:
        raise InputError(f"--seq-len {seq_len}: needs a transformer config; {path.name} is a layer profile")
    if tp not in (None, 1):
        raise InputError(f"--tp {tp}: tensor parallelism needs a transformer config; {path.name} is a layer profile")
    if recompute not in (None, "none"):
        raise InputError(f"--recompute {recompute}: needs a transformer config; {path.name} is a layer profile")
    profile = load_model(str(path))
    try:
        profiled_device = load_device(profile.profiled_device) if profile.profiled_device != "unknown" else None
    except InputError:
        profiled_device = None
    info = {"name": profile.name, "kind": "profile", "file": str(path), "num_layers": profile.num_layers,
            "profiled_batch_size": profile.profiled_batch_size, "profiled_device": profile.profiled_device,
            "source": profile.source}
    return ModelSource(profile.name, (ModelVariant(profile),), info, profiled_device)
