"""What an inference engine does with memory and layers, per engine.

:class:`EngineSpec` holds the engine-level settings the cost model needs:
the memory fraction and how it is accounted, the KV block size, the batch
limits, the per-step overhead. :func:`engine_spec` gives the defaults of
vLLM and SGLang; :func:`default_split` the layer split each engine uses when
no partition is given.

Sources (read in the engines' source, ``docs/serving_costs.md``):

* vLLM ``vllm/distributed/utils.py::get_pp_indices``: ``L // p`` decoder
  layers per stage, the remainder one each to the stages before the last,
  counting back from the second-to-last (``partitions[-i] += 1`` for
  ``i = 2 .. r + 1``); ``VLLM_PP_LAYER_PARTITION`` overrides it and must have
  ``p`` entries summing to ``L``. KV memory: ``gpu_memory_utilization``
  (default 0.9) of the device, less weights, the activation peak of the
  profiling forward pass and non-torch memory; blocks of 16 tokens.
* SGLang ``python/sglang/srt/distributed/utils.py::get_pp_indices``:
  ``L // p`` per stage and one more each on the last ``L mod p`` stages
  (releases of 2025 on; earlier ones put the whole remainder on the last
  stage); ``SGLANG_PP_LAYER_PARTITION`` overrides it with the same checks. KV memory:
  ``mem_fraction_static`` of the device holds weights and KV pool together
  (activations live in the rest); tokens are allocated one by one (page 1).

Nominal, not measured here (calibrate with the command-line options):
``step_overhead_s`` (scheduling, sampling and the Python around one step)
and the activation estimate's budget ``max_num_batched_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import InputError

__all__ = ["ENGINES", "EngineSpec", "engine_spec", "default_split"]

ENGINES = ("vllm", "sglang")


@dataclass(frozen=True)
class EngineSpec:
    """Engine settings of a serving plan.

    Attributes:
        name: ``vllm`` or ``sglang``.
        memory_fraction: vLLM ``--gpu-memory-utilization`` (weights, KV,
            activations) or SGLang ``--mem-fraction-static`` (weights + KV).
        activation_in_budget: whether the activation peak and the memory
            reserve come out of ``memory_fraction`` (vLLM) or out of the rest
            of the device (SGLang).
        block_size_tokens: KV allocation granularity (vLLM 16, SGLang 1).
        max_num_seqs: sequences running at once per replica (vLLM
            ``--max-num-seqs``, SGLang ``--max-running-requests``).
        max_num_batched_tokens: tokens one step may hold (chunked prefill
            budget: vLLM ``--max-num-batched-tokens``, SGLang
            ``--chunked-prefill-size``).
        step_overhead_s: per-step engine time outside the kernels (scheduler,
            sampler, inputs), seconds, once per micro-batch round trip.
    """

    name: str
    memory_fraction: float
    activation_in_budget: bool
    block_size_tokens: int
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    step_overhead_s: float = 0.002


_DEFAULTS = {
    "vllm": EngineSpec("vllm", memory_fraction=0.90, activation_in_budget=True, block_size_tokens=16),
    # SGLang runs at most min(max_total_num_tokens // 2, its request pool) sequences when not told
    # (Scheduler / ModelRunner: the pool holds min(max(pool tokens / context x 512, 2048), 4096) requests,
    # 4096 wherever the KV pool holds 8 contexts or more; the pool's own bound is what the search's cap by KV
    # tokens already is)
    "sglang": EngineSpec("sglang", memory_fraction=0.85, activation_in_budget=False, block_size_tokens=1,
                         max_num_seqs=4096),
}


#: vLLM's batch limits of ``vllm serve`` by device (``EngineArgs.get_batch_defaults``:
#: at least 160 GiB, or at least 70 GiB and not an A100): (memory GiB at least, step
#: budget, running sequences), the first that applies; below them 2048 and 256
VLLM_BATCH_DEFAULTS = ((160, 16384, 1024), (70, 8192, 1024))
#: SGLang's ``--chunked-prefill-size`` when not given, by the GPU's memory
#: (``ServerArgs`` ``_handle_chunked_prefill_size`` of its 0.4 releases; later
#: ones split the tiers further): (memory GiB at least, step budget), the
#: first that applies; below them 2048 (an L4, a 4090)
SGLANG_CHUNK_DEFAULTS = ((160, 16384), (35, 8192))


def engine_spec(name: str, device=None, **overrides) -> EngineSpec:
    """The defaults of engine ``name`` with the non-None ``overrides`` applied;
    ``device`` (a :class:`~pipesearch.types.DeviceSpec`): vLLM's defaults of
    ``max_num_batched_tokens`` and ``max_num_seqs`` depend on it
    (:data:`VLLM_BATCH_DEFAULTS`: an H100 or H200 serves 8192 tokens a step
    and 1024 sequences by default, an A100 or L4 2048 and 256), and
    SGLang's step budget (:data:`SGLANG_CHUNK_DEFAULTS`: 8192 tokens on an
    A100 or H100, 2048 on an L4; its running requests 4096 on every
    device).

    Raises:
        InputError: an unknown engine, or an override out of range (names the
            option).
    """
    if name not in _DEFAULTS:
        raise InputError(f"--engine {name!r}: expected one of {', '.join(ENGINES)}")
    values = {k: v for k, v in overrides.items() if v is not None}
    base = _DEFAULTS[name]
    if name == "vllm" and device is not None:
        gib = device.memory_bytes / 2**30
        for at_least, tokens, seqs in VLLM_BATCH_DEFAULTS:
            if gib >= at_least and (at_least >= 160 or "a100" not in device.name.lower()):
                base = replace(base, max_num_batched_tokens=tokens, max_num_seqs=seqs)
                break
    if name == "sglang" and device is not None:
        gib = device.memory_bytes / 2**30
        base = replace(base, max_num_batched_tokens=next(
            (tokens for at_least, tokens in SGLANG_CHUNK_DEFAULTS if gib >= at_least), 2048))
    spec = replace(base, **values)
    if not 0 < spec.memory_fraction <= 1:
        raise InputError(f"--memory-fraction {spec.memory_fraction}: expected a number in (0, 1]")
    for key in ("block_size_tokens", "max_num_seqs", "max_num_batched_tokens"):
        if getattr(spec, key) < 1:
            raise InputError(f"--{key.replace('_', '-')} {getattr(spec, key)}: expected an integer >= 1")
    if spec.max_num_batched_tokens < 2:
        raise InputError(f"--max-num-batched-tokens {spec.max_num_batched_tokens}: a step must hold a running "
                         f"sequence's decode token and a prompt chunk's token beside it; expected at least 2")
    if not spec.step_overhead_s >= 0:
        raise InputError(f"--step-overhead-ms {spec.step_overhead_s * 1e3}: expected a number >= 0")
    return spec


def default_split(engine: str, num_layers: int, pp: int) -> tuple[int, ...]:
    """Decoder layers per stage the engine uses without a partition override
    (see the module docstring for the rule and its source)."""
    if pp < 1 or num_layers < pp:
        raise InputError(f"--pp {pp}: needs 1 <= pp <= {num_layers} (the decoder layers)")
    base, rem = divmod(num_layers, pp)
    parts = [base] * pp
    if engine == "vllm":
        for i in range(2, rem + 2):
            parts[-i] += 1
    elif engine == "sglang":
        for i in range(1, rem + 1):
            parts[-i] += 1
    else:
        raise InputError(f"--engine {engine!r}: expected one of {', '.join(ENGINES)}")
    return tuple(parts)
