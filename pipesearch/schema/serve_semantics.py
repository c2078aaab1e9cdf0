"""The checks of a serving plan document (``pipesearch.serve/1``) that its
JSON Schema (``serve-1.schema.json``) cannot express.

Run on a document that already follows the schema
(:func:`pipesearch.schema.serve_schema_problems`), :func:`serve_semantic_problems`
checks every plan against the document's own inputs and the relations its
figures obey (docs/formats.md, "Serving plans JSON"; docs/serving_costs.md):

* the cluster's groups lay its devices out node by node
  (:func:`pipesearch.schema.semantics.cluster_group_problems`);
* ``layers_per_stage`` has ``pp`` entries adding up to
  ``inputs.model.num_layers`` (so does ``engine_default.layers_per_stage``),
  and the ``pp`` stages follow it: stage ``i`` has index ``i``, the decoder
  layers ``[start, end)`` of the running sums, the embedding on stage 0
  and the head on the last;
* ``tp x pp x replicas`` devices fit the cluster, and replica 0's stages
  each list ``tp`` distinct existing device ids of one node (where ``tp``
  fits a node), no id in two stages;
* ``kv_pool_tokens`` is the least stage's ``kv_tokens`` (every stage holds
  the KV of every running sequence), ``batch`` is at most ``max_batch`` and
  ``max_num_seqs``;
* ``predicted``: the cycle is ``max(ring_s, m x bottleneck_stage_s)`` with
  ``m = min(pp, batch)`` micro-batches in flight, output tokens/s are the
  replica's times ``replicas``, the TPOT is null exactly when a request
  decodes nothing (``output_len`` 1); ``simulated`` (when present): the
  total output tokens/s at least the busiest replica's;
* ``engine_default.refusal`` is null exactly when its batch and rate are
  given;
* the planned engine's command (``inputs.engine.name``) is there, and
  every engine command (``exports``) runs the plan: each setting of
  :func:`pipesearch.serve.export.engine_settings` (the degrees, the running
  limit, the memory share, the context ``input_len + output_len``, the step
  budget, fp8 weights and KV cache, the multi-node flags, ``--dtype half``
  on devices without bf16) has the value the plan and inputs give, however
  often and in whichever spelling (``--flag value``, ``--flag=value``, an
  alias) ``argv`` writes it (the engine takes the last), and no other of
  those settings appears; for the engine not planned for, its running limit
  is at most the plan's and its memory share and step budget (its own
  defaults) are not checked; the layer-partition variable is
  ``layers_per_stage`` (absent at pp 1), ``command`` is the variable and
  ``argv`` as a shell reads them, ``nodes_per_replica`` the nodes ``tp x
  pp`` devices take and at most ``replicas`` replicas run;
* plan ranks are 1, 2, ... in order.

Not checked (no formula of the file's own fields gives them): the stages'
weights, KV tokens and step times, the batch against the pool, the
predicted rates and latencies against the batch, and the simulated run;
``pipesearch serve`` with the file's inputs recomputes them.
"""

from __future__ import annotations

import shlex
from typing import Iterator

from ..serve.export import ENGINE_FLAGS, FLAG_ALIASES, PARTITION_ENV, engine_settings
from ..types import MIN_BF16_CAPABILITY
from . import Problem, check_record, show
from .semantics import cluster_group_problems


def serve_semantic_problems(doc: dict) -> list[Problem]:
    """Every problem of a schema-valid serving plan document beyond the
    schema (module docstring), in document order."""
    inputs = doc["inputs"]
    out = cluster_group_problems(inputs["cluster"])
    for k, plan in enumerate(doc["plans"]):
        out += _plan_problems(plan, f"plans[{k}]", inputs)
    ranks = [p["rank"] for p in doc["plans"]]
    if ranks != list(range(1, len(ranks) + 1)):
        out.append(Problem("plans", f"ranks {ranks} found, 1 .. {len(ranks)} in order expected; give the plans "
                                    "their ranks in order"))
    return out


#: what a plan's split problem leaves for later, said with it
LATER = " (the plan's devices, pool, rates and engine commands are checked once its split and stages agree)"


def _plan_problems(plan: dict, where: str, inputs: dict) -> list[Problem]:
    out = list(_split(plan, where, inputs["model"]["num_layers"]))
    if out:  # the rest reads the stages
        return out
    out += _devices(plan, where, inputs["cluster"]["devices"], _per_node(inputs["cluster"]))
    out += _pool(plan, where)
    out += _predicted(plan, where, inputs["workload"])
    exports, planned = plan.get("exports"), inputs["engine"]["name"]
    if exports is not None and "refused" in exports.get(planned, {"refused": ""}):
        out.append(Problem(f"{where}.exports.{planned}", f"{show(exports.get(planned, '(missing)'))} found, the "
                                                         f"command of the engine planned for (inputs.engine.name "
                                                         f"{planned!r}) expected; re-plan, or restore it"))
    for engine, export in (exports or {}).items():
        if "refused" not in export:
            out += _export(plan, f"{where}.exports.{engine}", engine, export, inputs)
    return out


def _split(plan: dict, where: str, num_layers: int) -> Iterator[Problem]:
    pp = plan["parallelism"]["pp"]
    splits = {"layers_per_stage": plan["layers_per_stage"]}
    if "engine_default" in plan:
        splits["engine_default.layers_per_stage"] = plan["engine_default"]["layers_per_stage"]
    for key, split in splits.items():
        if len(split) != pp or sum(split) != num_layers:
            yield Problem(f"{where}.{key}", f"{show(split)} found, {pp} stage(s) (parallelism.pp) of the model's "
                                            f"{num_layers} decoder layers (inputs.model.num_layers) expected; "
                                            f"re-plan, or restore the field{LATER}")
            return
    stages, start = plan["stages"], 0
    if len(stages) != pp:
        yield Problem(f"{where}.stages", f"{len(stages)} stage(s) found, {pp} expected (parallelism.pp){LATER}")
        return
    for i, (st, n) in enumerate(zip(stages, plan["layers_per_stage"])):
        expect = {"index": i, "layers": [start, start + n], "embedding": i == 0, "head": i == pp - 1}
        for key, value in expect.items():
            if st[key] != value:
                yield Problem(f"{where}.stages[{i}].{key}", f"{show(st[key])} found, {show(value)} expected (stage "
                                                            f"{i} of layers_per_stage {plan['layers_per_stage']}: the "
                                                            "embedding on the first stage, the head on the last); "
                                                            f"re-plan, or restore the field{LATER}")
                return
        start += n


def _devices(plan: dict, where: str, num_devices: int, per_node: int) -> Iterator[Problem]:
    par = plan["parallelism"]
    tp, pp, replicas = par["tp"], par["pp"], par["replicas"]
    if tp * pp * replicas > num_devices:
        yield Problem(f"{where}.parallelism", f"tp {tp} x pp {pp} x replicas {replicas} = {tp * pp * replicas} "
                                              f"devices, the cluster has {num_devices} (inputs.cluster.devices)")
        return
    owner: dict[int, int] = {}
    for i, st in enumerate(plan["stages"]):
        w, devices = f"{where}.stages[{i}].devices", st["devices"]
        if len(devices) != tp:
            yield Problem(w, f"{devices} lists {len(devices)} device id(s), parallelism.tp {tp} expected")
            return
        for d in devices:
            if d >= num_devices:
                yield Problem(w, f"{devices}: device {d} does not exist; the cluster (inputs.cluster.devices) has "
                                 f"{num_devices} devices, ids 0 .. {num_devices - 1}")
                return
            if d in owner:
                yield Problem(w, f"{devices}: device {d} already serves stages[{owner[d]}]; each device serves "
                                 "one stage")
                return
            owner[d] = i
        if tp <= per_node and len({d // per_node for d in devices}) > 1:
            yield Problem(w, f"{devices}: the stage's tensor-parallel group spans nodes of {per_node} devices; a "
                             "group stays in one node (the engines' tensor parallelism runs over its NVLink or "
                             "PCIe)")
            return


def _pool(plan: dict, where: str) -> Iterator[Problem]:
    least = min(st["kv_tokens"] for st in plan["stages"])
    if plan["kv_pool_tokens"] != least:
        yield Problem(f"{where}.kv_pool_tokens", f"{plan['kv_pool_tokens']} found, {least} expected (the least "
                                                 "stage's kv_tokens: every stage holds the KV of every running "
                                                 "sequence); re-plan, or restore the field")
    for key in ("max_batch", "max_num_seqs"):
        if key in plan and plan["batch"] > plan[key]:
            yield Problem(f"{where}.batch", f"{plan['batch']} found, at most {key} {plan[key]} expected; re-plan, "
                                            "or restore the field")
    default = plan.get("engine_default")
    if default is not None and (default["refusal"] is None) != (default.get("batch") is not None
                                                                 and default.get("output_tokens_per_s") is not None):
        yield Problem(f"{where}.engine_default", f"refusal {show(default['refusal'])} with batch "
                                                 f"{show(default.get('batch'))} and output_tokens_per_s "
                                                 f"{show(default.get('output_tokens_per_s'))}: a refusal has no "
                                                 "batch or rate, a plan both; restore the fields")


def _predicted(plan: dict, where: str, workload: dict) -> Iterator[Problem]:
    pred, par, w = plan["predicted"], plan["parallelism"], f"{where}.predicted"
    if "ring_s" in pred and "bottleneck_stage_s" in pred:
        m = min(par["pp"], plan["batch"])
        yield from check_record(f"{w}.cycle_s", pred["cycle_s"], max(pred["ring_s"], m * pred["bottleneck_stage_s"]),
                                f"max(ring_s, {m} micro-batches x bottleneck_stage_s)")
    yield from check_record(f"{w}.output_tokens_per_s", pred["output_tokens_per_s"],
                            pred["output_tokens_per_s_per_replica"] * par["replicas"],
                            f"output_tokens_per_s_per_replica x {par['replicas']} replicas")
    decodes = workload["output_len"] > 1
    if (pred["tpot_s"] is None) == decodes:
        found = "null" if pred["tpot_s"] is None else show(pred["tpot_s"])
        why = "requests decode" if decodes else "no token is decoded"
        yield Problem(f"{w}.tpot_s", f"{found} found, {'a time' if decodes else 'null'} expected "
                                     f"(inputs.workload.output_len {workload['output_len']}: {why})")
    sim = plan.get("simulated")
    if sim and sim["total_output_tokens_per_s"] < sim["output_tokens_per_s"] * (1 - 1e-9):
        yield Problem(f"{where}.simulated.total_output_tokens_per_s",
                      f"{sim['total_output_tokens_per_s']!r} found, at least the busiest replica's "
                      f"{sim['output_tokens_per_s']!r} expected; re-plan, or restore the field")


def _per_node(cluster: dict) -> int:
    """Devices per node of a serving cluster (one device type: its first group's)."""
    groups = cluster.get("groups")
    if groups:
        return int(groups[0]["devices_per_node"])
    return max(1, cluster["devices"] // max(1, cluster.get("nodes") or 1))


def _nodes_per_replica(par: dict, cluster: dict) -> int:
    """Nodes the ``tp x pp`` devices of one replica take."""
    return -(-par["tp"] * par["pp"] // _per_node(cluster))


def _values(values: list) -> str:
    """A flag's values as a message shows them, in ``argv``'s order."""
    return " then ".join(show(v) for v in values)


def _expected_settings(plan: dict, engine: str, inputs: dict) -> tuple[list, set]:
    """``(settings, unknown)``: :func:`pipesearch.serve.export.engine_settings`
    of the plan's command for ``engine`` from the file's own fields, and the
    flags whose value the file does not fix for an engine other than the
    planned one (that engine's own memory share and step budget, and vLLM's
    chunked prefill that follows the budget; its running limit is checked
    apart: at most the plan's)."""
    par, workload, cluster = plan["parallelism"], inputs["workload"], inputs["cluster"]
    groups = cluster.get("groups") or [{}]
    capability = groups[0].get("compute_capability")
    settings = engine_settings(
        engine, tp=par["tp"], pp=par["pp"], max_num_seqs=plan.get("max_num_seqs", plan["batch"]),
        memory_fraction=inputs["engine"].get("memory_fraction", 0.9),
        max_model_len=workload["input_len"] + workload["output_len"],
        max_num_batched_tokens=plan.get("max_num_batched_tokens", 1),
        weight_dtype=workload.get("weight_dtype", "bf16"), kv_dtype=workload.get("kv_dtype", "bf16"),
        nodes=_nodes_per_replica(par, cluster),
        half=capability is not None and capability < MIN_BF16_CAPABILITY)
    flags = ENGINE_FLAGS[engine]
    unknown = {flags["dtype"]} if capability is None else set()
    budget = {flags["max_num_batched_tokens"], flags.get("chunked_prefill")} - {None}  # (the chunks follow it)
    for key, given in (("max_num_seqs", plan), ("max_num_batched_tokens", plan),
                       ("memory_fraction", inputs["engine"])):
        if key not in given:  # a file of an earlier pipesearch: what it does not record is not checked
            unknown |= budget if key == "max_num_batched_tokens" else {flags[key]}
    if engine != inputs["engine"]["name"]:
        unknown |= {flags["max_num_seqs"], flags["memory_fraction"]} | budget
    return settings, unknown


def _occurrences(argv: list, engine: str) -> dict:
    """Each engine flag of ``argv`` (also written ``--flag=value`` or as an
    alias) with its values in order (None for a flag with no value): the
    engine takes the last."""
    known = set(ENGINE_FLAGS[engine].values())
    bare = {ENGINE_FLAGS[engine].get("chunked_prefill")}
    out: dict = {}
    k = 0
    while k < len(argv):
        token = argv[k]
        name, eq, value = token.partition("=")
        name = FLAG_ALIASES[engine].get(name, name)
        if name in known:
            if not eq and name not in bare:
                value = argv[k + 1] if k + 1 < len(argv) else None
                k += 1
            out.setdefault(name, []).append(value if eq or name not in bare else None)
        k += 1
    return out


def _export(plan: dict, where: str, engine: str, export: dict, inputs: dict) -> Iterator[Problem]:
    """One engine command against the plan (module docstring)."""
    if export["engine"] != engine:
        yield Problem(f"{where}.engine", f"{show(export['engine'])} found, {engine!r} expected (its key)")
        return
    par, argv = plan["parallelism"], export["argv"]
    settings, unknown = _expected_settings(plan, engine, inputs)
    found = _occurrences(argv, engine)
    for flag, value in settings:
        if flag in unknown:
            continue
        values = found.get(flag, [])
        if not values or any(v != value for v in values):
            want = "expected" if value is None else f"{value!r} expected"
            found_text = "missing" if not values else f"{_values(values)} found"
            last = " (the engine takes the last)" if len(values) > 1 else ""
            yield Problem(f"{where}.argv", f"{flag} {found_text}, {want} (the plan and inputs it was made "
                                           f"for){last}; re-plan, or restore the command")
            return
    expected = {flag for flag, _ in settings} | unknown
    for flag in found.keys() - expected:
        yield Problem(f"{where}.argv", f"{flag} {_values(found[flag])} found, not expected "
                                       "(the plan and inputs it was made for give no such setting); re-plan, or "
                                       "restore the command")
        return
    limit, planned_limit = found.get(ENGINE_FLAGS[engine]["max_num_seqs"], []), plan.get("max_num_seqs")
    if planned_limit is not None and not (limit and all((v or "").isdigit() and int(v) <= planned_limit
                                                        for v in limit)):
        yield Problem(f"{where}.argv", f"{ENGINE_FLAGS[engine]['max_num_seqs']} "
                                       f"{_values(limit) or 'missing'} found, at most the "
                                       f"plan's max_num_seqs {planned_limit} expected; re-plan, or restore the command")
        return
    var = PARTITION_ENV[engine]
    want = {var: ",".join(map(str, plan["layers_per_stage"]))} if par["pp"] > 1 else {}
    if export["env"] != want:
        yield Problem(f"{where}.env", f"{show(export['env'])} found, {show(want)} expected (layers_per_stage "
                                      f"{plan['layers_per_stage']}); re-plan, or restore the command")
        return
    line = [*(f"{k}={v}" for k, v in export["env"].items()), *argv]
    try:
        words = shlex.split(export["command"])
    except ValueError as exc:
        words = [f"(unreadable: {exc})"]
    if words != line:
        k = next((i for i, (x, y) in enumerate(zip(words, line)) if x != y), min(len(words), len(line)))
        got = show(words[k]) if k < len(words) else "(end of the line)"
        yield Problem(f"{where}.command", f"word {k + 1}: {got} found, "
                                          f"{show(line[k]) if k < len(line) else '(end of the line)'} expected (the "
                                          "command is env then argv as a shell reads them); restore the command")
    nodes = _nodes_per_replica(par, inputs["cluster"])
    if export["nodes_per_replica"] != nodes:
        yield Problem(f"{where}.nodes_per_replica", f"{export['nodes_per_replica']} found, {nodes} expected (tp "
                                                    f"{par['tp']} x pp {par['pp']} devices, "
                                                    f"{_per_node(inputs['cluster'])} a node)")
    if export["replicas"] > par["replicas"]:
        yield Problem(f"{where}.replicas", f"{export['replicas']} found, at most parallelism.replicas "
                                           f"{par['replicas']} expected")
