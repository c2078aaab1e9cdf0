"""Turn a ``--model`` value into the layer tables the search weighs.

A profiled model (profile CSV, PipeDream ``graph.txt``) has one layer table.
A transformer (catalog TOML with a ``[transformer]`` table, or a HuggingFace
``config.json``) has one per (tensor-parallel degree, recompute mode): tensor
parallelism changes every layer's time, parameters and activations
(:func:`pipesearch.profiles.transformer.layer_table`).
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from .budget import check_search_memory
from .catalog import list_entries, resolve
from .errors import InputError
from .hardware import device_file, device_reference, load_device
from .placement import reference_device
from .profiles import load_model
from .profiles.transformer import (TransformerConfig, decoder_tokens, guessed_family_note, layer_table, load_transformer,
                                   sliding_window_note)
from .search_options import ModelVariant
from .types import Cluster, DeviceSpec

RECOMPUTE_MODES = ("none", "selective", "full")
#: ``--recompute per-stage``: each stage of a transformer takes the first of
#: the modes above that fits its memory (:func:`pipesearch.stage_options.stage_options`)
PER_STAGE = "per-stage"

HF_SEQ_LEN_WARNING = 8192
"""A HuggingFace config whose maximum context exceeds this many tokens gets a
warning when no ``--seq-len`` is given (Qwen2's 131072 would otherwise be
planned as the training length)."""

#: transformer fields a plan file's ``inputs.model.transformer`` leaves out
#: when unset (files written before them stay as they were)
OPTIONAL_FIELDS = ("decoder_seq_len", "rope_scaling_type", "rope_scaling_factor")


SIZE_COLUMNS = (("param_bytes", "param_bytes"), ("output_bytes", "output_bytes"), ("saved_bytes", "saved_bytes"))
#: the graph.txt field each size comes from (pipesearch.profiles.pipedream)
GRAPH_FIELDS = {"param_bytes": "parameter_size", "output_bytes": "activation_size", "saved_bytes": "activation_size"}
RUNNING_SUM_MIN_LAYERS = 5
SMALL_BYTES = 4096


def profile_warnings(profile, cluster: Cluster, source: str, *, rescaled: bool = True,
                     device_name: str | None = None) -> list[str]:
    """Warnings for a measured profile that looks wrong for the plan.

    Args:
        profile: the :class:`~pipesearch.types.ModelProfile`.
        cluster: the cluster it will be planned on.
        source: the file name, for the messages.
        rescaled: whether the search rescales the profile's times (its
            device is in the catalog); otherwise they are used as measured.
        device_name: the name of the device the profile's ``# device:``
            header resolves to (a device TOML's own name), when known.

    Returns:
        One line per finding (empty when none):

        * a size column that never decreases over all of at least
          ``RUNNING_SUM_MIN_LAYERS`` layers and ends at 3x or more of its
          first nonzero value: it grows like running totals (per-layer sizes
          ``[6, 5, 4, 3, 2, 1]`` written as ``[6, 11, 15, 18, 20, 21]``);
        * a size column whose nonzero values are all below ``SMALL_BYTES``
          bytes: it looks like megabytes written in a byte column;
        * a profile measured on a device kind the cluster does not have:
          its times are rescaled by FLOP rate to the cluster's devices (an
          estimate, not a measurement).
    """
    out = []
    graph = str(source).endswith("graph.txt")  # a PipeDream graph: its nodes' fields, summed per block
    outputs = [float(lay.output_bytes) for lay in profile.layers]
    for attr, column in SIZE_COLUMNS:
        column = f"field {GRAPH_FIELDS[attr]} (summed per block)" if graph else f"column {column}"
        vals = [float(getattr(lay, attr)) for lay in profile.layers]
        if attr == "saved_bytes" and vals == outputs:  # its default (or the same field): said once, of output_bytes
            continue
        nz = [v for v in vals if v > 0]
        if len(vals) >= RUNNING_SUM_MIN_LAYERS and nz and all(b >= a for a, b in zip(vals, vals[1:])) \
                and vals[-1] >= 3 * nz[0] and len(set(vals)) == len(vals):
            diffs = [vals[0]] + [b - a for a, b in zip(vals, vals[1:])]
            out.append(f"{source}: {column} never decreases over the {len(vals)} layers "
                       f"({_short(vals)}): it looks like running totals; per-layer values are expected "
                       f"(as differences: {_short(diffs)})")
        if nz and max(nz) < SMALL_BYTES:
            out.append(f"{source}: every value of {column} is below {SMALL_BYTES} bytes (largest "
                       f"{max(nz):g}): it looks like megabytes where bytes are expected; give bytes")
    names = {g.device.name for g in cluster.groups}
    dev = profile.profiled_device
    mixed = len(names) > 1
    if mixed and not rescaled:  # the search takes the times as the fastest type's (search.search)
        from .costs import profile_precision

        fastest = reference_device(cluster, profile_precision(profile)).name
        what = (f"{dev!r}, a device neither the cluster nor the catalog defines{_did_you_mean(dev)}"
                if dev and dev != "unknown" else "an unnamed device")
        out.append(f"{source}: measured on {what}, planned on {', '.join(sorted(names))}: its times are taken as "
                   f"the fastest type's ({fastest}) and the others' scaled by FLOP rate; name the device in the "
                   f"profile's '# device:' header (a catalog name or a device TOML)")
    elif dev and dev != "unknown" and (device_name or dev) not in names:  # a device TOML: its own name counts
        how = ("its times are rescaled from one device kind to another by FLOP rate (an estimate"
               if rescaled else f"{dev!r} is no catalog device{_did_you_mean(dev)}, so its times are used "
               "unscaled (likely wrong")
        out.append(f"{source}: measured on {dev}, planned on {', '.join(sorted(names))}: {how}; profile on the "
                   f"target device for measured times)")
    return out


def _did_you_mean(dev: str) -> str:
    """`` (did you mean X?)`` with the catalog devices nearest to ``dev``'s
    name (at most two), or empty when none is near."""
    close = difflib.get_close_matches(dev.lower(), list(list_entries("device")), n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def profiled_device_of(name: str | None, cluster: Cluster, profile_path: Path | None = None) -> DeviceSpec | None:
    """The device a profile says it was measured on: the cluster's own device
    type of that name (a device TOML the cluster file names), a device TOML
    (a value ending in ``.toml``, or with a path separator where that file
    exists, relative to the profile's folder ``profile_path.parent``, as a
    cluster file's are: the answer never depends on the working directory;
    a path-like value that names no file there is free text), else the
    catalog's; None when unnamed (``unknown``) or unknown to both (free
    text).

    Raises:
        InputError: a device file that is missing or does not read as one
            (naming the profile, its ``device`` key and the value)."""
    if not name or name == "unknown":
        return None
    own = next((g.device for g in cluster.groups if g.device.name == name), None)
    if own is not None:
        return own
    path = device_file(profile_path, name) if profile_path is not None else None
    if path is not None:  # beside the profile, never from the working directory; free text may hold a "/"
        return device_reference(profile_path, "device", name) if name.endswith(".toml") or path.exists() else None
    try:
        return load_device(name)
    except InputError:
        return None


def _short(vals) -> str:
    text = ", ".join(f"{v:g}" for v in vals[:6])
    return f"[{text}{', ...' if len(vals) > 6 else ''}]"


def describe_layers(names) -> str:
    """How many layers a layer table has, in the model's terms.

    Returns:
        ``"32 blocks + embedding + head"`` for a transformer layer table
        (``embedding``, ``block_*``, ``head``; the embedding and head are
        layers of pipesearch's table, split like the blocks), else ``"N
        layers"``.
    """
    names = list(names)
    blocks = sum(1 for n in names if n.startswith("block_"))
    extra = [n for n in ("embedding", "head") if n in names]
    if blocks and blocks + len(extra) == len(names):
        return " + ".join([f"{blocks} blocks", *extra])
    return f"{len(names)} layers"


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
    decoder_seq_len: int | None = None,
    max_search_memory_bytes: float | None = None,
    sequence_parallel: bool = True,
    overlap_tp_forward: bool = False,
) -> ModelSource:
    """Resolve ``name_or_path`` (catalog name or file) into layer-table variants.

    Args:
        tp: pin the tensor-parallel degree (transformers only; profiled models
            accept only 1).
        recompute: pin the activation recomputation mode (transformers only);
            ``"per-stage"``: one variant per tensor-parallel degree whose
            stages each take the first of none / selective / full that fits.
        seq_len: sequence length for a transformer (default: its config's).
        decoder_seq_len: decoder tokens per sample of an encoder-decoder
            transformer (default: its config's ``decoder_seq_len``, else
            ``seq_len``); refused for any other model.
        max_search_memory_bytes: host-memory budget of the search
            (:func:`pipesearch.budget.check_search_memory`), checked on the
            layer count before a layer table is built; ``None``: no check.
        sequence_parallel: use Korthikanti et al.'s sequence parallelism
            whenever ``tp > 1`` (default); False keeps the non-parallel
            regions (norms, dropout) replicated on every tensor-parallel rank.
        overlap_tp_forward: forward tensor-parallel collectives under the
            GEMMs (:func:`pipesearch.profiles.transformer.layer_table`).

    Raises:
        CatalogError / InputError: unknown name, malformed file, a pin that
            does not apply (e.g. ``--tp 2`` on a profiled CNN), a model over
            the memory budget.
    """
    path = resolve("model", name_or_path)
    if path.suffix in (".json", ".toml"):  # transformer configs (the loader names a malformed key)
        cfg = load_transformer(path, seq_len=seq_len)
        if decoder_seq_len is not None:
            if not cfg.is_encoder_decoder:
                raise InputError(f"--decoder-seq-len {decoder_seq_len}: {cfg.name} is a decoder-only model (its "
                                 f"sequence length is --seq-len); only encoder-decoder models (T5) have a decoder length")
            cfg = replace(cfg, decoder_seq_len=decoder_seq_len)
        if max_search_memory_bytes is not None:  # the blocks plus embedding and head, before building them
            check_search_memory(cfg.total_blocks + 2, max_search_memory_bytes, f"--model {name_or_path}")
        device = reference_device(cluster)  # the fastest type, whatever the order of the groups
        tps = [tp] if tp else _tp_candidates(cfg, cluster)
        per_stage = recompute == PER_STAGE
        modes = list(RECOMPUTE_MODES) if per_stage or not recompute else [recompute]
        variants = []
        first_error = None
        for t in tps:
            for mode in modes:
                try:
                    sp = sequence_parallel and t > 1
                    prof = layer_table(cfg, seq_len=seq_len, device=device, tp=t, sequence_parallel=sp,
                                       recompute=mode, tp_link=cluster.intra_node,
                                       overlap_tp_forward=overlap_tp_forward)
                except InputError as exc:
                    if tp:  # a pinned degree that does not fit the model: say which option
                        raise InputError(f"--tp {tp}: {str(exc).removeprefix('layer_table: ')}") from None
                    first_error = first_error or exc
                    continue
                # zero-bubble schedules: the backward's collectives charged in full (its input pass waits for them)
                split = layer_table(cfg, seq_len=seq_len, device=device, tp=t, sequence_parallel=sp,
                                    recompute=mode, tp_link=cluster.intra_node, overlap_tp_backward=False,
                                    overlap_tp_forward=overlap_tp_forward) if t > 1 else None
                variants.append(ModelVariant(prof, tp=t, recompute=mode, extra=(("sequence_parallel", sp),),
                                             split_backward=None if split is None else (split, ())))
        if per_stage:  # one variant per tp: every stage takes the first mode that fits
            variants = [replace(group[0], recompute=PER_STAGE,
                                stage_tables=tuple((v.recompute, v.profile) for v in group),
                                split_backward=None if group[0].split_backward is None else (
                                    group[0].split_backward[0],
                                    tuple((v.recompute, v.split_backward[0]) for v in group)))
                        for t in tps if (group := [v for v in variants if v.tp == t])]
        if not variants:
            raise first_error or InputError(f"{path}: no tensor-parallel degree fits {cluster.name}")
        names = [lay.name for lay in variants[0].profile.layers]
        warnings = [note] if path.suffix == ".json" and (note := guessed_family_note(path)) else []
        if path.suffix == ".json" and (note := sliding_window_note(path, cfg.seq_len)):
            warnings.append(note)
        if path.suffix == ".json" and seq_len is None and cfg.seq_len > HF_SEQ_LEN_WARNING:
            warnings.append(
                f"{path}: sequence length {cfg.seq_len} is the config's maximum context (its "
                f"max_position_embeddings / n_positions), not a training length; pass --seq-len "
                f"(e.g. --seq-len {HF_SEQ_LEN_WARNING}) for the sequences you train on"
            )
        context = cfg.max_position_embeddings
        if context is not None and cfg.seq_len > context:
            given = f"--seq-len {seq_len}" if seq_len is not None else f"{path}: seq_len = {cfg.seq_len}"
            warnings.append(
                f"{given} is longer than {cfg.name}'s context of {context} tokens (its "
                f"max_position_embeddings): training at {cfg.seq_len} needs its positions extended (e.g. rotary "
                f"scaling); the exports pass {cfg.seq_len} as the position limit"
            )
        info = {"name": cfg.name, "kind": "transformer", "file": str(path), "num_layers": variants[0].profile.num_layers,
                "layers_description": describe_layers(names), "warnings": warnings,
                "seq_len": seq_len or cfg.seq_len, "hidden_size": cfg.hidden_size,
                **({"decoder_seq_len": decoder_tokens(cfg, cfg.seq_len)} if cfg.is_encoder_decoder else {}),
                "num_attention_heads": cfg.num_attention_heads, "vocab_size": cfg.vocab_size,
                "transformer": {k: v for k, v in asdict(cfg).items()
                                if k != "source" and not (k in OPTIONAL_FIELDS and v is None)}}
        # the layer tables are computed for the reference type; other types scale by FLOP rate
        return ModelSource(cfg.name, tuple(variants), info, device, cfg)
    if seq_len is not None:
        raise InputError(f"--seq-len {seq_len}: needs a transformer config; {path.name} is a layer profile")
    if decoder_seq_len is not None:
        raise InputError(f"--decoder-seq-len {decoder_seq_len}: needs an encoder-decoder transformer config; "
                         f"{path.name} is a layer profile")
    if tp not in (None, 1):
        raise InputError(f"--tp {tp}: tensor parallelism needs a transformer config; {path.name} is a layer profile")
    if recompute not in (None, "none", PER_STAGE):
        raise InputError(f"--recompute {recompute}: needs a transformer config; {path.name} is a layer profile "
                         f"(a profile's own recompute_saved_bytes column gives it per-stage recompute)")
    profile = load_model(str(path))
    if profile.layers and not profile.takes_time:  # the search refuses it too; here the file is known
        raise InputError(f"{path}: {profile.NO_TIME}")
    recomputable = any(lay.recompute_saved_bytes is not None for lay in profile.layers)
    if recompute == PER_STAGE and not recomputable:
        raise InputError(f"--recompute {PER_STAGE}: {path.name} has no recompute_saved_bytes column (the bytes a layer "
                         "keeps when its forward is recomputed), so no stage can recompute; add the column or drop the "
                         "flag")
    if recomputable and recompute == "none":  # the pin: no layer is recomputed
        profile = replace(profile, layers=tuple(replace(lay, recompute_saved_bytes=None) for lay in profile.layers))
    mode = PER_STAGE if recomputable and recompute != "none" else "none"
    if max_search_memory_bytes is not None:
        check_search_memory(profile.num_layers, max_search_memory_bytes, f"--model {name_or_path}")
    profiled_device = profiled_device_of(profile.profiled_device, cluster, path)
    info = {"name": profile.name, "kind": "profile", "file": str(path), "num_layers": profile.num_layers,
            "layers_description": describe_layers([lay.name for lay in profile.layers]),
            "warnings": profile_warnings(profile, cluster, path.name, rescaled=profiled_device is not None,
                                         device_name=None if profiled_device is None else profiled_device.name),
            "profiled_batch_size": profile.profiled_batch_size, "profiled_device": profile.profiled_device,
            "source": profile.source}
    return ModelSource(profile.name, (ModelVariant(profile, recompute=mode),), info, profiled_device)
