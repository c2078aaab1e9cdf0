"""``pipesearch export`` runs every check ``pipesearch validate`` runs
before writing anything: an edited plan that validate refuses (exit 2) is
refused by export too, and no file is written.

Bug caught: export skipped the record checks, so edited Mobius copies and
host steps and RoundPipe switch shares were exported as if valid. Each edit
below changes one recorded figure of a real plan to a value its formula
cannot give (0 copy seconds, a queue of the wrong switch, a switch share of
7 GPUs on a 2-GPU pool).
"""

from __future__ import annotations

import copy
import json

import pytest
from click.testing import CliRunner

from helpers import written_plan
from pipesearch.cli import main

COMMON = ["plan", "-q", "--cluster", "1x8-rtx4090-pcie4", "--seq-len", "2048", "--top", "1"]


def _plan(tmp_path_factory, name, flags):
    return written_plan(tmp_path_factory, name, COMMON + flags, validated=False)


@pytest.fixture(scope="module")
def mobius_doc(tmp_path_factory):
    return _plan(tmp_path_factory, "mob", ["--model", "llama3.1-8b", "-b", "32", "--schedule", "mobius"])


@pytest.fixture(scope="module")
def roundpipe_doc(tmp_path_factory):
    return _plan(tmp_path_factory, "rp", ["--model", "qwen3-1.7b", "--schedule", "roundpipe", "--pp", "2",
                                          "-b", "16"])


def _both(tmp_path, doc, edit):
    """Validate and export the edited plan: both exit 2, export writes nothing."""
    bad = copy.deepcopy(doc)
    edit(bad["plans"][0])
    path, out = tmp_path / "bad.json", tmp_path / "stages.json"
    path.write_text(json.dumps(bad))
    v = CliRunner().invoke(main, ["validate", str(path)])
    e = CliRunner().invoke(main, ["export", str(path), "--format", "stages-json", "-o", str(out)])
    assert v.exit_code == 2 and e.exit_code == 2, (v.output, e.output)
    assert "Traceback" not in e.output and not out.exists(), e.output
    field = v.output.splitlines()[0].removeprefix(f"{path}: ").split(":")[0]
    assert field in e.output, (field, e.output)


def test_unedited_plans_export(tmp_path, mobius_doc, roundpipe_doc):
    for k, doc in enumerate((mobius_doc, roundpipe_doc)):
        path = tmp_path / f"ok{k}.json"
        path.write_text(json.dumps(doc))
        r = CliRunner().invoke(main, ["export", str(path), "--format", "stages-json", "-o", str(tmp_path / "s.json")])
        assert r.exit_code == 0, r.output


def test_mobius_pcie_queue(tmp_path, mobius_doc):
    def edit(p):
        q = p["options"]["mobius"]["pcie_queue"]
        q[0] = 1 - q[0]  # the other switch of the node
    _both(tmp_path, mobius_doc, edit)


def test_mobius_swap_in(tmp_path, mobius_doc):
    _both(tmp_path, mobius_doc, lambda p: p["options"]["mobius"]["swap_in_s"].__setitem__(3, 0.0))


def test_mobius_host_step(tmp_path, mobius_doc):
    _both(tmp_path, mobius_doc, lambda p: p["stages"][3].__setitem__("host_step_s", 0.0))


def test_roundpipe_pcie_scale(tmp_path, roundpipe_doc):
    _both(tmp_path, roundpipe_doc, lambda p: p["options"]["roundpipe"]["pcie_scale"].__setitem__(0, 7.0))


def test_offload_host_bytes(tmp_path_factory, tmp_path):
    """Finding 1's export: host_memory_bytes[0] = 1 was written as 1.0."""
    doc = _plan(tmp_path_factory, "off", ["--model", "qwen3-32b", "-b", "32", "--optimizer-offload"])
    _both(tmp_path, doc, lambda p: p["options"]["host"]["host_memory_bytes"].__setitem__(0, 1))


def test_offload_stage_set_to_device(tmp_path_factory, tmp_path):
    """Finding 4's export: stage 0 set to ``none`` was written as
    ``optimizer_state: device`` with 254e9 B of host memory."""
    doc = _plan(tmp_path_factory, "off2", ["--model", "qwen3-32b", "-b", "32", "--optimizer-offload"])
    _both(tmp_path, doc, lambda p: p["stages"][0].__setitem__("memory_option", "none"))


def _two_groups(name: str, first: tuple, second: tuple, intra_gbps: float, inter_gbps: float) -> str:
    """A cluster TOML of two [[groups]] ``(nodes, devices_per_node, device)``,
    links at ``intra_gbps`` (5 us) inside a node, ``inter_gbps`` (10 us)
    between nodes and 12.5 GB/s (10 us) between the groups."""
    groups = "".join(f'[[groups]]\nnodes = {n}\ndevices_per_node = {d}\ndevice = "{dev}"\n'
                     for n, d, dev in (first, second))
    return (f'name = "{name}"\n{groups}[intra_node]\nbandwidth_GBps = {intra_gbps}\nlatency_us = 5\n'
            f"[inter_node]\nbandwidth_GBps = {inter_gbps}\nlatency_us = 10\n"
            "[inter_group]\nbandwidth_GBps = 12.5\nlatency_us = 10\n")


SLOW_THEN_FAST = _two_groups("vh", (1, 4, "v100-16gb"), (1, 4, "h100-80gb"), 50, 12.5)


def test_gpipe_devices_are_the_nodes_own_indices(tmp_path):
    """A GPipe plan on the second node (cluster devices 4-7, the H100s):
    torch.device indices are the node's own, cuda:0-3, and a note names the
    node (the export gave 4-7, which a 4-GPU node does not have)."""
    from pathlib import Path

    csv = (Path(__file__).resolve().parents[1] / "cost_models" / "vgg16.csv").read_text()
    (tmp_path / "v.csv").write_text("# device: v100-16gb\n" + "\n".join(
        line for line in csv.splitlines() if not line.startswith("# device:")) + "\n")
    (tmp_path / "vh.toml").write_text(SLOW_THEN_FAST)
    out = tmp_path / "p.json"
    res = CliRunner().invoke(main, ["plan", "-q", "--model", str(tmp_path / "v.csv"), "--cluster",
                                    str(tmp_path / "vh.toml"), "-b", "256", "--runtime", "gpipe", "-o", str(out)])
    assert res.exit_code == 0, res.output
    plan = json.loads(out.read_text())["plans"][0]
    used = sorted(d for st in plan["stages"] for d in st["devices"])
    assert min(used) >= 4  # the premise: the plan runs on the H100 node
    exp = json.loads(CliRunner().invoke(main, ["export", str(out), "--format", "gpipe"]).stdout)
    assert sorted(d for row in exp["devices"] for d in row) == [d - 4 for d in used]
    assert any(n.startswith("replica 0 runs on node 1") for n in exp["notes"])


@pytest.mark.parametrize("runtime", ["megatron", "deepspeed"])
def test_plans_on_devices_without_bf16_export_fp16(tmp_path, runtime):
    """gpt3-2.7b on the A100 + V100 cluster: the V100 stages have no bf16
    (compute capability 7.0), so the export trains in fp16 (Megatron
    --fp16, DeepSpeed fp16.enabled) and says why; on A100s alone, bf16."""
    for cluster, half in (("mixed-a100-v100", True), ("1x8-a100-80gb", False)):
        out = tmp_path / f"{cluster}.json"
        res = CliRunner().invoke(main, ["plan", "-q", "--model", "gpt3-2.7b", "--cluster", cluster, "-b", "64",
                                        "--runtime", runtime, "--top", "1", "-o", str(out)])
        assert res.exit_code == 0, res.output
        types = {st["device_type"] for st in json.loads(out.read_text())["plans"][0]["stages"]}
        assert ("v100-32gb" in types) == half  # the premise: the mixed plan uses the V100s
        exp = json.loads(CliRunner().invoke(main, ["export", str(out), "--format", runtime]).stdout)
        if runtime == "megatron":
            assert ("--fp16" in exp["args"], "--bf16" in exp["args"]) == (half, not half)
        else:
            config = json.loads(exp["files"]["ds_config.json"])
            assert ("fp16" in config, "bf16" in config) == (half, not half)
        assert any("has no bf16" in n for n in exp["notes"]) == half


def test_torchtitan_refuses_plans_on_devices_without_bf16(tmp_path):
    """torchtitan's training.mixed_precision_param takes bfloat16 or
    float32 only: a plan using V100s (compute capability 7.0) is refused
    with the reason and the runtimes that train in fp16, exit 2, nothing
    printed to stdout; the same model on A100s exports."""
    for cluster, half in (("mixed-a100-v100", True), ("1x8-a100-80gb", False)):
        out = tmp_path / f"{cluster}.json"
        res = CliRunner().invoke(main, ["plan", "-q", "--model", "gpt3-2.7b", "--cluster", cluster, "-b", "64",
                                        "--top", "1", "-o", str(out)])
        assert res.exit_code == 0, res.output
        types = {st["device_type"] for st in json.loads(out.read_text())["plans"][0]["stages"]}
        assert ("v100-32gb" in types) == half  # the premise: the mixed plan uses the V100s
        exp = CliRunner().invoke(main, ["export", str(out), "--format", "torchtitan"])
        if half:
            assert exp.exit_code == 2 and exp.stdout == ""
            assert "v100-32gb has no bf16" in exp.output and "megatron or deepspeed" in exp.output
        else:
            assert exp.exit_code == 0, exp.output


def test_a_stage_over_two_device_types_counts_both_for_bf16(tmp_path):
    """gpt3-1.3b data-parallel over all 8 GPUs of the A100 + V100 cluster:
    its one stage's devices are of both types ("a100-40gb,v100-32gb"), so
    the V100s' missing bf16 counts: torchtitan refuses, Megatron trains in
    fp16 (the joined name matched no group, and both exported bf16)."""
    out = tmp_path / "p.json"
    res = CliRunner().invoke(main, ["plan", "-q", "--model", "gpt3-1.3b", "--cluster", "mixed-a100-v100", "-b", "64",
                                    "--pp", "1", "--dp", "8", "--placement", "data", "--top", "1", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "," in json.loads(out.read_text())["plans"][0]["stages"][0]["device_type"]  # the premise
    titan = CliRunner().invoke(main, ["export", str(out), "--format", "torchtitan"])
    assert titan.exit_code == 2 and "v100-32gb has no bf16" in titan.output
    mega = json.loads(CliRunner().invoke(main, ["export", str(out), "--format", "megatron"]).stdout)
    assert "--fp16" in mega["args"] and "--bf16" not in mega["args"]


EIGHT_THEN_FOURS = _two_groups("ha", (1, 8, "h100-80gb"), (2, 4, "a100-40gb"), 300, 25)


@pytest.mark.parametrize("runtime", ["megatron", "torchtitan"])
def test_nodes_of_different_sizes_launch_their_own_process_counts(tmp_path, runtime):
    """One node of 8 H100s and two of 4 A100s, all 16 GPUs used: torchrun
    runs 3 agents, each with its node's count (8, 4, 4 in launch order);
    it wrote --nnodes 4 --nproc-per-node 4 (the smallest group's), which
    would put two agents' ranks on GPUs 0-3 of the 8-GPU node."""
    (tmp_path / "ha.toml").write_text(EIGHT_THEN_FOURS)
    out = tmp_path / "p.json"
    model = "llama2-13b" if runtime == "torchtitan" else "gpt3-13b"  # torchtitan runs no tied embedding over stages
    res = CliRunner().invoke(main, ["plan", "-q", "--model", model, "--cluster", str(tmp_path / "ha.toml"),
                                    "-b", "128", "--tp", "4", "--pp", "4", "--runtime", runtime, "--top", "1",
                                    "-o", str(out)])
    assert res.exit_code == 0, res.output
    plan = json.loads(out.read_text())["plans"][0]
    p = plan["parallelism"]
    assert p["pp"] * p["dp"] * p["tp"] == 16  # the premise: every GPU of the three nodes
    exp = json.loads(CliRunner().invoke(main, ["export", str(out), "--format", runtime]).stdout)
    line = exp["command_line"]
    assert "--nnodes 3 " in line and '--nproc-per-node "${NPROC_PER_NODE:?}"' in line
    note = next(n for n in exp["notes"] if "NPROC_PER_NODE=" in n)
    counts = [int(x) for x in __import__("re").findall(r"NPROC_PER_NODE=(\d+)", note)]
    assert sorted(counts) == [4, 4, 8] and sum(counts) == 16


@pytest.mark.parametrize("runtime, extra, script", [("megatron", (), "launch_megatron.sh"),
                                                    ("torchtitan", (), "launch_torchtitan.sh"),
                                                    ("torchtitan", ("--torchtitan-version", "0.2"), "launch_torchtitan.sh")])
def test_a_launch_script_sets_node_rank_from_the_machines_node_in_the_cluster(tmp_path, runtime, extra, script):
    """Llama-3 8B on one H100 node (devices 0-7) and one A100 node (8-15),
    1F1B pp 2 x dp 2 x tp 4: the plan's first stage runs on the A100 node,
    so torchrun's NODE_RANK 0 (the first ranks) belongs there. The script
    (run by bash, torchrun replaced by an echo) maps CLUSTER_NODE, the
    machine's node in the cluster file, to NODE_RANK: node 1 -> 0, node 0
    -> 1, any other node -> exit 2. It only took NODE_RANK, and the order
    was in a note: numbering the machines in order ran the stages on the
    other node type."""
    import subprocess

    out = tmp_path / "p.json"
    res = CliRunner().invoke(main, ["plan", "-q", "--model", "llama3-8b", "--cluster", "mixed-h100-a100", "-b", "256",
                                    "--schedule", "1f1b", "--pp", "2", "--tp", "4", "--top", "1", "-o", str(out)])
    assert res.exit_code == 0, res.output
    plan = json.loads(out.read_text())["plans"][0]
    assert min(plan["stages"][0]["devices"]) >= 8 and max(plan["stages"][1]["devices"]) < 8  # the premise
    files = tmp_path / "files"
    res = CliRunner().invoke(main, ["export", str(out), "--format", runtime, *extra, "--files", str(files)])
    assert res.exit_code == 0, res.output
    lines = (files / script).read_text().splitlines()
    at = next(k for k, line in enumerate(lines) if "torchrun" in line and not line.startswith("#"))
    (files / "probe.sh").write_text("\n".join(lines[:at] + ['echo "NODE_RANK=$NODE_RANK"; exit 0'] + lines[at:]))

    def node_rank(cluster_node):
        r = subprocess.run(["bash", str(files / "probe.sh")], env={"CLUSTER_NODE": cluster_node, "PATH": "/usr/bin:/bin"},
                           capture_output=True, text=True)
        return r.returncode, r.stdout.strip()

    assert node_rank("1") == (0, "NODE_RANK=0")
    assert node_rank("0") == (0, "NODE_RANK=1")
    assert node_rank("2")[0] == 2


def test_a_plan_launched_in_the_clusters_node_order_needs_no_cluster_node(tmp_path):
    """Two nodes of one type in id order: the script reads NODE_RANK as it is."""
    out = tmp_path / "p.json"
    res = CliRunner().invoke(main, ["plan", "-q", "--model", "gpt3-1.3b", "--cluster", "2x8-a100-80gb", "-b", "64",
                                    "--pp", "2", "--dp", "8", "--top", "1", "-o", str(out)])
    assert res.exit_code == 0, res.output
    files = tmp_path / "files"
    assert CliRunner().invoke(main, ["export", str(out), "--format", "megatron", "--files", str(files)]).exit_code == 0
    text = (files / "launch_megatron.sh").read_text()
    assert "CLUSTER_NODE" not in text and '--node-rank "${NODE_RANK:?}"' in text


def test_nodes_of_one_group_need_no_launch_order(tmp_path):
    """GPT-3 1.3B on four 8-GPU A100 nodes, pp 2 x dp 2 x tp 8, pipeline
    placement: the plan reaches its nodes in the order 0, 2, 1, 3, but the
    four nodes are interchangeable (one group: the same type, size and
    links), so launching them in any order runs the same plan; neither the
    notes nor the script ask for an order (the 175B plan on 128 nodes had a
    note listing all 128)."""
    from pipesearch.export import launch_nodes
    from pipesearch.plan import load_plan_file

    out = tmp_path / "p.json"
    res = CliRunner().invoke(main, ["plan", "-q", "--model", "gpt3-1.3b", "--cluster", "2x8-a100-80gb", "--nodes", "4",
                                    "-b", "64", "--pp", "2", "--tp", "8", "--placement", "pipeline", "--top", "1",
                                    "-o", str(out)])
    assert res.exit_code == 0, res.output
    pf = load_plan_file(out)
    assert launch_nodes(pf.plans[0], pf.inputs) == [0, 2, 1, 3]  # the premise
    files = tmp_path / "files"
    res = CliRunner().invoke(main, ["export", str(out), "--format", "megatron", "--files", str(files)])
    assert res.exit_code == 0, res.output
    assert "CLUSTER_NODE" not in (files / "launch_megatron.sh").read_text()
    exp = json.loads(CliRunner().invoke(main, ["export", str(out), "--format", "megatron"]).stdout)
    assert not any("plan's order" in n for n in exp["notes"])


def test_a_partly_used_last_node_gets_its_own_process_count(tmp_path):
    """A plan of 7 processes on a node of 4 GPUs and a node of 4 (pp 7 on
    4 + 3): the launch script hard-coded --nnodes 2 --nproc-per-node 4, so
    the second node started 4 processes for a rendezvous of 7 (the fix was
    in a JSON note only). The script now sets NPROC_PER_NODE from NODE_RANK
    (run by bash, torchrun replaced by an echo): 4 on node 0, 3 on node 1;
    DeepSpeed's export names the hostfile's slots per node."""
    import subprocess

    (tmp_path / "two.toml").write_text(_two_groups("two", (1, 4, "h100-80gb"), (1, 4, "a100-80gb"), 300, 25))
    out = tmp_path / "p.json"
    res = CliRunner().invoke(main, ["plan", "-q", "--model", "gpt3-1.3b", "--cluster", str(tmp_path / "two.toml"),
                                    "-b", "64", "--tp", "1", "--pp", "7", "--dp", "1", "--schedule", "1f1b",
                                    "--top", "1", "-o", str(out)])
    assert res.exit_code == 0, res.output
    script = tmp_path / "launch.sh"
    assert CliRunner().invoke(main, ["export", str(out), "--format", "megatron", "-o", str(script)]).exit_code == 0
    text = script.read_text().replace("torchrun", "echo torchrun", 1)
    for node_rank, nproc in (("0", "4"), ("1", "3")):
        run = subprocess.run(["bash", "-c", text], env={"NODE_RANK": node_rank, "MASTER_ADDR": "10.0.0.1",
                                                        "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
        assert run.returncode == 0 and f"--nproc-per-node {nproc} " in run.stdout, run.stdout + run.stderr
    run = subprocess.run(["bash", "-c", text], env={"NODE_RANK": "2", "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True)
    assert run.returncode == 2 and "runs on 2 nodes" in run.stderr
    ds = json.loads(CliRunner().invoke(main, ["export", str(out), "--format", "deepspeed"]).stdout)
    note = next(n for n in ds["notes"] if "hostfile" in n)
    assert "7 processes on 2 node(s)" in note and "slots=4" in note and "slots=3" in note


def test_a_single_node_deepspeed_plan_needs_no_hostfile_note(tmp_path):
    """pp 4 on 4 of the 8 A100s of node 0: DeepSpeed runs it without a
    hostfile, and the export warned to list one (the review found it); on
    2 of a cluster's 4 nodes the note names them (a hostfile of all four
    would start processes the plan does not have)."""
    out = tmp_path / "one.json"
    assert CliRunner().invoke(main, ["plan", "-q", "--model", "gpt3-1.3b", "--cluster", "1x8-a100-80gb", "-b", "64",
                                     "--pp", "4", "--dp", "1", "--tp", "1", "--schedule", "1f1b", "--top", "1",
                                     "-o", str(out)]).exit_code == 0
    ds = json.loads(CliRunner().invoke(main, ["export", str(out), "--format", "deepspeed"]).stdout)
    assert not any("hostfile" in n for n in ds["notes"]), ds["notes"]
    out = tmp_path / "two.json"
    res = CliRunner().invoke(main, ["plan", "-q", "--model", "gpt3-1.3b", "--cluster", "4x4-v100-10gbe", "-b", "64",
                                    "--pp", "8", "--dp", "1", "--tp", "1", "--schedule", "1f1b", "--top", "1",
                                    "-o", str(out)])
    assert res.exit_code == 0, res.output
    ds = json.loads(CliRunner().invoke(main, ["export", str(out), "--format", "deepspeed"]).stdout)
    note = next(n for n in ds["notes"] if "hostfile" in n)
    assert "8 processes on 2 node(s)" in note and note.count("slots=4") == 2
