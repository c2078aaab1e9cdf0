"""Profile a PyTorch model layer by layer into a :class:`~pipesearch.types.ModelProfile`.

``profile_module(model, example_input, batch_size=N)`` measures, for every
layer of a model that runs as a chain (an ``nn.Sequential``, a module whose
only child is a ``layers`` ``ModuleList``/``Sequential``, or any module whose
children run in order), at the batch size of ``example_input``:

* ``fwd_s``: forward time, the median over ``repeats`` runs after ``warmup``
  runs. Runs are interleaved: each pass times every layer once, in order, so
  a burst of other work on the host slows a pass (which the median drops)
  rather than one layer (which would skew the split);
* ``bwd_s``: backward time, the median of ``torch.autograd.backward`` on the
  layer's output with a ones-like gradient. The layer's input requires grad,
  so the time includes the input gradient a pipeline stage sends back -- except
  for the first layer, whose input is the data (no gradient is computed for it
  in training either);
* ``param_bytes``: the bytes of the layer's parameters;
* ``output_bytes``: the bytes of its output (what a stage boundary after it
  sends);
* ``saved_bytes``: the bytes autograd keeps from the forward for the backward,
  summed through ``torch.autograd.graph.saved_tensors_hooks`` over the
  distinct storages of the saved tensors, parameters excluded (they are in
  ``param_bytes``);
* ``shared_saved_bytes``: the bytes of the storages a layer saves that the
  layer before it saves too (the tensor between them: a ReLU keeps its
  output, the Linear after it keeps the same tensor as its input), from one
  forward of the two layers in a row under one hook; a stage holding both
  keeps them once (:attr:`pipesearch.types.Layer.shared_saved_bytes`).
  Measured layer by layer, a chain of Linear and ReLU layers otherwise
  counts its activations 1.6 times. Neighbours only: a tensor kept by two
  layers with one between them that keeps nothing of it (ReLU, Flatten,
  Linear) is counted twice in a stage holding all three (an overestimate).

``profile_module_at_sizes(model, make_input, [1, 2, 4])`` measures at every
size (warm-up runs dropped at each) and fits each layer's forward and
backward times as ``fixed + per_sample * b`` by least squares with both parts
>= 0 (:func:`fit_fixed_per_sample`); the profile is at the largest size with
``Layer.fwd_fixed_s`` / ``bwd_fixed_s``, so the cost model charges small
micro-batches their fixed part (:meth:`ModelProfile.layer_times_at`) instead
of scaling the time down in proportion.

Layer names are the children's fully qualified module names (``"0"``,
``"1"``, ... for an ``nn.Sequential``; ``"layers.0"`` ... for a ``layers``
list), so a plan's ``layer_names`` are the FQNs that
``torch.distributed.pipelining`` split points and ``get_submodule`` take.

Measurement runs with ``torch.set_num_threads(1)`` (restored afterwards): one
intra-op thread gives stable timings on a shared host and is the setting the
CPU pipeline runtime (:mod:`pipesearch.runtime.torch_pipeline`) trains with,
one thread per stage process. With one thread on CPU the default clock is the
thread's CPU time (``time.thread_time``), so the time the thread waits for a
core on a host busy with other work is not counted (co-runners still slow
the compute itself through shared caches and memory bandwidth);
``clock="wall"`` measures wall time instead.

torch is imported lazily; without it the functions raise
:class:`~pipesearch.errors.InputError` with the install hint.
"""

from __future__ import annotations

import importlib
import importlib.util
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from .errors import InputError, quoted_cause
from .limits import MIN_LAYER_S
from .types import Layer, ModelProfile

TORCH_HINT = "pip install torch (CPU wheels: pip install torch --index-url https://download.pytorch.org/whl/cpu)"

DTYPES = ("float32", "float64", "bfloat16", "float16")


def import_torch():
    """``torch``, or :class:`InputError` with the install hint when it is missing."""
    try:
        import torch
    except ImportError as exc:
        raise InputError(f"profiling needs PyTorch, which is not importable ({exc}); {TORCH_HINT}") from None
    return torch


# ---------------------------------------------------------------- layers of a model


def model_layers(model) -> list[tuple[str, Any]]:
    """The chain of ``(fqn, module)`` a model runs, in order.

    * ``nn.Sequential``: its children (names ``"0"``, ``"1"``, ...);
    * a module whose only child is ``layers`` (a ``ModuleList`` or
      ``Sequential``): that list's entries, named ``"layers.<i>"``;
    * any other module: its children in registration order, which the caller
      asserts is the order its ``forward`` runs them, each feeding the next;
      a child that is a ``ModuleList`` / ``ModuleDict`` (no forward of its
      own) contributes its entries in order, so the usual GPT shape
      ``embedding, layers = ModuleList([...]), norm, head`` is the chain
      ``embedding, layers.0 .. layers.N-1, norm, head``.

    Raises:
        InputError: not an ``nn.Module``, a module without children, or a
            container nested in a container (no single chain).
    """
    torch = import_torch()
    nn = torch.nn
    if not isinstance(model, nn.Module):
        raise InputError(f"cannot profile {type(model).__name__}: expected a torch.nn.Module")
    children = list(model.named_children())
    if isinstance(model, nn.Sequential):
        layers = children
    elif (len(children) == 1 and children[0][0] == "layers"
          and isinstance(children[0][1], (nn.ModuleList, nn.Sequential))):
        layers = [(f"layers.{name}", mod) for name, mod in children[0][1].named_children()]
    else:
        layers = []
        for name, mod in children:
            if isinstance(mod, (nn.ModuleList, nn.ModuleDict)):
                for sub, entry in mod.named_children():
                    if isinstance(entry, (nn.ModuleList, nn.ModuleDict)):
                        raise InputError(f"cannot profile {type(model).__name__}: {name}.{sub} is a "
                                         f"{type(entry).__name__} inside a {type(mod).__name__}; give a module "
                                         f"whose children (or one level of list entries) run as a chain")
                    layers.append((f"{name}.{sub}", entry))
            else:
                layers.append((name, mod))
    if not layers:
        raise InputError(f"cannot profile {type(model).__name__}: it has no child modules to use as layers "
                         "(give an nn.Sequential or a module with a 'layers' ModuleList)")
    return layers


# ---------------------------------------------------------------- measurement helpers


def _as_tuple(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def _tensors(value) -> list:
    torch = import_torch()
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _storage_key(tensor):
    try:
        storage = tensor.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError):  # e.g. tensors without storage
        return id(tensor), tensor.numel() * tensor.element_size()


def _sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _detached(torch, value, fqn: str, layer):
    """A layer's output as the next layer's input, detached: a tensor, or
    tuples and lists of them (an LSTM's ``(out, (h, c))``), ``None`` kept.

    Raises:
        InputError: anything else (a HuggingFace model's output object, a
            dict): the chain passes tensors from layer to layer."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    if value is None:
        return None
    if isinstance(value, (tuple, list)):
        return type(value)(_detached(torch, v, fqn, layer) for v in value)
    hint = (": for a HuggingFace model, profile its layers from the config (--hf-config config.json)"
            if hasattr(value, "to_tuple") else "")
    raise InputError(f"layer {fqn!r} ({type(layer).__name__}) returns a {type(value).__name__}, not tensors: "
                     f"pipesearch profiles chains whose layers pass tensors (or tuples of them) on{hint}")


#: the message of torch's refusal of an in-place operation on a leaf that requires grad (the profiler's own
#: input to a layer: the layer is then timed on a copy of it, which is no leaf)
_IN_PLACE_ON_LEAF = "a leaf Variable that requires grad is being used in an in-place operation"


def _call_inputs(torch, inputs: tuple, copy: bool) -> tuple:
    """``inputs`` as a layer is called with them: with ``copy``, each
    tensor that requires grad cloned (a non-leaf, which an in-place layer,
    ``nn.ReLU(inplace=True)``, may modify; its gradient still reaches the
    input)."""
    if not copy:
        return inputs
    return tuple(x.clone() if isinstance(x, torch.Tensor) and x.requires_grad else x for x in inputs)


def _prepare_inputs(torch, inputs: tuple, requires_grad: bool) -> tuple:
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            x = x.detach()
            if requires_grad and x.is_floating_point():
                x.requires_grad_(True)
        out.append(x)
    return tuple(out)


def _saved_bytes(torch, layer, inputs: tuple) -> int:
    """Bytes of the distinct storages autograd saves for backward in one
    forward of ``layer`` (parameters excluded)."""
    params = {_storage_key(p)[0] for p in layer.parameters()}
    seen: dict = {}

    def pack(tensor):
        key = _storage_key(tensor)
        if key[0] not in params:
            seen[key[0]] = max(seen.get(key[0], 0), key[1])
        return tensor

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = layer(*inputs)
    del out
    return sum(seen.values())


def _shared_saved_bytes(torch, before, before_inputs: tuple, layer) -> int:
    """Bytes of the distinct storages that both ``before`` (run on
    ``before_inputs``) and ``layer`` (run on its output) save for backward,
    parameters excluded: what a stage holding both keeps once."""
    params = {_storage_key(p)[0] for p in (*before.parameters(), *layer.parameters())}
    seen: tuple[dict, dict] = ({}, {})
    which = [0]
    alive = []  # every saved tensor held until both layers ran: a freed one's address is never met again

    def pack(tensor):
        key = _storage_key(tensor)
        alive.append(tensor)
        if key[0] not in params:
            kept = seen[which[0]]
            kept[key[0]] = max(kept.get(key[0], 0), key[1])
        return tensor

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = before(*before_inputs)
        which[0] = 1
        out = layer(*_as_tuple(out))
    del out, alive
    return sum(min(seen[0][k], seen[1][k]) for k in seen[0].keys() & seen[1].keys())


def _time_once(torch, layer, inputs: tuple, device, clock: Callable[[], float],
               copy: bool = False) -> tuple[float, float, Any]:
    """One forward and one backward of ``layer``: (forward s, backward s, output).

    On a CUDA device the times are CUDA events recorded around the forward
    and the backward on the current stream (the GPU's own clock, not the
    host's); elsewhere ``clock`` readings around synchronized calls.
    ``copy``: the layer works in place on its input, which is cloned before
    the forward (:func:`_call_inputs`; the backward then holds the clone's,
    one copy of the input's gradient)."""
    if device.type == "cuda":
        return _time_once_cuda(torch, layer, _call_inputs(torch, inputs, copy))
    called = _call_inputs(torch, inputs, copy)
    _sync(torch, device)
    t0 = clock()
    out = layer(*called)
    _sync(torch, device)
    t1 = clock()
    outs = [t for t in _tensors(out) if t.requires_grad]
    if outs:
        torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
    _sync(torch, device)
    t2 = clock()
    for x in inputs:
        if isinstance(x, torch.Tensor):
            x.grad = None
    return t1 - t0, t2 - t1, out


def _time_once_cuda(torch, layer, inputs: tuple) -> tuple[float, float, Any]:
    start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    start.record()
    out = layer(*inputs)
    mid.record()
    outs = [t for t in _tensors(out) if t.requires_grad]
    if outs:
        torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
    end.record()
    end.synchronize()
    for x in inputs:
        if isinstance(x, torch.Tensor):
            x.grad = None
    return start.elapsed_time(mid) / 1e3, mid.elapsed_time(end) / 1e3, out  # elapsed_time is in ms


#: what a layer may raise on an input it cannot take (an IndexError: token ids past an embedding)
LAYER_ERRORS = (RuntimeError, TypeError, ValueError, IndexError)


def _layer_error(torch, fqn, layer, inputs, exc, chained: bool = False) -> InputError:
    """A layer's failure, naming it and its input; ``chained``: its input
    was the previous layer's output (a model that is not a chain fails so)."""
    shapes = ", ".join(str(tuple(x.shape)) for x in inputs if isinstance(x, torch.Tensor))
    hint = ("; its input is the previous child's output (pipesearch profiles and splits chains): a model whose "
            "forward branches, skips or reorders its children cannot be split this way") if chained else ""
    if not chained and isinstance(layer, torch.nn.Embedding) and any(
            isinstance(x, torch.Tensor) and x.is_floating_point() for x in inputs):
        hint = ("; the first layer is an Embedding, which takes token ids: add --input-dtype long "
                f"--vocab-size {layer.num_embeddings}")
    return InputError(f"layer {fqn!r} ({type(layer).__name__}) failed on input of shape "
                      f"{shapes}: {exc}{hint}".replace("\n", " "))


# ---------------------------------------------------------------- public API


CLOCKS = ("auto", "cpu", "wall")


def _check_chain(torch, model, layers, inputs: tuple) -> None:
    """Refuse a model whose layers, run one after another, do not compute
    what its own forward does (a child used twice or in another order, a
    residual around children): a plan would split another model. Compared
    in eval mode (no dropout) without gradients, both runs from the same
    random seed (a child that draws noise draws the same); a model whose
    own forward does not take the input alone is not checked.

    Raises:
        InputError: the chained output differs from ``model(*inputs)``.
    """
    was_training = model.training
    model.eval()
    devices = [inputs[0].device] if inputs and getattr(inputs[0], "is_cuda", False) else []
    try:  # both runs draw the same random numbers (a child that adds noise), the caller's generator untouched
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            torch.manual_seed(0)
            try:
                whole = _tensors(model(*inputs))
            except LAYER_ERRORS:
                return
            torch.manual_seed(0)
            x = inputs
            for _, layer in layers:
                x = _as_tuple(layer(*x))
            chained = _tensors(x)
    except LAYER_ERRORS:
        return  # a layer that fails on its input is reported by the profiling pass, with its name
    finally:
        model.train(was_training)
    same = len(whole) == len(chained) and all(
        a.shape == b.shape and bool(torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-5))
        for a, b in zip(whole, chained))
    if not same:
        names = ", ".join(fqn for fqn, _ in layers)
        raise InputError(f"the model's layers run in order ({names}) do not compute what its forward does "
                         f"(a child used twice or out of order, or a connection around children): pipesearch "
                         f"profiles and splits chains; write the model as an nn.Sequential of its stages' parts "
                         f"or list its children in the order forward runs them")


def profile_module(model, example_input, *, batch_size: int, warmup: int = 3, repeats: int = 10,
                   device: str = "cpu", name: str | None = None, num_threads: int | None = 1,
                   clock: str = "auto", source: str = "", device_name: str | None = None,
                   timer: Callable[[], float] | None = None) -> ModelProfile:
    """Profile ``model`` layer by layer (see the module doc for what is measured).

    Args:
        model: an ``nn.Module`` that runs as a chain of layers (see
            :func:`model_layers`).
        example_input: the input of the first layer (a tensor or a tuple of
            tensors), batch dimension first, of ``batch_size`` samples.
        batch_size: samples in ``example_input`` (the profile's batch size).
        warmup, repeats: runs discarded, then runs whose median is kept.
        device: where to run (``"cpu"``; ``"cuda"`` or ``"cuda:N"`` times
            with CUDA events). Also recorded as the profile's device, unless
            ``device_name`` is given.
        name: the profile's model name (default: the model's class name).
        num_threads: intra-op threads during measurement (default 1, restored
            afterwards; ``None`` leaves torch's setting alone).
        clock: ``"wall"`` (``time.perf_counter``), ``"cpu"`` (the calling
            thread's CPU time, ``time.thread_time``: with one intra-op thread
            on CPU, forward and CPU autograd both run in the calling thread,
            so this is the compute time without the time the thread waited
            for a core on a busy host) or ``"auto"``: ``"cpu"`` on a CPU
            device with ``num_threads=1``, else ``"wall"``.
        source: provenance text stored with the profile.
        device_name: the device recorded in the profile (a catalog device
            name such as ``"h100-80gb"``, so that plans on other device kinds
            are rescaled and warned about); default ``device``.
        timer: a clock function (seconds) that replaces ``clock`` on a
            non-CUDA device (tests inject a fake one); default none.

    Returns:
        A :class:`ModelProfile` at ``batch_size`` with ``profiled_device =
        device`` and ``bytes_per_param`` the parameters' element size.

    Raises:
        InputError: torch missing, not a module, no layers, a batch size or
            repeat count < 1, or a layer that fails to run on its input.
    """
    torch = import_torch()
    if batch_size < 1:
        raise InputError(f"batch size {batch_size} must be >= 1")
    if repeats < 1 or warmup < 0:
        raise InputError(f"repeats {repeats} must be >= 1 and warmup {warmup} >= 0")
    if clock not in CLOCKS:
        raise InputError(f"clock {clock!r}: expected one of {', '.join(CLOCKS)}")
    layers = model_layers(model)
    dev = torch.device(device)
    if clock == "auto":
        clock = "cpu" if dev.type == "cpu" and num_threads == 1 else "wall"
    if clock == "cpu" and (dev.type != "cpu" or num_threads != 1):
        raise InputError("clock 'cpu' measures one thread: it needs device 'cpu' and num_threads=1")
    if timer is None:
        timer = time.thread_time if clock == "cpu" else time.perf_counter
    model = model.to(dev)
    inputs = tuple(x.to(dev) if isinstance(x, torch.Tensor) else x for x in _as_tuple(example_input))
    _check_chain(torch, model, layers, inputs)
    model.train()
    params = [p for p in model.parameters()]
    bytes_per_param = float(params[0].element_size()) if params else 4.0
    old_threads = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    out_layers: list[Layer] = []
    try:
        # 1. each layer's input (a no-grad pass down the chain), output and saved bytes
        layer_inputs, outputs, saved, in_place = [], [], [], []
        for index, (fqn, layer) in enumerate(layers):
            args = _prepare_inputs(torch, inputs, requires_grad=index > 0)
            copy = False
            try:
                try:
                    saved.append(_saved_bytes(torch, layer, args))
                except RuntimeError as exc:  # an in-place layer on the profiler's leaf input: on a copy of it
                    if _IN_PLACE_ON_LEAF not in str(exc):
                        raise
                    copy = True
                    saved.append(_saved_bytes(torch, layer, _call_inputs(torch, args, True)))
                with torch.no_grad():
                    out = layer(*_call_inputs(torch, args, copy))
            except LAYER_ERRORS as exc:
                raise _layer_error(torch, fqn, layer, args, exc, chained=index > 0) from None
            layer_inputs.append(args)
            in_place.append(copy)
            outputs.append(float(_nbytes(_tensors(out))))
            inputs = tuple(_detached(torch, t, fqn, layer) for t in _as_tuple(out))
            del out
        # the storages each layer saves that the layer before it saves too (a forward of the two in a row)
        shared = [0] + [_shared_saved_bytes(torch, layers[k - 1][1], _call_inputs(torch, layer_inputs[k - 1], True),
                                            layers[k][1]) for k in range(1, len(layers))]
        # 2. timing, interleaved: every pass times every layer once, so a burst of
        #    other work on the host slows one pass (dropped by the median), not one layer
        fwd: list[list[float]] = [[] for _ in layers]
        bwd: list[list[float]] = [[] for _ in layers]
        for k in range(warmup + repeats):
            for index, (fqn, layer) in enumerate(layers):
                try:
                    f, b, out = _time_once(torch, layer, layer_inputs[index], dev, timer, in_place[index])
                except LAYER_ERRORS as exc:
                    raise _layer_error(torch, fqn, layer, layer_inputs[index], exc, chained=index > 0) from None
                del out
                if k >= warmup:
                    fwd[index].append(f)
                    bwd[index].append(b)
        own, tied = _own_param_bytes(layers)
        for index, (fqn, layer) in enumerate(layers):
            out_layers.append(Layer(
                name=fqn, fwd_s=statistics.median(fwd[index]), bwd_s=statistics.median(bwd[index]),
                param_bytes=own[index],
                output_bytes=outputs[index],
                saved_bytes=float(saved[index]),
                shared_saved_bytes=float(shared[index]) if shared[index] else None,
            ))
    finally:
        for p in model.parameters():
            p.grad = None
        if num_threads is not None:
            torch.set_num_threads(old_threads)
    threads = f"{num_threads} thread(s)" if num_threads is not None else f"{old_threads} threads"
    timing = "CUDA events" if dev.type == "cuda" else f"{clock} clock"
    note = (f"pipesearch profile: torch {torch.__version__}, {device}, {threads}, {timing}, "
            f"median of {repeats} runs after {warmup} warm-up runs (dropped)")
    return ModelProfile(
        name=name or type(model).__name__,
        layers=tuple(out_layers),
        profiled_batch_size=int(batch_size),
        profiled_device=device_name or device,
        bytes_per_param=bytes_per_param,
        source="\n".join(s for s in (source, note) if s),
        tied_param_bytes=tied,
    )


def _own_param_bytes(layers) -> tuple[list[float], float]:
    """Each layer's parameter bytes with a parameter shared by several
    layers (a tied embedding and LM head) counted once, on the first that
    uses it; and the bytes the last layer shares with the first (the
    profile's ``tied_param_bytes``: a stage holding the last layer but not
    the first keeps a copy of them)."""
    seen: set[int] = set()
    own = []
    for _, layer in layers:
        total = 0.0
        for p in layer.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel() * p.element_size()
        own.append(float(total))
    first = {id(p) for p in layers[0][1].parameters()}
    tied = float(sum(p.numel() * p.element_size() for p in layers[-1][1].parameters() if id(p) in first)) \
        if len(layers) > 1 else 0.0
    return own, tied


# ---------------------------------------------------------------- several batch sizes


def fit_fixed_per_sample(batch_sizes, times_s) -> tuple[float, float]:
    """Least-squares fit ``t(b) = fixed + per_sample * b`` with both parts >= 0.

    Args:
        batch_sizes: ``(n,)`` batch sizes, at least two distinct values.
        times_s: ``(n,)`` measured seconds at those sizes.

    Returns:
        ``(fixed_s, per_sample_s)``: the unconstrained least-squares line
        (``numpy.linalg.lstsq`` on the columns ``1, b``) when both parts are
        >= 0, else the better of the two one-parameter fits on the boundary
        (``fixed = 0``: ``per_sample = sum(b t) / sum(b^2)``; ``per_sample =
        0``: ``fixed = mean(t)``), which is the non-negative least-squares
        optimum of two unknowns (the objective is convex; its minimum over
        the quadrant lies inside or on an edge).

    Raises:
        InputError: fewer than two distinct batch sizes, a size < 1, or
            lengths that differ.
    """
    import numpy as np

    b = np.asarray(batch_sizes, dtype=float)
    t = np.asarray(times_s, dtype=float)
    if b.shape != t.shape or b.ndim != 1:
        raise InputError(f"fit: {b.size} batch sizes but {t.size} times; give one time per batch size")
    if np.any(b < 1) or len(set(b.tolist())) < 2:
        raise InputError(f"batch sizes {','.join(f'{x:g}' for x in b)}: a fixed + per-sample fit needs at least "
                         "two distinct sizes >= 1, e.g. --batch-sizes 1,2,4")
    (fixed, per_sample), *_ = np.linalg.lstsq(np.column_stack([np.ones_like(b), b]), t, rcond=None)
    if fixed >= 0 and per_sample >= 0:
        return float(fixed), float(per_sample)
    slope = max(0.0, float(b @ t / (b @ b)))
    level = max(0.0, float(t.mean()))
    through_origin = float(np.sum((t - slope * b) ** 2))
    flat = float(np.sum((t - level) ** 2))
    return (0.0, slope) if through_origin <= flat else (level, 0.0)


def fit_profiles(profiles: list[ModelProfile], note: str = "") -> ModelProfile:
    """One profile with fixed + per-sample layer times from profiles of the
    same model at two or more batch sizes.

    Per layer and direction (forward, backward), :func:`fit_fixed_per_sample`
    over the profiles' batch sizes; the result is at the largest batch size
    ``B``: ``fwd_s = fixed + per_sample * B`` (the fit's value there, so
    :meth:`ModelProfile.layer_times_at` gives the fit at every size),
    ``fwd_fixed_s = fixed`` (the same for backward); bytes are those measured
    at ``B``. A fixed part below 1 ns (``limits.MIN_LAYER_S``) is taken as 0.

    Raises:
        InputError: fewer than two distinct batch sizes, or profiles whose
            layer names differ.
    """
    if len({p.profiled_batch_size for p in profiles}) < 2:
        sizes = ",".join(str(p.profiled_batch_size) for p in profiles)
        raise InputError(f"batch sizes {sizes or '(none)'}: a fixed + per-sample fit needs at least two "
                         "distinct sizes, e.g. --batch-sizes 1,2,4")
    names = [lay.name for lay in profiles[0].layers]
    if any([lay.name for lay in p.layers] != names for p in profiles):
        raise InputError("fit: the profiles have different layers; profile one model at every batch size")
    top = max(profiles, key=lambda p: p.profiled_batch_size)
    sizes = [p.profiled_batch_size for p in profiles]
    layers = []
    for index, layer in enumerate(top.layers):
        parts = {}
        for key in ("fwd_s", "bwd_s"):
            fixed, per_sample = fit_fixed_per_sample(sizes, [getattr(p.layers[index], key) for p in profiles])
            fixed = 0.0 if fixed < MIN_LAYER_S else fixed  # below 1 ns: noise (and not a profile CSV time)
            parts[key], parts[key[:-2] + "_fixed_s"] = fixed + per_sample * top.profiled_batch_size, fixed
        layers.append(replace(layer, **parts))
    return replace(top, layers=tuple(layers), source="\n".join(x for x in (top.source, note) if x))


def profile_module_at_sizes(model, make_input: Callable[[int], Any], batch_sizes, **kwargs) -> ModelProfile:
    """:func:`profile_module` at every size of ``batch_sizes`` (warm-up runs
    dropped at each), fitted by :func:`fit_profiles`.

    Args:
        make_input: batch size -> the first layer's input of that many samples.
        batch_sizes: two or more distinct sizes >= 1.
        kwargs: passed to :func:`profile_module` (not ``batch_size``).

    Returns:
        A :class:`ModelProfile` at the largest size with ``fwd_fixed_s`` and
        ``bwd_fixed_s`` on every layer.

    Raises:
        InputError: fewer than two distinct sizes, a size < 1, or any error
            of :func:`profile_module`.
    """
    sizes = sorted(set(int(b) for b in batch_sizes))
    if len(sizes) < 2 or sizes[0] < 1:
        raise InputError(f"batch sizes {','.join(str(b) for b in batch_sizes)}: a fixed + per-sample fit needs "
                         "at least two distinct sizes >= 1, e.g. --batch-sizes 1,2,4")
    profiles = [profile_module(model, make_input(b), batch_size=b, **kwargs) for b in sizes]
    note = (f"pipesearch profile: per-layer times fitted as fixed + per_sample * batch over batch sizes "
            f"{','.join(map(str, sizes))} (least squares, both parts >= 0)")
    return fit_profiles(profiles, note)


def load_factory(spec: str) -> Callable[[], Any]:
    """The callable named by ``MODULE:FACTORY``.

    ``MODULE`` is a dotted module path importable from the current directory
    (``mypkg.models``) or a Python file path (``models/small.py``).

    Raises:
        InputError: malformed spec, module not importable, no such attribute,
            not callable.
    """
    module_text, sep, attr = spec.rpartition(":")
    if not sep or not module_text or not attr:
        raise InputError(f"model {spec!r}: expected MODULE:FACTORY, e.g. mypkg.models:make_model "
                         "or path/to/models.py:make_model")
    path = Path(module_text)
    try:
        if module_text.endswith(".py") or "/" in module_text or path.is_file():
            if path.is_dir():
                raise InputError(f"model {spec!r}: {module_text!r} is a directory; give a .py file or a module path")
            if not path.is_file():
                raise InputError(f"model {spec!r}: file {module_text!r} does not exist")
            mod_name = f"_pipesearch_user_{abs(hash(str(path.resolve())))}"
            loader_spec = importlib.util.spec_from_file_location(mod_name, path)
            if loader_spec is None or loader_spec.loader is None:
                raise InputError(f"model {spec!r}: cannot load {module_text!r} as a Python file")
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[mod_name] = module
            parent = str(path.resolve().parent)
            if parent not in sys.path:
                sys.path.insert(0, parent)
            loader_spec.loader.exec_module(module)
        else:
            if "" not in sys.path and "." not in sys.path:
                sys.path.insert(0, "")
            module = importlib.import_module(module_text)
    except InputError:
        raise
    except ImportError as exc:
        raise InputError(f"model {spec!r}: cannot import {module_text!r} ({exc})") from None
    except SystemExit as exc:
        raise InputError(f"model {spec!r}: importing {module_text!r} called sys.exit({exc.code!r})") from None
    except Exception as exc:  # noqa: BLE001 - user code failing at import time
        raise InputError(f"model {spec!r}: importing {module_text!r} failed: "
                         f"{type(exc).__name__}: {exc}".replace("\n", " ")) from None
    factory = getattr(module, attr, None)
    if factory is None:
        raise InputError(f"model {spec!r}: module {module_text!r} has no attribute {attr!r}")
    if not callable(factory):
        raise InputError(f"model {spec!r}: {attr!r} is a {type(factory).__name__}, not a callable")
    return factory


def build_model(factory: Callable[[], Any], spec: str = "factory"):
    """``factory()``, checked to be an ``nn.Module``.

    Raises:
        InputError: torch missing, the factory raising, or returning a non-module.
    """
    torch = import_torch()
    try:
        model = factory()
    except SystemExit as exc:
        raise InputError(f"model {spec!r}: the factory called sys.exit({exc.code!r})") from None
    except Exception as exc:  # noqa: BLE001 - user code
        raise InputError(f"model {spec!r}: the factory raised {type(exc).__name__}: {exc}".replace("\n", " ")) from None
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"model {spec!r}: the factory returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def torch_dtype(name: str):
    """The torch dtype named ``name`` (one of :data:`DTYPES`)."""
    torch = import_torch()
    if name not in DTYPES:
        raise InputError(f"dtype {name!r}: expected one of {', '.join(DTYPES)}")
    return getattr(torch, name)


# ---------------------------------------------------------------- HuggingFace causal LMs


def hf_causal_lm_chain(model):
    """A HuggingFace ``*ForCausalLM`` (Llama-style: ``model.embed_tokens``,
    ``model.layers``, ``model.norm``, ``model.rotary_emb``, ``lm_head``) as an
    ``nn.Sequential`` chain of one-tensor layers, for profiling and for
    pipeline stages: ``embed_tokens`` (token ids -> hidden states),
    ``layers_<i>`` (the decoder layer with its rotary position embeddings
    computed from the sequence length; causal attention, no padding mask),
    ``lm_head`` (final norm and output projection -> logits). The names are
    the chain's own children, so a plan's layer names are the FQNs a
    pipeline stage takes with ``get_submodule``. The chain computes what the model's own
    forward computes for unpadded token ids (the tests compare the logits).

    Raises:
        InputError: torch or transformers missing, or a model without those
            modules.
    """
    torch = import_torch()
    nn = torch.nn
    inner = getattr(model, "model", None)
    need = ("embed_tokens", "layers", "norm", "rotary_emb")
    if inner is None or not all(hasattr(inner, n) for n in need) or not hasattr(model, "lm_head"):
        raise InputError(f"cannot chain {type(model).__name__}: expected a causal LM with model.embed_tokens, "
                         f"model.layers, model.norm, model.rotary_emb and lm_head (Llama, Qwen2, Mistral ...)")

    class Block(nn.Module):
        def __init__(self, layer, rotary):
            super().__init__()
            self.layer = layer
            self._rotary = [rotary]  # shared, not a parameter owner of this block

        def forward(self, h):
            pos = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
            cos_sin = self._rotary[0](h, pos)
            out = self.layer(h, attention_mask=None, position_ids=pos, position_embeddings=cos_sin)
            return out[0] if isinstance(out, tuple) else out

    chain = nn.Sequential()
    chain.add_module("embed_tokens", inner.embed_tokens)
    for i, layer in enumerate(inner.layers):
        chain.add_module(f"layers_{i:02d}", Block(layer, inner.rotary_emb))
    chain.add_module("lm_head", nn.Sequential(inner.norm, model.lm_head))
    return chain


def hf_model_from_config(path: str | Path, seed: int = 0):
    """A randomly initialised ``AutoModelForCausalLM`` built from a HuggingFace
    ``config.json`` (no weights are downloaded), as :func:`hf_causal_lm_chain`.

    Raises:
        InputError: transformers missing, an unreadable config, or a model
            that does not chain.
    """
    torch = import_torch()
    try:
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError as exc:
        raise InputError(f"--hf-config needs transformers, which is not importable ({exc}); "
                         f"pip install transformers") from None
    from transformers.utils import logging as hf_logging

    p = Path(path)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its advice ("add is_decoder=True") is no line of ours: the error says it
    state = torch.random.get_rng_state()
    try:
        try:
            cfg = AutoConfig.from_pretrained(str(p))  # a config file of any name, or a directory with config.json
        except Exception as exc:  # noqa: BLE001 - transformers' own checks of the config's values
            raise InputError(f"--hf-config {path}: transformers cannot read it ({type(exc).__name__}: "
                             f"{quoted_cause(str(exc))})") from None
        torch.manual_seed(seed)
        try:
            model = AutoModelForCausalLM.from_config(cfg)
        except Exception as exc:  # noqa: BLE001 - a config transformers reads but cannot build
            raise InputError(f"--hf-config {path}: no causal language model builds from it ({type(exc).__name__}: "
                             f"{quoted_cause(str(exc))})") from None
    finally:
        torch.random.set_rng_state(state)
        hf_logging.set_verbosity(verbosity)
    return hf_causal_lm_chain(model)
