"""A plan file records digests of what its plans were computed from (inputs
and each plan's degrees, schedule and options): ``validate`` and ``export``
name the part an edit changed. Before, a plan of GPT-3 1.3B with
``hidden_size`` edited to 4096 validated and exported a Megatron launch of
a model four times larger, with the figures of 1.3B; ``recompute`` edited to
``full`` exported full recomputation with the times and bytes of none."""

from __future__ import annotations

import copy
import json

import pytest
from click.testing import CliRunner

from pipesearch.cli import main
from pipesearch.schema.digests import digest


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    out = tmp_path_factory.mktemp("digests") / "gpt.json"
    res = CliRunner().invoke(main, ["plan", "-q", "--model", "gpt3-1.3b", "--cluster", "2x8-a100-80gb", "-b", "64",
                                    "--top", "2", "--pp", "2", "-o", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert all(len(p["stages"]) >= 2 for p in doc["plans"])  # the edits below move layers between stages
    return doc


def _write(tmp_path, doc, name="p.json", **dump):
    path = tmp_path / name
    path.write_text(json.dumps(doc, **dump))
    return path


def _validate(path):
    return CliRunner().invoke(main, ["validate", str(path)])


def test_digests_are_of_the_written_parts(doc):
    """Each digest is the SHA-256 of its part's canonical JSON, computed here
    with hashlib on the text as read back."""
    import hashlib

    assert set(doc["digests"]) == {"inputs.model", "inputs.cluster", "inputs.job", "inputs.fingerprint"} | {
        f"plans[{k}].{part}" for k in range(2) for part in ("parallelism", "schedule", "options", "stages",
                                                            "figures")}

    def floats(v):  # every number a float, as the canonical form writes them
        if isinstance(v, bool) or not isinstance(v, (int, float, dict, list)):
            return v
        return {k: floats(x) for k, x in v.items()} if isinstance(v, dict) else (
            [floats(x) for x in v] if isinstance(v, list) else float(v))

    text = json.dumps(floats(doc["inputs"]["job"]), sort_keys=True, separators=(",", ":"))
    assert doc["digests"]["inputs.job"] == "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    assert doc["digests"]["plans[1].options"] == digest(doc["plans"][1]["options"])
    layout = ("index", "layers", "layer_names", "devices", "replicas")  # a stage's figures: all but where it runs
    figures = {"stages": [{k: v for k, v in st.items() if k not in layout} for st in doc["plans"][0]["stages"]],
               "predicted": doc["plans"][0]["predicted"]}
    assert "fwd_s" in figures["stages"][0] and doc["digests"]["plans[0].figures"] == digest(figures)


def _integral_floats_as_ints(v):
    """A JSON tool's rewrite (jq, JavaScript): 2.0 written as 2."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, dict):
        return {k: _integral_floats_as_ints(x) for k, x in v.items()}
    return [_integral_floats_as_ints(x) for x in v] if isinstance(v, list) else v


def test_an_untouched_file_in_any_layout_and_one_without_digests_are_valid(tmp_path, doc):
    assert _validate(_write(tmp_path, doc, indent=1, sort_keys=True)).exit_code == 0  # another layout, same values
    # jq and JavaScript write 2.0 as 2: the same values (every part was reported edited)
    rewritten = _integral_floats_as_ints(doc)
    assert rewritten["inputs"]["model"]["bytes_per_param"] == 2 and isinstance(
        rewritten["inputs"]["model"]["bytes_per_param"], int)
    assert _validate(_write(tmp_path, rewritten, name="jq.json")).exit_code == 0
    moved = copy.deepcopy(doc)  # the model file's path is provenance: a file moved between machines stays valid
    moved["inputs"]["model"]["file"] = "llama.toml"
    moved["inputs"]["model"]["warnings"] = []
    assert _validate(_write(tmp_path, moved, name="moved.json")).exit_code == 0
    old = {k: v for k, v in doc.items() if k != "digests"}  # written before digests: not checked, but said
    res = _validate(_write(tmp_path, old, name="old.json"))
    assert res.exit_code == 0 and "old.json: no 'digests': an edit of the inputs" in res.stderr
    res = CliRunner().invoke(main, ["simulate", str(tmp_path / "old.json")])
    assert res.exit_code == 0 and "old.json: no 'digests'" in res.stderr
    res = CliRunner().invoke(main, ["export", str(tmp_path / "old.json"), "--format", "torch", "-o",
                                    str(tmp_path / "t.json")])
    assert res.exit_code == 0 and "warning: " in res.stderr and "old.json: no 'digests'" in res.stderr
    # written before the figures were digested: the other parts still checked, the figures not
    unfigured = copy.deepcopy(doc)
    unfigured["digests"] = {k: v for k, v in doc["digests"].items() if not k.endswith(".figures")}
    res = _validate(_write(tmp_path, unfigured, name="unfigured.json"))
    assert res.exit_code == 0 and "digests" not in res.stderr
    unfigured["inputs"]["job"]["state_bytes_per_param"] = 0
    assert "inputs.job: edited after planning" in _validate(_write(tmp_path, unfigured, name="u2.json")).output


def _halved_stage_0(plan: dict) -> None:
    """Stage 0's forward, compute and input-gradient seconds halved, and the
    plan's predicted iteration time, bubble and rate set to the replay of
    the edited stages (as a hand edit that kept the file self-consistent)."""
    for key in ("fwd_s", "compute_s", "bwd_input_s"):
        if key in plan["stages"][0]:
            plan["stages"][0][key] /= 2
    _predicted_as_replayed(plan)


def _no_step_on_stage_0(plan: dict) -> None:
    """Stage 0's GPU optimizer step removed, the bubble set to the replay's
    (the step no longer counted busy)."""
    plan["stages"][0].pop("optimizer_step_s")
    _predicted_as_replayed(plan)


def _predicted_as_replayed(plan: dict) -> None:
    """The plan's predicted iteration time, bubble and rates set to the
    replay of its stages."""
    from pipesearch.plan import plan_from_dict
    from pipesearch.point_plan import plan_rank_busy_s, simulate_plan
    from pipesearch.timemodel import busiest_idle_fraction

    edited = plan_from_dict(plan)[0]
    t, timeline = simulate_plan(edited)
    predicted = plan["predicted"]
    predicted["bubble_fraction"] = busiest_idle_fraction(float(plan_rank_busy_s(edited, timeline).max()), t)
    for key in ("samples_per_s", "tokens_per_s", "tokens_per_s_per_device", "mfu"):  # rates: 1 / time
        if predicted.get(key) is not None:
            predicted[key] *= predicted["iteration_time_s"] / t
    predicted["iteration_time_s"] = t


@pytest.mark.parametrize("where,edit", [
    ("inputs.model", lambda d: d["inputs"]["model"]["transformer"].update(hidden_size=4096)),
    ("inputs.model", lambda d: d["inputs"]["model"]["transformer"].update(vocab_size=1)),
    ("inputs.model", lambda d: d["inputs"]["model"].update(name="llama3-8b")),
    ("inputs.job", lambda d: d["inputs"]["job"]["comm_overlap"].update(grad_reduce=True)),
    ("inputs.job", lambda d: d["inputs"]["job"].update(state_bytes_per_param=0)),
    ("plans[0].options", lambda d: d["plans"][0]["options"].update(recompute="full")),
    ("plans[1].options", lambda d: d["plans"][1]["options"].update(
        placement="data" if d["plans"][1]["options"]["placement"] == "pipeline" else "pipeline")),
    ("inputs.fingerprint", lambda d: d["inputs"].update(fingerprint="sha256:" + "0" * 64)),
    # a layer moved from stage 0 to stage 1 (the replay reads the recorded stage times, which did not move)
    ("plans[1].stages", lambda d: (d["plans"][1]["stages"][0]["layers"].__setitem__(1, d["plans"][1]["stages"][0][
        "layers"][1] - 1), d["plans"][1]["stages"][1]["layers"].__setitem__(0, d["plans"][1]["stages"][1]["layers"][
            0] - 1), d["plans"][1]["stages"][1]["layer_names"].insert(0, d["plans"][1]["stages"][0][
                "layer_names"].pop()))),
    ("plans[1].stages", lambda d: [st["devices"].reverse()  # slot 0's devices in another order (each stage on it)
                                   for st in d["plans"][1]["stages"][::d["plans"][1]["parallelism"]["pp"]]]),
    # stage 0's compute halved and the predicted figures set to what the replay then gives: the replay agrees
    ("plans[0].figures", lambda d: _halved_stage_0(d["plans"][0])),
    ("plans[0].figures", lambda d: d["plans"][0]["stages"][0].update(dp_comm_s=0.0)),
    ("plans[0].figures", lambda d: d["plans"][0]["stages"][-1].update(send_bytes=1e9)),
    ("plans[0].figures", lambda d: _no_step_on_stage_0(d["plans"][0])),
])
def test_an_edited_part_is_named_by_validate_and_export(tmp_path, doc, where, edit):
    bad = copy.deepcopy(doc)
    edit(bad)
    path = _write(tmp_path, bad)
    res = _validate(path)
    assert res.exit_code == 2 and f"{where}: edited after planning" in res.output, res.output
    rank = 1 if where.startswith("plans[0]") else 2
    out = tmp_path / "launch.sh"
    res = CliRunner().invoke(main, ["export", str(path), "--rank", str(rank), "--format", "megatron", "-o", str(out)])
    assert res.exit_code == 2 and f"{where}: edited after planning" in res.output and not out.exists()
    edit_back = copy.deepcopy(bad)
    edit_back[where.split(".")[0].split("[")[0]] = copy.deepcopy(doc[where.split(".")[0].split("[")[0]])
    assert _validate(_write(tmp_path, edit_back, name="restored.json")).exit_code == 0  # restored: valid again


def test_a_plan_added_or_removed_is_named(tmp_path, doc):
    fewer = copy.deepcopy(doc)
    fewer["plans"] = fewer["plans"][:1]
    res = _validate(_write(tmp_path, fewer))
    assert res.exit_code == 2 and "plans[1].parallelism: in the file's digests but gone" in res.output
    more = copy.deepcopy(doc)
    del more["digests"]["plans[1].schedule"]
    res = _validate(_write(tmp_path, more, name="more.json"))
    assert res.exit_code == 2 and "plans[1].schedule: not in the file's digests" in res.output
    swapped = copy.deepcopy(doc)  # each plan's parts as planned, at the other's place
    swapped["plans"].reverse()
    res = _validate(_write(tmp_path, swapped, name="swapped.json"))
    assert res.exit_code == 2 and "plans[0].parallelism: as planned at plans[1].parallelism" in res.output
    assert "edited after planning" not in res.output
    odd = copy.deepcopy(doc)
    odd["digests"]["search"] = "sha256:" + "0" * 64
    res = _validate(_write(tmp_path, odd, name="odd.json"))
    assert res.exit_code == 2 and "digests.search: not a part pipesearch digests" in res.output


def test_simulate_says_figures_edited_where_its_replay_agrees(tmp_path, doc):
    """Stage 0's compute halved and the predicted figures set to the replay
    of the edited stages: the replay agrees with the file, so only the
    figures' digest tells the edit; ``simulate`` warns once, naming it.
    Where the replay disagrees too (the predicted figures left as planned),
    its own line says so and the digest's is not repeated."""
    bad = copy.deepcopy(doc)
    _halved_stage_0(bad["plans"][0])
    path = _write(tmp_path, bad)
    res = CliRunner().invoke(main, ["simulate", str(path), "--rank", "1"])
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 0 and len(lines) == 1 and "plans[0].figures: edited after planning" in lines[0], lines
    raw = copy.deepcopy(doc)
    raw["plans"][0]["stages"][0]["compute_s"] *= 1.5
    res = CliRunner().invoke(main, ["simulate", str(_write(tmp_path, raw, name="raw.json")), "--rank", "1"])
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 0 and len(lines) == 1 and "the replay takes" in lines[0], lines
