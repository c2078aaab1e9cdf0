"""Tests of the plan-file plots (pipesearch.plots.space/pareto/stages/common)
and of `pipesearch plot` / `pipesearch plan --plot-dir`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from pipesearch.cli import main
from pipesearch.errors import InputError, PlanFormatError
from pipesearch.plan import load_plan_file
from pipesearch.plots.common import KINDS, load, points_frame, render, title_of, write_all
from pipesearch.plots.pareto import pareto_front
from pipesearch.plots.space import CELL_STATUSES, best_cell, space_grid
from pipesearch.plots.stages import memory_breakdown, stage_breakdown

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
VGG = ["--model", "vgg16", "--cluster", "4x4-v100-10gbe", "--global-batch-size", "1024"]
GPT = ["--model", "gpt3-1.3b", "--cluster", "2x8-a100-80gb", "--global-batch-size", "512"]


def _plan(path: Path, *args: str) -> Path:
    result = CliRunner().invoke(main, ["plan", *args, "--quiet", "-o", str(path)])
    assert result.exit_code == 0, result.output
    return path


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("plots")


@pytest.fixture(scope="module")
def vgg_exhaustive(workdir) -> Path:
    """vgg16 on 4x4-v100-10gbe, batch 1024, every point evaluated."""
    return _plan(workdir / "vgg_exhaustive.json", *VGG, "--exhaustive")


@pytest.fixture(scope="module")
def vgg_pruned(workdir) -> Path:
    """The same search with pruning by lower bound (the default)."""
    return _plan(workdir / "vgg_pruned.json", *VGG)


@pytest.fixture(scope="module")
def vgg_small_memory(workdir) -> Path:
    """14 GiB of each 16 GiB device reserved: many points out of memory."""
    return _plan(workdir / "vgg_small_memory.json", *VGG, "--exhaustive", "--memory-reserve", "14GiB",
                 "--memory-headroom", "0")


def _check_png(path: Path, min_w: int = 500, min_h: int = 150) -> np.ndarray:
    import matplotlib.image as mpimg

    assert path.is_file()
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[2] in (3, 4)
    h, w = img.shape[:2]
    assert w >= min_w and h >= min_h, (w, h)
    assert w <= 4000 and h <= 4000, (w, h)
    assert float(img[..., :3].std()) > 0.01  # not a blank canvas
    return img


# ------------------------------------------------------------------ rendering


@pytest.mark.parametrize("kind", KINDS)
def test_plot_command_renders_png(kind, vgg_exhaustive, tmp_path):
    out = tmp_path / f"{kind}.png"
    result = CliRunner().invoke(main, ["plot", str(vgg_exhaustive), "--kind", kind, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.output
    _check_png(out)


@pytest.mark.parametrize("kind", ["stages", "timeline"])
def test_rank_option(kind, vgg_exhaustive, tmp_path):
    out = tmp_path / f"{kind}-3.png"
    result = CliRunner().invoke(main, ["plot", str(vgg_exhaustive), "--kind", kind, "--rank", "3", "-o", str(out)])
    assert result.exit_code == 0, result.output
    _check_png(out)


@pytest.mark.parametrize("suffix,magic", [(".svg", b"<?xml"), (".pdf", b"%PDF")])
def test_other_formats(suffix, magic, vgg_exhaustive, tmp_path):
    out = tmp_path / f"stages{suffix}"
    render("stages", vgg_exhaustive, out)
    assert out.read_bytes().startswith(magic)


def test_a_figure_to_a_pipe_is_refused_before_drawing(vgg_exhaustive, tmp_path):
    """A FIFO as -o: the image writers seek, so it is refused in one line,
    exit 2 (it drew the figure, then failed to write it)."""
    import os

    fifo = tmp_path / "fig.png"
    os.mkfifo(fifo)
    result = CliRunner().invoke(main, ["plot", str(vgg_exhaustive), "--kind", "stages", "-o", str(fifo)])
    assert result.exit_code == 2 and "is a FIFO (named pipe); a figure is written to a regular file" in result.output


def test_space_of_pruned_search_renders(vgg_pruned, tmp_path):
    _check_png(render("space", vgg_pruned, tmp_path / "space.png"))


def test_space_texts_stay_inside_the_figure(tmp_path, monkeypatch):
    """Bug: the subtitle of a pruned search's space plot (the pruned groups'
    note, one line of about 200 characters) ran off both edges of a figure
    narrower than it (alexnet on 4 V100, batch 32: a figure of 979 pixels,
    a line of 1,284). Every text of the figure (title, subtitle, labels)
    now lies inside it, the figure's top grown by the wrapped lines."""
    from pipesearch.plots import space

    drawn = []
    real = space.save

    def keep(fig, path):
        renderer = fig.canvas.get_renderer()
        drawn.append([(t.get_text(), t.get_window_extent(renderer)) for t in fig.texts] + [(fig.bbox,)])
        return real(fig, path)

    monkeypatch.setattr(space, "save", keep)
    plan = _plan(tmp_path / "alexnet.json", "--model", "alexnet", "--cluster", "1x4-v100-pcie", "-b", "32")
    render("space", plan, tmp_path / "space.png")
    *texts, (box,) = drawn[0]
    assert any("pruned" in text for text, _ in texts)
    for text, extent in texts:
        assert box.x0 <= extent.x0 and extent.x1 <= box.x1 and box.y0 <= extent.y0 and extent.y1 <= box.y1, text


def test_plan_plot_dir(tmp_path):
    """`plan --plot-dir` writes the four figures of the plan file it wrote."""
    figs = tmp_path / "figs"
    result = CliRunner().invoke(main, ["plan", *VGG, "-o", str(tmp_path / "p.json"), "--plot-dir", str(figs)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in figs.iterdir()) == ["pareto.png", "space.png", "stages.png", "timeline.png"]
    for p in figs.iterdir():
        _check_png(p)
    assert f"wrote {figs / 'space.png'}, {figs / 'pareto.png'}" in result.output
    # write_all on the same file gives the same figures
    again = write_all(tmp_path / "p.json", tmp_path / "again")
    assert [p.name for p in again] == ["space.png", "pareto.png", "stages.png", "timeline.png"]
    for p in again:
        assert p.read_bytes() == (figs / p.name).read_bytes()


def test_plan_plot_dir_with_json_keeps_stdout_json(tmp_path, monkeypatch):
    import pipesearch.plots.common as common

    calls = []
    monkeypatch.setattr(common, "render_into", lambda kind, pf, path, source: calls.append((kind, pf, path)))
    figs = tmp_path / "figs"
    result = CliRunner().invoke(main, ["plan", *VGG, "--pp", "2", "--json", "--plot-dir", str(figs)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [kind for kind, _, _ in calls] == list(common.KINDS)
    assert calls[0][1].plans[0].rank == 1 and len(calls[0][1].plans) == len(doc["plans"])
    assert sorted(p.name for p in figs.iterdir()) == sorted(f"{kind}.png" for kind in common.KINDS)


def test_plot_dir_that_is_a_file(vgg_pruned, tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(InputError, match="cannot create"):
        write_all(vgg_pruned, tmp_path / "f")


@pytest.mark.parametrize("kind", KINDS)
def test_deterministic_bytes(kind, vgg_exhaustive, tmp_path):
    a = render(kind, vgg_exhaustive, tmp_path / "a.png")
    b = render(kind, vgg_exhaustive, tmp_path / "b.png")
    assert a.read_bytes() == b.read_bytes()


def test_deterministic_svg(vgg_exhaustive, tmp_path):
    a = render("pareto", vgg_exhaustive, tmp_path / "a.svg")
    b = render("pareto", vgg_exhaustive, tmp_path / "b.svg")
    assert a.read_bytes() == b.read_bytes()


def test_title_names_model_cluster_batch(vgg_exhaustive):
    title = title_of(load(vgg_exhaustive))
    assert "vgg16" in title and "4x4-v100-10gbe" in title and "global batch 1024" in title


# ------------------------------------------------------------------ space grid


def _expected_cell_best(points: pd.DataFrame) -> pd.Series:
    ok = points[points.status == "ok"]
    return ok.groupby(["tp", "schedule", "pp", "num_micro_batches"])["samples_per_s"].max()


def test_space_grid_marks_out_of_memory(vgg_small_memory):
    points = points_frame(load(vgg_small_memory))
    assert (points.status == "out_of_memory").any()
    grid = space_grid(points)
    assert set(grid.status) <= set(CELL_STATUSES)
    oom = grid[grid.status == "out_of_memory"]
    assert len(oom) > 0
    # every point of an OOM cell is out of memory
    key = ["tp", "schedule", "pp", "num_micro_batches"]
    cell_points = points.merge(oom[key], on=key)
    assert "out_of_memory" in set(cell_points.status)
    assert not {"ok", "pruned"} & set(cell_points.status)
    assert oom.samples_per_s.isna().all()
    # best cell == best ok point of the points table
    best = best_cell(grid)
    ok = points[points.status == "ok"]
    top = ok.loc[ok.samples_per_s.idxmax()]
    assert best["samples_per_s"] == pytest.approx(top.samples_per_s, rel=1e-12)
    assert best["samples_per_s"] == pytest.approx(ok.samples_per_s.max(), rel=1e-12)
    assert (best["tp"], best["schedule"], best["pp"], best["num_micro_batches"]) == (
        top.tp, top.schedule, top.pp, top.num_micro_batches)
    # every ok cell carries its best point
    expected = _expected_cell_best(points)
    got = grid[grid.status == "ok"].set_index(key)["samples_per_s"]
    pd.testing.assert_series_equal(got.sort_index(), expected.sort_index(), check_names=False,
                                   check_index_type=False)


def test_space_grid_statuses(vgg_exhaustive, vgg_pruned):
    grid = space_grid(points_frame(load(vgg_exhaustive)))
    assert "pruned" not in set(grid.status)
    refused = grid[grid.status == "schedule_refused"]
    assert len(refused) > 0
    assert "gpipe" not in set(refused.schedule)  # GPipe runs any m
    one_f = refused[refused.schedule == "1f1b"]
    assert len(one_f) > 0 and (one_f.num_micro_batches < one_f.pp).all()  # 1F1B needs m >= pp
    # one cell per (tp, schedule, pp, m): schedules x 16 pp x 11 micro-batch counts (1..1024)
    assert len(grid) == grid.schedule.nunique() * 16 * 11
    assert not grid.duplicated(["tp", "schedule", "pp", "num_micro_batches"]).any()

    pruned = space_grid(points_frame(load(vgg_pruned)))
    assert (pruned.status == "pruned").any()
    # the best point is never pruned away, so both grids agree on it
    assert best_cell(pruned)["samples_per_s"] == pytest.approx(best_cell(grid)["samples_per_s"])


def test_a_pruned_point_records_the_bound_that_pruned_it(vgg_exhaustive, vgg_pruned):
    """A point pruned by its split search's proof kept the cheap bound it
    was visited with (0.69 s on the default plan, below rank 5's 0.806 s):
    its lower_bound_s now reaches what it had to beat (less the tie
    window): the ranked plans' last time, or its configuration's best time
    where lower (the ranking keeps one plan per configuration, so a point
    of one that holds a plan is pruned against that plan); and it stays at
    most the time the exhaustive search found for that point (every split
    simulated or bounded, no cutoff)."""
    pruned, full = points_frame(load(vgg_pruned)), points_frame(load(vgg_exhaustive))
    last = load(vgg_pruned).plans[-1].predicted.iteration_time_s
    family = ["tp", "recompute", "pp", "dp", "schedule", "vp"]
    key = family + ["micro_batch_size", "num_micro_batches", "placement"]
    both = pruned[pruned.status == "pruned"].merge(full[full.status == "ok"], on=key, suffixes=("", "_full"))
    best = full[full.status == "ok"].groupby(family, as_index=False).iteration_time_s.min()
    both = both.merge(best.rename(columns={"iteration_time_s": "family_best_s"}), on=family)
    assert len(both) > 100
    assert (both.lower_bound_s >= np.minimum(last, both.family_best_s) * (1 - 3e-3)).all()
    assert (both.lower_bound_s < last * (1 - 3e-3)).any()  # some were pruned against their configuration's plan
    assert (both.lower_bound_s <= both.iteration_time_s_full * (1 + 1e-9)).all()


def test_pareto_space_counts_of_a_pruned_search_equal_the_exhaustive_one(vgg_exhaustive, vgg_pruned):
    """The pareto plot's count of the space: a pruned search lists only the
    points it expanded, so its size and pruned count come from the search's
    counts, and equal the exhaustive search's listing of every point that
    can run (not a refused schedule or an indivisible batch); the feasible
    ones are those listed ok."""
    from pipesearch.plots.pareto import NOT_IN_SPACE, space_counts

    def size(counts):
        return sum(v for k, v in counts.items() if k not in NOT_IN_SPACE)

    full, pruned = load(vgg_exhaustive), load(vgg_pruned)
    every = space_counts(points_frame(full), full.search)
    some = space_counts(points_frame(pruned), pruned.search)
    assert "pruned" not in every and some["pruned"] > (points_frame(pruned).status == "pruned").sum()
    listed = points_frame(full)
    assert size(some) == size(every) == len(listed[~listed.status.isin(NOT_IN_SPACE)])
    assert some["ok"] == (points_frame(pruned).status == "ok").sum()


def test_best_cell_breaks_a_tie_as_the_ranking_does():
    """Two cells of equal throughput: the box goes to the rank-1 plan's
    cell (the ranking broke the tie by memory and links), also when it is
    within the ranking's 0.1% tie window below; 1% below, to the faster one."""
    def grid(second):
        return pd.DataFrame([(1, "1f1b", 1, 4, "ok", 56.8), (1, "1f1b", 1, 8, "ok", second)],
                            columns=["tp", "schedule", "pp", "num_micro_batches", "status", "samples_per_s"])

    rank1 = (1, "1f1b", 1, 8)
    assert best_cell(grid(56.8))["num_micro_batches"] == 4  # no plan to follow: the first
    assert best_cell(grid(56.8), rank1)["num_micro_batches"] == 8
    assert best_cell(grid(56.8 / 1.0009), rank1)["num_micro_batches"] == 8
    assert best_cell(grid(56.8 * 0.99), rank1)["num_micro_batches"] == 4


def test_space_grid_missing_cells_of_a_pruned_search():
    pts = pd.DataFrame([(1, "gpipe", 1, 1, "ok", 5.0), (1, "gpipe", 2, 2, "ok", 6.0)],
                       columns=["tp", "schedule", "pp", "num_micro_batches", "status", "samples_per_s"])
    for col, value in (("dp", 1), ("micro_batch_size", 1), ("placement", "pipeline"), ("recompute", "none"),
                       ("iteration_time_s", 1.0), ("peak_memory_bytes", 1.0)):
        pts[col] = value
    assert set(space_grid(pts).status) == {"ok", "n/a"}
    assert set(space_grid(pts, missing="pruned").status) == {"ok", "pruned"}
    assert (space_grid(pts, missing="pruned").query("status == 'pruned'").points == 0).all()


def test_space_grid_pp_1_of_the_other_schedules_is_not_pruned():
    """pp 1 is searched with one schedule (1F1B's order: every schedule is
    plain gradient accumulation on one rank); a pruned search drew the other
    schedules' pp 1 cells as "bound", as if a bound had skipped them."""
    pts = pd.DataFrame([(1, "1f1b", 1, 1, "ok", 5.0), (1, "gpipe", 2, 1, "ok", 6.0), (1, "1f1b", 2, 1, "ok", 6.5)],
                       columns=["tp", "schedule", "pp", "num_micro_batches", "status", "samples_per_s"])
    for col, value in (("dp", 1), ("micro_batch_size", 1), ("placement", "pipeline"), ("recompute", "none"),
                       ("iteration_time_s", 1.0), ("peak_memory_bytes", 1.0)):
        pts[col] = value
    g = space_grid(pts, missing="pruned").set_index(["schedule", "pp"])["status"]
    assert g["gpipe", 1] == "n/a" and g["1f1b", 1] == "ok" and g["gpipe", 2] == "ok"


def test_space_grid_precedence():
    rows = [
        # tp, schedule, pp, m, status, samples/s
        (1, "gpipe", 1, 1, "out_of_memory", np.nan),
        (1, "gpipe", 1, 1, "ok", 10.0),
        (1, "gpipe", 1, 1, "ok", 12.0),
        (1, "gpipe", 1, 2, "out_of_memory", np.nan),
        (1, "gpipe", 1, 2, "pruned", np.nan),
        (1, "gpipe", 2, 1, "out_of_memory", np.nan),
        (1, "1f1b", 2, 1, "schedule_refused", np.nan),
        (1, "gpipe", 2, 3, "batch_not_divisible", np.nan),
    ]
    pts = pd.DataFrame(rows, columns=["tp", "schedule", "pp", "num_micro_batches", "status", "samples_per_s"])
    for col, value in (("dp", 1), ("micro_batch_size", 1), ("placement", "pipeline"), ("recompute", "none"),
                       ("iteration_time_s", 1.0), ("peak_memory_bytes", 1.0)):
        pts[col] = value
    g = space_grid(pts).set_index(["schedule", "pp", "num_micro_batches"])
    assert g.loc[("gpipe", 1, 1), "status"] == "ok" and g.loc[("gpipe", 1, 1), "samples_per_s"] == 12.0
    assert g.loc[("gpipe", 1, 2), "status"] == "pruned"
    assert g.loc[("gpipe", 2, 1), "status"] == "out_of_memory"
    assert g.loc[("1f1b", 2, 1), "status"] == "schedule_refused"
    assert g.loc[("gpipe", 2, 3), "status"] == "n/a"
    assert g.loc[("1f1b", 1, 1), "status"] == "n/a"  # no such point at all


# ------------------------------------------------------------------ pareto, stages


def test_pareto_front_is_non_dominated(vgg_exhaustive):
    points = points_frame(load(vgg_exhaustive))
    front = pareto_front(points)
    ok = points[points.status == "ok"]
    assert len(front) >= 2
    assert front.peak_memory_bytes.is_monotonic_increasing
    assert front.samples_per_s.is_monotonic_increasing
    for _, p in front.iterrows():
        dominated = ok[(ok.samples_per_s >= p.samples_per_s) & (ok.peak_memory_bytes <= p.peak_memory_bytes)
                       & ((ok.samples_per_s > p.samples_per_s) | (ok.peak_memory_bytes < p.peak_memory_bytes))]
        assert dominated.empty
    # the best throughput and the least memory are both on the front
    assert front.samples_per_s.max() == ok.samples_per_s.max()
    assert front.peak_memory_bytes.min() == ok.peak_memory_bytes.min()


def test_stage_breakdown_adds_up(vgg_exhaustive):
    plan = load(vgg_exhaustive).plans[0]
    parts = stage_breakdown(plan)
    m = plan.num_micro_batches
    for k, st in enumerate(plan.stages):
        assert parts["forward"][k] + parts["backward"][k] == pytest.approx(m * st.compute_s)
        assert parts["p2p"][k] == pytest.approx(m * st.comm_s)
        # what follows the last backward: the all-reduce, then the optimizer step on the GPU (drawn apart)
        assert parts["step"][k] == st.optimizer_step_s > 0
        assert parts["allreduce"][k] + parts["step"][k] == pytest.approx(st.allreduce_s)
    mem = memory_breakdown(plan)
    assert mem["state"] + mem["activations"] == pytest.approx([st.memory_bytes for st in plan.stages])
    assert (mem["activations"] >= 0).all() and (mem["state"] >= 0).all()


def test_stages_with_virtual_stages(workdir, tmp_path):
    """Interleaved 1F1B: devices hold several stages; bars are per device."""
    path = _plan(workdir / "interleaved.json", *VGG, "--schedule", "interleaved-1f1b", "--pp", "4")
    plan = load(path).plans[0]
    assert plan.vp > 1 and len(plan.stages) == plan.pp * plan.vp
    mb = memory_breakdown(plan)  # from the stages' memory_breakdown: one column per device
    per_device = np.bincount([st.index % plan.pp for st in plan.stages], weights=[st.memory_bytes for st in plan.stages])
    assert len(mb["state"]) == plan.pp
    assert np.allclose(mb["state"] + mb["activations"], per_device)
    _check_png(render("stages", path, tmp_path / "stages.png"))
    _check_png(render("timeline", path, tmp_path / "timeline.png"))


# ------------------------------------------------------------------ GPT


@pytest.fixture(scope="module")
def gpt_plans(workdir) -> Path:
    return _plan(workdir / "gpt.json", *GPT)


@pytest.fixture(scope="module")
def gpt_exhaustive(workdir) -> Path:
    return _plan(workdir / "gpt_exhaustive.json", *GPT, "--exhaustive")


def test_gpt_space_renders_pruned(gpt_plans, tmp_path):
    _check_png(render("space", gpt_plans, tmp_path / "space.png"))


@pytest.mark.slow
def test_gpt_space_renders(gpt_exhaustive, tmp_path):
    grid = space_grid(points_frame(load(gpt_exhaustive)))
    assert sorted(grid.tp.unique()) == [1, 2, 4, 8]  # one panel row per tp degree
    assert "pruned" not in set(grid.status)
    _check_png(render("space", gpt_exhaustive, tmp_path / "space.png"), min_h=800)


@pytest.mark.parametrize("kind", ["pareto", "stages", "timeline"])
def test_gpt_other_kinds_render(kind, gpt_plans, tmp_path):
    _check_png(render(kind, gpt_plans, tmp_path / f"{kind}.png"))


# ------------------------------------------------------------------ bad input


def test_not_a_plan_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    with pytest.raises(PlanFormatError, match="schema"):
        render("space", bad, tmp_path / "x.png")
    result = CliRunner().invoke(main, ["plot", str(bad), "-o", str(tmp_path / "x.png")])
    assert result.exit_code == 2
    assert "error:" in result.output and "bad.json" in result.output
    assert not (tmp_path / "x.png").exists()


def test_missing_file(tmp_path):
    result = CliRunner().invoke(main, ["plot", str(tmp_path / "none.json"), "-o", str(tmp_path / "x.png")])
    assert result.exit_code == 2 and "cannot read" in result.output


def test_rank_that_does_not_exist(vgg_exhaustive, tmp_path):
    for kind in ("stages", "timeline"):
        with pytest.raises(PlanFormatError, match="no plan of rank 9"):
            render(kind, vgg_exhaustive, tmp_path / "x.png", rank=9)
    result = CliRunner().invoke(main, ["plot", str(vgg_exhaustive), "--kind", "stages", "--rank", "9",
                                       "-o", str(tmp_path / "x.png")])
    assert result.exit_code == 2
    assert "no plan of rank 9" in result.output and "ranks present: 1, 2, 3, 4, 5" in result.output


def test_plan_file_without_points(vgg_exhaustive, tmp_path):
    doc = json.loads(vgg_exhaustive.read_text())
    del doc["search"]["points"]
    nopoints = tmp_path / "nopoints.json"
    nopoints.write_text(json.dumps(doc))
    load_plan_file(nopoints)  # still a valid plan file
    for kind in ("space", "pareto"):
        with pytest.raises(PlanFormatError, match="search.points"):
            render(kind, nopoints, tmp_path / f"{kind}.png")
        result = CliRunner().invoke(main, ["plot", str(nopoints), "--kind", kind, "-o", str(tmp_path / "x.png")])
        assert result.exit_code == 2 and "search.points" in result.output
    # the per-plan figures do not need the points
    _check_png(render("stages", nopoints, tmp_path / "stages.png"))


def test_bad_output(vgg_exhaustive, tmp_path):
    with pytest.raises(InputError, match="unsupported figure format"):
        render("pareto", vgg_exhaustive, tmp_path / "x.jpg")
    with pytest.raises(InputError, match="does not exist"):
        render("pareto", vgg_exhaustive, tmp_path / "no" / "x.png")
    with pytest.raises(InputError, match="unknown plot kind"):
        render("pie", vgg_exhaustive, tmp_path / "x.png")


def test_timeline_legend_names_the_host_step_when_a_stage_offloads():
    """StagePlan.allreduce_s holds the all-reduce plus an offloaded stage's
    host optimizer step; the legend says so only when there is one."""
    from dataclasses import replace as _replace

    from pipesearch.plots.timeline import allreduce_label
    from pipesearch.types import Plan, Prediction, StagePlan

    st = StagePlan(index=0, layers=(0, 1), layer_names=("l0",), devices=(0,), compute_s=1.0, comm_s=0.0,
                   allreduce_s=0.5, memory_bytes=1.0, send_bytes=0.0)
    plan = Plan(rank=1, pp=1, dp=1, tp=1, schedule="1f1b", micro_batch_size=1, num_micro_batches=1, stages=(st,),
                predicted=Prediction(1.5, 1.0, 0.0, 1.0, 2.0))
    assert allreduce_label(plan) == "A gradient all-reduce"
    host = _replace(plan, stages=(_replace(st, host_step_s=0.2),))
    assert "host optimizer step" in allreduce_label(host)


def test_title_counts_each_device_type_of_a_mixed_cluster():
    """A cluster of 2 devices of one type and 1 of another: the title names
    each type's count (it printed the total before the joined type names,
    '3 x mygpu + a100-80gb')."""
    from types import SimpleNamespace

    cluster = {"name": "mix2", "devices": 3, "device_types": ["mygpu", "a100-80gb"],
               "groups": [{"device": "mygpu", "nodes": 1, "devices_per_node": 2},
                          {"device": "a100-80gb", "nodes": 1, "devices_per_node": 1}]}
    doc = SimpleNamespace(inputs={"model": {"name": "toy"}, "cluster": cluster, "job": {"global_batch_size": 8}})
    assert title_of(doc) == "toy on mix2 (2 x mygpu + 1 x a100-80gb), global batch 8"
    one = dict(cluster, devices=16, device_types=["v100"], groups=[{"device": "v100", "nodes": 4, "devices_per_node": 4}])
    assert title_of(SimpleNamespace(inputs={"model": {"name": "vgg16"}, "cluster": one})) == "vgg16 on mix2 (16 x v100)"


def test_a_replicated_plan_is_labelled_by_its_replicas(tmp_path):
    """vgg16 split 32 layers on 15 replicas and 8 on 1 (PipeDream's kind of
    plan): its dp is 1, but stage 0 all-reduces over 15 replicas, so the
    timeline's title names the replicas and the all-reduce, not "dp = 1: no
    all-reduce", and the stages plot says 15 and 1 devices per stage."""
    from pipesearch.plots.common import plan_label

    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, ["plan", "-q", "--model", "vgg16", "--cluster", "4x4-v100-10gbe", "--split",
                                    "32x15,8x1", "--schedule", "gpipe", "-o", str(out)])
    assert res.exit_code == 0, res.output
    plan = load_plan_file(out).plans[0]
    assert plan.stage_replicas == (15, 1) and plan.dp == 1
    assert plan_label(plan).startswith("#1: pp 2 x replicas 15,1 x tp 1, gpipe")
    res = CliRunner().invoke(main, ["plot", str(out), "--kind", "timeline", "-o", str(tmp_path / "t.png")])
    assert res.exit_code == 0, res.output
