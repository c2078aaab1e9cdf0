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
  each list ``tp`` distinct existing device ids, no id in two stages;
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
* every engine command (``exports``) runs the plan: its tensor- and
  pipeline-parallel flags are the plan's, its layer-partition variable is
  ``layers_per_stage`` (absent at pp 1), ``command`` is the variable and
  ``argv`` as a shell reads them, and at most ``replicas`` replicas run; the
  planned engine's (``inputs.engine.name``) running limit and step budget
  are the plan's, the other engine's running limit at most it (that engine
  sizes its own KV pool);
* plan ranks are 1, 2, ... in order.
"""

from __future__ import annotations

import shlex
from typing import Iterator

from ..serve.export import ENGINE_FLAGS, PARTITION_ENV
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


def _plan_problems(plan: dict, where: str, inputs: dict) -> list[Problem]:
    out = list(_split(plan, where, inputs["model"]["num_layers"]))
    if out:  # the rest reads the stages
        return out
    out += _devices(plan, where, inputs["cluster"]["devices"])
    out += _pool(plan, where)
    out += _predicted(plan, where, inputs["workload"])
    for engine, export in (plan.get("exports") or {}).items():
        if "refused" not in export:
            out += _export(plan, f"{where}.exports.{engine}", engine, export, inputs["engine"]["name"])
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
                                            "re-plan, or restore the field")
            return
    stages, start = plan["stages"], 0
    if len(stages) != pp:
        yield Problem(f"{where}.stages", f"{len(stages)} stage(s) found, {pp} expected (parallelism.pp)")
        return
    for i, (st, n) in enumerate(zip(stages, plan["layers_per_stage"])):
        expect = {"index": i, "layers": [start, start + n], "embedding": i == 0, "head": i == pp - 1}
        for key, value in expect.items():
            if st[key] != value:
                yield Problem(f"{where}.stages[{i}].{key}", f"{show(st[key])} found, {show(value)} expected (stage "
                                                            f"{i} of layers_per_stage {plan['layers_per_stage']}: the "
                                                            "embedding on the first stage, the head on the last); "
                                                            "re-plan, or restore the field")
                return
        start += n


def _devices(plan: dict, where: str, num_devices: int) -> Iterator[Problem]:
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
        yield Problem(f"{w}.tpot_s", f"{'null' if pred['tpot_s'] is None else show(pred['tpot_s'])} found, "
                                     f"{'a time' if decodes else 'null'} expected (inputs.workload.output_len "
                                     f"{workload['output_len']}: {'requests decode' if decodes else 'no token is decoded'})")
    sim = plan.get("simulated")
    if sim and sim["total_output_tokens_per_s"] < sim["output_tokens_per_s"] * (1 - 1e-9):
        yield Problem(f"{where}.simulated.total_output_tokens_per_s",
                      f"{sim['total_output_tokens_per_s']!r} found, at least the busiest replica's "
                      f"{sim['output_tokens_per_s']!r} expected; re-plan, or restore the field")


def _flag(argv: list, flag: str) -> str | None:
    """The value after ``flag`` in ``argv`` (None when absent)."""
    return argv[argv.index(flag) + 1] if flag in argv[:-1] else None


def _export(plan: dict, where: str, engine: str, export: dict, planned_engine: str) -> Iterator[Problem]:
    """One engine command against the plan (module docstring)."""
    if export["engine"] != engine:
        yield Problem(f"{where}.engine", f"{show(export['engine'])} found, {engine!r} expected (its key)")
        return
    par, argv, flags = plan["parallelism"], export["argv"], ENGINE_FLAGS[engine]
    expect = {flags["tp"]: par["tp"], flags["pp"]: par["pp"]}
    if engine == planned_engine:
        expect |= {flags["max_num_seqs"]: plan.get("max_num_seqs"),
                   flags["max_num_batched_tokens"]: plan.get("max_num_batched_tokens")}
    for flag, value in expect.items():
        if value is not None and _flag(argv, flag) != str(value):
            yield Problem(f"{where}.argv", f"{flag} {show(_flag(argv, flag))} found, {value} expected (the plan's); "
                                           "re-plan, or restore the command")
            return
    limit, planned_limit = _flag(argv, flags["max_num_seqs"]), plan.get("max_num_seqs")
    if planned_limit is not None and not (limit is not None and limit.isdigit() and int(limit) <= planned_limit):
        yield Problem(f"{where}.argv", f"{flags['max_num_seqs']} {show(limit)} found, at most the plan's "
                                       f"max_num_seqs {planned_limit} expected; re-plan, or restore the command")
        return
    var = PARTITION_ENV[engine]
    want = {var: ",".join(map(str, plan["layers_per_stage"]))} if par["pp"] > 1 else {}
    if export["env"] != want:
        yield Problem(f"{where}.env", f"{show(export['env'])} found, {show(want)} expected (layers_per_stage "
                                      f"{plan['layers_per_stage']}); re-plan, or restore the command")
        return
    line = " ".join([*(f"{k}={shlex.quote(v)}" for k, v in export["env"].items()), *map(shlex.quote, argv)])
    if export["command"] != line:
        yield Problem(f"{where}.command", f"{show(export['command'])} found, env and argv as a shell reads them "
                                          f"expected ({show(line)}); restore the command")
    if export["replicas"] > par["replicas"]:
        yield Problem(f"{where}.replicas", f"{export['replicas']} found, at most parallelism.replicas "
                                           f"{par['replicas']} expected")
