"""Large inputs: start-up cost of the command line, the points counted rather
than built, the points table by column, the split's memory, and a 20,000-layer
profile planned end to end.

Oracles: the command list click would print from each command's own
docstring; the groups and points enumerated one by one (the expansion the
search skips); the byte size of an ``(L, L+1)`` float table.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import click
from click.testing import CliRunner
import numpy as np
import pytest

from helpers import make_costs, tiny_cluster, tiny_profile
from pipesearch import partition
from pipesearch.cli import COMMANDS, main
from pipesearch.partition import exhaustive_split, optimal_split
from pipesearch.plan import load_plan_file, points_columns
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.search_space import count_points, enumerate_groups, expand_group
from pipesearch.types import Job

HEAVY = ("pandas", "numpy", "networkx", "matplotlib", "ortools", "torch", "jsonschema")


def _modules_after(code: str) -> set[str]:
    """Top-level packages imported by a fresh interpreter running ``code``."""
    probe = (f"import sys\n{code}\n"
             "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    return set(done.stderr.strip().splitlines()[-1].split())


def test_help_imports_no_heavy_library():
    """``pipesearch --help`` loads click and nothing of numpy, pandas,
    networkx, matplotlib, OR-Tools, torch or jsonschema."""
    loaded = _modules_after("from pipesearch.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass")
    assert not loaded & set(HEAVY), loaded & set(HEAVY)


def test_plan_on_a_profile_csv_imports_no_graph_plot_or_solver_library(tmp_path):
    """A plan of a profile CSV on a homogeneous cluster needs neither
    networkx (PipeDream graphs), matplotlib (plots), OR-Tools (mixed
    clusters; its linear solver also for an interleaved split search that
    stops at its work limits, pipesearch.fluid, which this one does not)
    nor torch (profiling, runtimes); and without a plan file going out
    (no ``-o``, ``--json``, ``--plot-dir``) no jsonschema: nothing is
    written, so the file is neither built nor checked. With ``-o`` it is
    (the file's check loads jsonschema)."""
    code = ("from pipesearch.cli import main\ntry:\n"
            "    main(['plan', '--model', 'gnmt', '--cluster', '1x4-v100-pcie', '--pp', '2', '-q'{out}])\n"
            "except SystemExit as e:\n    assert e.code == 0, e.code")
    loaded = _modules_after(code.format(out=""))
    assert not loaded & {"networkx", "matplotlib", "ortools", "torch", "jsonschema"}, loaded
    out = tmp_path / "plan.json"
    assert "jsonschema" in _modules_after(code.format(out=f", '-o', {str(out)!r}"))
    assert load_plan_file(out).plans


def test_command_list_lines_are_the_commands_own_help():
    """The one-line help :data:`COMMANDS` keeps for ``--help`` is each
    command's docstring summary, and every command is listed."""
    ctx = click.Context(main)
    for name, (_, text) in COMMANDS.items():
        command = main.get_command(ctx, name)
        if command is None:  # an optional command whose module is absent
            continue
        assert command.get_short_help_str(limit=10_000) == text, name
    assert set(main.commands) <= set(COMMANDS)


def _variant(layers: int = 6) -> ModelVariant:
    return ModelVariant(tiny_profile([1e-3] * layers))


@pytest.mark.parametrize("devices,batch,dp_pin", [(16, 24, None), (12, 7, None), (8, 64, None), (6, 36, 3)])
def test_groups_refused_for_the_batch_are_counted_like_one_by_one(devices, batch, dp_pin):
    """Every (pp, dp) with pp x dp <= devices is either yielded to expand or
    counted as batch_not_divisible, exactly as a double loop over all dp
    finds them."""
    cluster = tiny_cluster(devices_per_node=devices)
    job = Job(global_batch_size=batch)
    options = SearchOptions(dp=dp_pin)
    variant = _variant()
    expand, refused = set(), 0
    for _, pp, dp, status, count in enumerate_groups([variant], cluster, job, options):
        if status is None:
            expand.add((pp, dp))
        else:
            assert status == "batch_not_divisible"
            refused += count
    want_expand, want_refused = set(), 0
    for pp in range(1, min(devices, 6) + 1):
        for dp in ([dp_pin] if dp_pin else range(1, devices + 1)):
            if pp * dp > devices:
                continue
            if batch % dp:
                want_refused += 1
            else:
                want_expand.add((pp, dp))
    assert expand == want_expand and refused == want_refused


@pytest.mark.parametrize("options", [
    SearchOptions(), SearchOptions(schedules=("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "looped-bfs"), vps=(1, 2, 3)),
    SearchOptions(micro_batch_size=2), SearchOptions(num_micro_batches=3), SearchOptions(schedules=("gpipe",))])
def test_pruned_points_are_counted_like_the_expansion(options):
    """count_points (what a pruned group stands for) equals the number of
    points expand_group yields to evaluate, over every group of a small
    space, with and without the cache."""
    cluster = tiny_cluster(devices_per_node=8)
    job = Job(global_batch_size=48)
    variant = _variant(7)
    cache: dict = {}
    for pp in range(1, 8):
        for dp in (d for d in range(1, 8 // pp + 1) if 48 % d == 0):
            want = sum(1 for *_, status in expand_group(variant, pp, dp, job, options, cluster) if status is None)
            assert count_points(variant, pp, dp, job, options, cluster) == want, (pp, dp)
            assert count_points(variant, pp, dp, job, options, cluster, cache) == want, (pp, dp)


def test_points_table_is_written_by_column_one_line_each(tmp_path):
    """The plan file holds the points by column, one line per column; the
    same table read back in the older by-row layout gives the same values."""
    out = tmp_path / "p.json"
    result = CliRunner().invoke(main, ["plan", "--model", "gnmt", "--cluster", "1x4-v100-pcie", "--pp", "2",
                                                     "-q", "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    doc = json.loads(text)
    block = doc["search"]["points"]
    assert set(block) == {"columns", "values"}
    assert len(block["values"]) == len(block["columns"]) and len({len(v) for v in block["values"]}) == 1
    lines = text.splitlines()
    start = lines.index('      "values": [')
    assert lines[start + len(block["columns"]) + 1] == "      ]"
    by_row = dict(doc, search=dict(doc["search"], points={"columns": block["columns"],
                                                          "data": [list(r) for r in zip(*block["values"])]}))
    old = tmp_path / "old.json"
    old.write_text(json.dumps(by_row, indent=2))
    assert points_columns(load_plan_file(old).search["points"]) == points_columns(load_plan_file(out).search["points"])


def _chain_costs(num_layers: int, pp: int, seed: int = 0, memory: float = 1e12, allreduce=0.0):
    rng = np.random.default_rng(seed)
    times = rng.uniform(1.5, 4.5, num_layers) * 1e-3
    return make_costs(times=tuple(times), fwd=tuple(times / 3), params=tuple(rng.uniform(0, 1e6, num_layers)),
                      outputs=tuple(rng.uniform(0, 1e7, num_layers)), pp=pp, m=2 * pp, capacity=memory,
                      link_bandwidth=1e10, allreduce_per_byte=allreduce)


@pytest.mark.parametrize("seed", range(4))
def test_split_in_blocks_matches_brute_force(monkeypatch, seed):
    """With band blocks of a few cells (every DP pass computed block by
    block, nothing kept) the split equals the exhaustive one."""
    monkeypatch.setattr(partition, "MAX_BAND_CELLS", 7)
    monkeypatch.setattr(partition, "BLOCK_CELLS", 5)
    # tight memory (about 4 of the 11 layers' state per device) and a different all-reduce per stage
    costs = _chain_costs(11, 3, seed, memory=4 * 4 * 0.5e6 + 3 * 2 * 1e7, allreduce=(1e-9, 3e-9, 2e-9))
    got, want = optimal_split(costs), exhaustive_split(costs)
    if want is None:
        assert got is None
        return
    assert got.iteration_time_s == pytest.approx(want.iteration_time_s, rel=1e-12)


def _split_peak_bytes(num_layers: int) -> int:
    costs = _chain_costs(num_layers, 2, 1)
    tracemalloc.start()
    try:
        found = optimal_split(costs)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert found is not None and found.bounds[0] == 0 and found.bounds[-1] == num_layers
    return peak


def test_split_memory_is_linear_in_layers():
    """Chains of 6,000 and 24,000 layers on 2 stages: an (L, L+1) float table
    of the larger alone is 4.6 GB; the split's peak traced allocation stays
    under a hundredth of it and grows less than four times when the layers
    grow four times (a table over layer pairs would grow sixteen times; the
    band blocks are bounded, so small chains can sit below the linear
    share)."""
    small, large = _split_peak_bytes(6000), _split_peak_bytes(24_000)
    assert large < 24_000 * 24_001 * 8 / 100, large
    assert large < 4 * small, (small, large)


_TWENTY_THOUSAND = """
import numpy as np
from helpers import tiny_cluster, tiny_profile
from pipesearch.search import ModelVariant, SearchOptions, search
from pipesearch.types import Job

L = 20_000
rng = np.random.default_rng(3)
profile = tiny_profile(rng.uniform(1e-6, 3e-6, L), params=[1e3] * L, outputs=[4e3] * L)
result = search([ModelVariant(profile)], tiny_cluster(devices_per_node=4), Job(global_batch_size=16),
                SearchOptions(schedules=("gpipe", "1f1b"), top=3))
assert result.plans
for plan in result.plans:
    assert plan.stages[0].layers[0] == 0 and plan.stages[-1].layers[1] == L
    assert all(a.layers[1] == b.layers[0] for a, b in zip(plan.stages, plan.stages[1:]))
print("planned", len(result.plans))
"""


def _limit_memory():  # runs in the child: 4 GiB of address space, so a table over layer pairs fails fast
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))


@pytest.mark.slow
def test_twenty_thousand_layer_profile_plans():
    """A 20,000-layer chain of tiny layers (1 to 3 us forward, 1 KB of
    weights each) on 4 devices plans within 4 GiB of address space: ranked
    plans whose stages cover every layer in order (run in a child process
    under that limit)."""
    done = subprocess.run([sys.executable, "-c", _TWENTY_THOUSAND], capture_output=True, text=True, timeout=1200,
                          cwd=Path(__file__).parent, preexec_fn=_limit_memory)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "planned" in done.stdout
