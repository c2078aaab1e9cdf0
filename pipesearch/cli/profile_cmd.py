"""``pipesearch profile``: measure a PyTorch model layer by layer, write a profile CSV."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import click

from ..errors import InputError, quoted_cause
from ..limits import MAX_COUNT, MAX_INPUT_DIMS, MAX_PROFILE_ELEMENTS
from ..output import check_distinct_paths, check_writable, write_output
from ..profiler import (CLOCKS, DTYPES, build_model, import_torch, load_factory, profile_module,
                        profile_module_at_sizes, torch_dtype)
from ..profiles import write_profile_csv
from ..profiles.csv_profile import writable_name
from . import main


def parse_shape(text: str) -> tuple[int, ...]:
    """``"64,512"`` (or ``"64x512"``) -> ``(64, 512)``; every entry an integer >= 1."""
    parts = [p.strip() for p in re.split(r"[,x]", text.strip())]
    shape = tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else ()
    if not shape or any(d < 1 for d in shape):
        raise InputError(f"--input-shape {text!r}: expected the per-sample shape as positive integers "
                         "separated by commas, e.g. 64,512")
    if len(shape) > MAX_INPUT_DIMS or max(shape) > MAX_COUNT:
        raise InputError(f"--input-shape {text[:80]!r}: at most {MAX_INPUT_DIMS} dimensions of at most "
                         f"{MAX_COUNT:,} each")
    return shape


def check_input_size(shape: tuple[int, ...], sizes: list[int], size_option: str) -> None:
    """Refuse a batch of more than :data:`MAX_PROFILE_ELEMENTS` input elements
    (it could never be allocated; torch would fail with an overflow)."""
    elements = max(sizes) * math.prod(shape)
    if elements > MAX_PROFILE_ELEMENTS:
        raise InputError(f"{size_option} with --input-shape {','.join(map(str, shape))}: {elements:.3g} input "
                         f"elements in one batch, above {MAX_PROFILE_ELEMENTS:.3g}; profile at a smaller batch "
                         f"size or input shape (the planner scales to others)")


def check_chained_attention(cfg: dict, path, seq_len: int) -> None:
    """Refuse a HuggingFace config whose model computes what the chain
    pipesearch profiles (and runs, :func:`pipesearch.profiler.hf_causal_lm_chain`:
    full causal attention, plain logits) does not: a sliding window
    shorter than the sequence (Mistral v0.1, Gemma-2's local layers), or
    softcapped logits (Gemma-2). Its layers would be timed as another model.

    Raises:
        InputError: naming the key, its value and the fix.
    """
    from ..profiles.transformer import used_sliding_window

    window = used_sliding_window(cfg, seq_len)
    if window is not None:
        raise InputError(f"--hf-config {path}: sliding_window {window} < the {seq_len}-token sequence: the profiled "
                         f"chain runs full causal attention, not the model's window; profile at most {window} tokens "
                         "(--input-shape)")
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if cfg.get(key):
            raise InputError(f"--hf-config {path}: {key} {cfg[key]}: the profiled chain computes plain logits and "
                             "attention scores, not the model's capped ones; pipesearch's chain cannot profile it")


@main.command("profile")
@click.argument("model_spec", metavar="MODULE:FACTORY", required=False)
@click.option("--hf-config", type=click.Path(dir_okay=True), help="Profile a HuggingFace causal LM built from this "
              "config.json (random weights, nothing downloaded; needs transformers) instead of MODULE:FACTORY; "
              "token-id inputs below its vocabulary.")
@click.option("--input-shape", required=True,
              help="Shape of one sample (without the batch dimension), e.g. 64,512.")
@click.option("--batch-size", "-b", type=click.IntRange(min=1),
              help="Samples per batch to profile at (the profile's batch size); times scale linearly to other sizes.")
@click.option("--batch-sizes", help="Profile at each of these batch sizes (e.g. 1,2,4; two or more) and fit every "
              "layer's times as fixed + per-sample * batch; the profile is at the largest, with fixed-time columns. "
              "Instead of --batch-size.")
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True,
              help="Dtype of the model and of a floating-point input.")
@click.option("--input-dtype", type=click.Choice(("float", "long")), default="float", show_default=True,
              help="float: random normal input in --dtype; long: random token ids in [0, --vocab-size) "
                   "(models that start with an embedding).")
@click.option("--vocab-size", type=click.IntRange(min=1), help="Token ids are drawn below this (with --input-dtype long).")
@click.option("--warmup", type=click.IntRange(min=0), default=3, show_default=True, help="Discarded runs per layer.")
@click.option("--repeats", type=click.IntRange(min=1), default=10, show_default=True,
              help="Timed runs per layer (the median is kept).")
@click.option("--clock", type=click.Choice(CLOCKS), default="auto", show_default=True,
              help="Timer: cpu = the thread's CPU time (less sensitive to other work on the host), wall = wall clock; "
                   "auto = cpu with one thread on CPU.")
@click.option("--device", default="cpu", show_default=True,
              help="Where to measure: cpu, or cuda / cuda:N (timed with CUDA events).")
@click.option("--device-name", help="Catalog device to record in the profile (e.g. h100-80gb; default: --device), "
                                    "so plans on other device kinds are rescaled and warned about.")
@click.option("--name", help="Model name in the profile (default: the factory's module name).")
@click.option("--seed", type=click.IntRange(min=0, max=2**64 - 1), default=0, show_default=True,
              help="Seed of the random input and the model.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), default="profile.csv",
              show_default=True, help="Profile CSV to write.")
def profile_command(model_spec, hf_config, input_shape, batch_size, batch_sizes, dtype, input_dtype, vocab_size, warmup, repeats,
                    clock, device, device_name, name, seed, output):
    """Profile a PyTorch model on this machine (CPU, or a CUDA GPU), one layer at a time.

    MODULE:FACTORY names a function returning the model (an nn.Sequential, a
    module with a `layers` ModuleList, or a module whose children run in
    order, a ModuleList child counting as its entries: embedding, layers,
    head); MODULE is a module path importable from the current directory or
    a .py file. The input is random, of shape (batch size, *input shape):
    floats, or token ids with --input-dtype long --vocab-size N.
    Timings use one CPU thread (torch.set_num_threads(1)) and, by default,
    that thread's CPU time, which other work on the host inflates less;
    layer names are the module FQNs, ready for torch.distributed.pipelining
    split points. With --hf-config they are the children of the chain
    pipesearch builds from the model (embed_tokens, layers_<i>, lm_head), so
    the factory that runs the plan returns that chain:
    pipesearch.profiler.hf_model_from_config("config.json"), not the model
    itself.

    \b
    Examples:
      pipesearch profile tests/e2e_model.py:make_model --input-shape 1024 --batch-size 128 -o e2e.csv
      pipesearch profile tests/gpt_model.py:make_gpt --input-shape 64 --input-dtype long --vocab-size 512 -b 8 -o gpt.csv
      pipesearch profile tests/gpt_model.py:make_gpt --input-shape 64 --input-dtype long --vocab-size 512 --batch-sizes 1,2,4,8 -o gpt.csv
      pipesearch profile --hf-config tiny-llama/config.json --input-shape 128 -b 4 -o llama.csv
      pipesearch plan --model e2e.csv --cluster 1x2-cpu --pp 2 --num-micro-batches 4 -b 512
    """
    _check_request(model_spec, hf_config, name, input_dtype)
    sizes = parse_batch_sizes(batch_size, batch_sizes)
    check_writable(output, "profile CSV (-o)")
    _check_output(model_spec, hf_config, output)
    if device_name is not None:
        device_name = _device_label(device_name, device)
    cfg_path = hf_cfg = None
    if hf_config is not None:
        cfg_path, hf_cfg, vocab_size = _read_hf_config(hf_config, vocab_size)
        input_dtype = "long"
    if input_dtype == "long" and vocab_size is None:
        raise InputError("--input-dtype long: give --vocab-size N (token ids are drawn from 0 .. N-1)")
    if input_dtype == "float" and vocab_size is not None:
        raise InputError(f"--vocab-size {vocab_size}: only used with --input-dtype long")
    torch = import_torch()
    shape = parse_shape(input_shape)
    size_option = f"--batch-sizes {','.join(map(str, sizes))}" if len(sizes) > 1 else f"--batch-size {sizes[0]}"
    check_input_size(shape, sizes, size_option)
    if hf_config is not None:
        _check_hf_input(hf_cfg, cfg_path, shape, dtype)
    torch.manual_seed(seed)
    if hf_config is not None:
        from ..profiler import hf_model_from_config

        model = hf_model_from_config(cfg_path, seed=seed)
        model_spec = f"--hf-config {cfg_path}"
    else:
        model = build_model(load_factory(model_spec), model_spec)
    dt = torch_dtype(dtype)
    model = model.to(dt)

    def make_input(batch: int):
        if input_dtype == "long":
            return torch.randint(0, vocab_size, (batch, *shape), dtype=torch.long)
        return torch.randn(batch, *shape, dtype=dt)

    module_text = model_spec.rpartition(":")[0]
    default_name = Path(module_text).stem if module_text.endswith(".py") else module_text.rpartition(".")[2]
    if hf_config is not None:
        default_name = cfg_path.parent.name or "hf_model"
    if device != "cpu" and (not device.startswith("cuda") or not torch.cuda.is_available()):
        raise InputError(f"--device {device}: expected cpu, or cuda / cuda:N on a machine with a CUDA GPU "
                         f"(torch.cuda.is_available() is {torch.cuda.is_available()})")
    on_cpu = device == "cpu"
    if input_dtype == "long":
        check_vocab_size(model, vocab_size)
    options = dict(warmup=warmup, repeats=repeats, device=device, clock=clock if on_cpu else "wall",
                   num_threads=1 if on_cpu else None, device_name=device_name, name=name or default_name,
                   source=f"pipesearch profile {model_spec} --input-shape {','.join(map(str, shape))} "
                          f"{size_option} --dtype {dtype}"
                          + (f" --input-dtype long --vocab-size {vocab_size}" if input_dtype == "long" else ""))
    where = f"{size_option} with --input-shape {','.join(map(str, shape))}"
    profile = _profiled(model, make_input, sizes, options, model_spec or hf_config, where)
    write_output(output, lambda path: write_profile_csv(profile, path), "profile CSV (-o)")
    _summary(profile, sizes, "1 CPU thread" if on_cpu else device, output, warmup)


def _check_request(model_spec, hf_config, name, input_dtype) -> None:
    """Refuse a command without one model source, a blank or multi-line
    ``--name``, and ``--input-dtype float`` given with ``--hf-config``."""
    if (model_spec is None) == (hf_config is None):
        raise InputError("profile: give MODULE:FACTORY or --hf-config config.json (one of them)")
    if name is not None and not name.strip():
        raise InputError("--name: empty; give the model's name, or leave the option out (the factory's module name)")
    if name is not None and not writable_name(name):
        raise InputError(f"--name {name!r}: the profile's name must be one line without leading or trailing "
                         "blanks (it is a header line of the CSV)")
    if hf_config is not None and input_dtype == "float" and click.get_current_context().get_parameter_source(
            "input_dtype") == click.core.ParameterSource.COMMANDLINE:
        raise InputError("--input-dtype float: --hf-config profiles a language model on token ids (long); "
                         "leave the option out")


def _check_output(model_spec, hf_config, output) -> None:
    """Refuse an output that is one of the inputs, or not a ``.csv``."""
    source = model_spec.rsplit(":", 1)[0] if model_spec and ":" in model_spec else model_spec
    config = hf_config if hf_config is None or not Path(hf_config).is_dir() else Path(hf_config) / "config.json"
    check_distinct_paths({"-o": output}, {"MODULE:FACTORY": source, "--hf-config": config})
    if Path(output).suffix.lower() != ".csv":
        raise InputError(f"profile -o {output}: a profile is read back by its .csv suffix (plan --model); name it "
                         f"{Path(output).with_suffix('.csv').name}")


def _device_label(device_name: str, device: str) -> str:
    """``--device-name`` checked (a catalog device or a device TOML, the
    name plans rescale by; a device file's absolute path, so that a plan
    run elsewhere finds it), with a warning for a GPU's name on CPU times."""
    from ..hardware import load_device

    try:
        named = load_device(device_name)
    except InputError as exc:
        raise InputError(f"--device-name {device_name}: {exc}") from None
    if device == "cpu" and named.compute_capability is not None:  # a CUDA GPU's name on CPU times
        click.echo(f"warning: --device-name {device_name} labels times measured on the CPU: plans take them "
                   f"as {named.name}'s, unscaled (a GPU runs them many times faster); profile on it with "
                   f"--device cuda, or leave --device-name out", err=True)
    return str(Path(device_name).resolve()) if Path(device_name).is_file() else device_name


def _read_hf_config(hf_config: str, vocab_size: int | None) -> tuple[Path, dict, int]:
    """``(config path, its JSON, vocabulary size)`` of ``--hf-config`` (a
    file, or a directory holding config.json), checked (:func:`check_hf_config`;
    ``--vocab-size`` at most the config's)."""
    cfg_path = Path(hf_config) / "config.json" if Path(hf_config).is_dir() else Path(hf_config)
    if Path(hf_config).is_dir() and not cfg_path.exists():
        raise InputError(f"--hf-config {hf_config}: a directory without a config.json; give the config file "
                         "or the model's directory holding it")
    try:
        hf_cfg = json.loads(cfg_path.read_text())
    except OSError as exc:
        raise InputError(f"--hf-config {hf_config}: cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:  # not UTF-8, or not JSON (JSONDecodeError names the line and column)
        raise InputError(f"--hf-config {hf_config}: not a JSON config ({exc})") from None
    try:
        hf_vocab = hf_cfg["vocab_size"]
    except (KeyError, TypeError) as exc:
        raise InputError(f"--hf-config {hf_config}: no vocab_size ({type(exc).__name__}: {exc}); a "
                         "HuggingFace config.json names the vocabulary size") from None
    check_hf_config(hf_cfg, cfg_path)
    if vocab_size is not None and vocab_size > hf_vocab:
        raise InputError(f"--vocab-size {vocab_size}: above the config's vocab_size {hf_vocab}")
    return cfg_path, hf_cfg, vocab_size or hf_vocab


def _check_hf_input(hf_cfg: dict, cfg_path: Path, shape: tuple[int, ...], dtype: str) -> None:
    """A language model's input: one sequence of token ids per sample, no
    longer than the model's context, whose attention the chain can run and
    whose model fits in host memory."""
    if len(shape) != 1:
        raise InputError(f"--input-shape {','.join(map(str, shape))}: a language model's sample is one sequence of "
                         "token ids; give its length alone (e.g. --input-shape 128)")
    if isinstance(hf_cfg.get("max_position_embeddings"), int) and shape[-1] > hf_cfg["max_position_embeddings"]:
        raise InputError(f"--input-shape {','.join(map(str, shape))}: a sequence of {shape[-1]} tokens, longer than "
                         f"{cfg_path}'s max_position_embeddings {hf_cfg['max_position_embeddings']} (the model's "
                         f"context); profile at most that many")
    check_chained_attention(hf_cfg, cfg_path, shape[-1])
    check_host_memory(cfg_path, shape[-1], dtype)


def _profiled(model, make_input, sizes: list[int], options: dict, label: str, where: str):
    """Profile ``model`` at the batch size (or fit over the sizes); the
    module's own shape errors name the model (``label``), a failed
    allocation the input (``where``)."""
    try:
        if len(sizes) > 1:
            return profile_module_at_sizes(model, make_input, sizes, **options)
        return profile_module(model, make_input(sizes[0]), batch_size=sizes[0], **options)
    except InputError as exc:  # the module's own shape: say which one the command built
        if not str(exc).startswith("cannot profile "):
            raise
        raise InputError(f"{label}: {exc}") from None
    except (MemoryError, RuntimeError) as exc:  # torch reports a failed allocation as RuntimeError
        if not isinstance(exc, MemoryError) and "alloc" not in str(exc).lower() and "out of memory" not in str(exc):
            raise
        raise InputError(f"{where}: the model's inputs or activations at batch {max(sizes)} do not fit in "
                         f"{options['device']} memory ({quoted_cause(str(exc), 160)}); profile at a smaller batch "
                         f"size or input shape (the planner scales to others)") from None


def _summary(profile, sizes: list[int], where: str, output, warmup: int) -> None:
    """The profile's one-line summary, and a note on ``--warmup 0``."""
    total = sum(lay.fwd_s + lay.bwd_s for lay in profile.layers)
    fit = ""
    if len(sizes) > 1:
        fixed = sum((lay.fwd_fixed_s or 0.0) + (lay.bwd_fixed_s or 0.0) for lay in profile.layers)
        fit = f" (fitted over batch sizes {','.join(map(str, sizes))}: fixed {1e3 * fixed:.2f} ms)"
    click.echo(f"{profile.name}: {profile.num_layers} layers, batch {profile.profiled_batch_size}, forward+backward "
               f"{1e3 * total:.2f} ms{fit} on {where}; wrote {output}")
    if warmup == 0:
        click.echo("note: --warmup 0: each layer's first run (memory allocation, kernel choice) is among the timed "
                   "ones; with few --repeats its times can be far above the steady ones", err=True)


#: keys of a HuggingFace config that size the model: integers >= 1 where present
HF_COUNT_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                 "intermediate_size", "max_position_embeddings", "head_dim")


def host_available_bytes() -> float | None:
    """The memory this host can give a new allocation without swapping
    (``MemAvailable`` of ``/proc/meminfo``, Linux), None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


#: bytes per parameter of the dtypes a config or --dtype names
_DTYPE_BYTES = {"float64": 8, "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}


def check_host_memory(cfg_path: Path, seq_len: int, dtype: str = "float32", available: float | None = None) -> None:
    """Refuse a ``--hf-config`` whose model does not fit this host's
    available memory as transformers builds it and ``--dtype`` (``dtype``)
    casts it: the parameters in the config's own ``torch_dtype`` /
    ``dtype`` (transformers 5's ``from_config``; fp32 where it names none),
    or in ``dtype`` where that takes more (the process was killed by the
    system with no message). The parameters are counted from the config
    (:func:`pipesearch.profiles.transformer.parameter_count`); a config the
    transformer loader does not read is left to transformers."""
    from ..profiles.transformer import load_transformer, parameter_count

    available = host_available_bytes() if available is None else available
    if available is None:
        return
    try:
        params = parameter_count(load_transformer(cfg_path, seq_len=seq_len))
        cfg = json.loads(Path(cfg_path).read_text(encoding="utf-8"))
    except (InputError, OSError, ValueError):
        return
    built = cfg.get("torch_dtype", cfg.get("dtype")) if isinstance(cfg, dict) else None
    built = built if built in _DTYPE_BYTES else "float32"
    widest = max((built, dtype), key=lambda d: _DTYPE_BYTES.get(d, 4))
    need = _DTYPE_BYTES.get(widest, 4) * float(params)
    if need > available:
        raise InputError(f"--hf-config {cfg_path}: its {params / 1e9:,.2f} billion parameters take "
                         f"{need / 2**30:,.1f} GiB in {widest} (built in the config's {built}, cast to --dtype "
                         f"{dtype}), more than the {available / 2**30:,.1f} GiB this host has available; plan it "
                         f"from the config (pipesearch plan --model {cfg_path}), or profile on a host with more "
                         f"memory")


def check_hf_config(cfg: dict, path: Path) -> None:
    """Refuse a ``--hf-config`` whose sizes are not integers >= 1 (within
    :data:`pipesearch.limits.MAX_COUNT`) or that holds a number that is not
    finite, naming the file, key and value (transformers would fail inside
    the model's constructor or build a model that computes NaN)."""
    if not isinstance(cfg, dict):
        raise InputError(f"--hf-config {path}: expected a JSON object of the model's settings")
    for key in HF_COUNT_KEYS:
        value = cfg.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT):
            raise InputError(f"--hf-config {path}: {key} {value!r}: expected an integer >= 1")
    for key, value in cfg.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise InputError(f"--hf-config {path}: {key} {value!r}: expected a finite number")
    heads, hidden = cfg.get("num_attention_heads"), cfg.get("hidden_size")
    if isinstance(heads, int) and isinstance(hidden, int) and cfg.get("head_dim") is None and hidden % heads:
        raise InputError(f"--hf-config {path}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    kv = cfg.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kv, int) and not isinstance(kv, bool) and heads % kv:
        raise InputError(f"--hf-config {path}: num_attention_heads {heads} is not a multiple of num_key_value_heads "
                         f"{kv} (each key/value head serves a group of query heads)")


def check_vocab_size(model, vocab_size: int) -> None:
    """Refuse token ids the model's first embedding cannot look up
    (``--vocab-size`` above its ``num_embeddings``)."""
    torch = import_torch()
    first = next((m for m in model.modules() if isinstance(m, torch.nn.Embedding)), None)
    if first is not None and vocab_size > first.num_embeddings:
        raise InputError(f"--vocab-size {vocab_size}: above the model's first embedding's {first.num_embeddings} "
                         f"entries (token ids index it); give at most {first.num_embeddings}")


def parse_batch_sizes(batch_size: int | None, batch_sizes: str | None) -> list[int]:
    """The batch sizes to profile at: ``[--batch-size]``, or the distinct
    ``--batch-sizes`` in increasing order (two or more, each >= 1).

    Raises:
        InputError: neither or both options, a malformed list, or fewer than
            two distinct sizes.
    """
    if (batch_size is None) == (batch_sizes is None):
        raise InputError("profile: give --batch-size N or --batch-sizes N1,N2,... (one of them)")
    if batch_sizes is None:
        return [batch_size]
    parts = [p.strip() for p in batch_sizes.split(",")]
    if not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise InputError(f"--batch-sizes {batch_sizes!r}: expected integers >= 1 separated by commas, e.g. 1,2,4")
    sizes = sorted({int(p) for p in parts})
    if len(sizes) < 2:
        raise InputError(f"--batch-sizes {batch_sizes!r}: a fixed + per-sample fit needs at least two distinct "
                         "sizes, e.g. 1,2,4 (or use --batch-size N for one)")
    return sizes
