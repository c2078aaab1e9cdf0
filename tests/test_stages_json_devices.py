"""``stages-json`` lists every GPU of a stage in ``devices`` (each replica's
tensor-parallel group), the plan's per-replica heads in the additive
``tp_group_heads`` (pipesearch.export.stages_json.stage_gpus; schema
pipesearch/schema/stages-1.schema.json, still format_version 1).

Hand cases: pp 2 x tp 4 on 8 GPUs, heads 0 and 4: stage 0 on GPUs 0-3,
stage 1 on 4-7. pp 2 x dp 2 x tp 2, heads (0, 4) and (2, 6): stage 0 on
0, 1, 4, 5 and stage 1 on 2, 3, 6, 7.
"""

from __future__ import annotations

from pathlib import Path

from pipesearch.export import export_plan
from pipesearch.export.stages_json import stage_gpus, stages_problems
from pipesearch.types import Plan, Prediction, StagePlan


def _plan(tp, dp, heads) -> Plan:
    stages = tuple(StagePlan(index=k, layers=(k, k + 1), layer_names=(f"l{k}",), devices=tuple(heads[k]),
                             compute_s=3.0, fwd_s=1.0, comm_s=0.0, allreduce_s=0.0, memory_bytes=1.0, send_bytes=0.0)
                   for k in range(2))
    return Plan(rank=0, pp=2, dp=dp, tp=tp, schedule="1f1b", micro_batch_size=1, num_micro_batches=4, stages=stages,
                predicted=Prediction(1.0, 0.0, 0.0, 0.0, 0.0), vp=1)


def test_tp_4_stage_lists_its_four_gpus():
    """Catches: devices [0] and [4] (one head per tp-4 stage) written as the stage's GPUs."""
    doc = export_plan(_plan(4, 1, [(0,), (4,)]), "stages-json")
    assert [s["devices"] for s in doc["stages"]] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [s["tp_group_heads"] for s in doc["stages"]] == [[0], [4]]
    assert stages_problems({k: v for k, v in doc.items() if k != "files"}) == []


def test_dp_and_tp_replica_by_replica():
    """Catches: a replica dropped, or tp groups interleaved across replicas."""
    doc = export_plan(_plan(2, 2, [(0, 4), (2, 6)]), "stages-json")
    assert [s["devices"] for s in doc["stages"]] == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert stage_gpus((3,), 1) == [3]


def test_schema_refuses_a_bad_head_list():
    """Catches: the additive field not in the schema (additionalProperties false) or unchecked."""
    doc = {k: v for k, v in export_plan(_plan(4, 1, [(0,), (4,)]), "stages-json").items() if k != "files"}
    doc["stages"][0]["tp_group_heads"] = []
    assert any("tp_group_heads" in p for p in stages_problems(doc))


def test_the_cli_prints_and_writes_the_document_its_schema_describes(tmp_path):
    """``export --format stages-json`` to stdout or to ``-o`` of any name
    gives the stages document itself (schema-valid), not the export object
    with its ``files`` around it; other formats keep the export object."""
    import json

    import jsonschema
    from click.testing import CliRunner

    from pipesearch.cli import main

    plans = tmp_path / "p.json"
    res = CliRunner().invoke(main, ["plan", "--model", "gpt3-1.3b", "--cluster", "2x8-a100-80gb", "-b", "64", "--pp", "2",
                                    "--top", "1", "-q", "-o", str(plans)])
    assert res.exit_code == 0, res.output
    schema = json.loads((Path(__file__).parents[1] / "pipesearch/schema/stages-1.schema.json").read_text())
    res = CliRunner().invoke(main, ["export", str(plans), "--format", "stages-json"])
    assert res.exit_code == 0, res.output
    jsonschema.validate(json.loads(res.stdout), schema)
    out = tmp_path / "plan_stages.json"
    res = CliRunner().invoke(main, ["export", str(plans), "--format", "stages-json", "-o", str(out)])
    assert res.exit_code == 0, res.output
    jsonschema.validate(json.loads(out.read_text()), schema)
    res = CliRunner().invoke(main, ["export", str(plans), "--format", "megatron"])
    assert "files" in json.loads(res.stdout) and json.loads(res.stdout)["runtime"] == "megatron-lm"
