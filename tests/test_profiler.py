"""The torch layer profiler (pipesearch.profiler) and ``pipesearch profile``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipesearch.cli import main
from pipesearch.errors import InputError

REPO = Path(__file__).resolve().parent.parent


def test_missing_torch_is_an_input_error_with_the_install_hint(monkeypatch):
    from pipesearch import profiler

    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    with pytest.raises(InputError, match="pip install torch"):
        profiler.import_torch()


# ---------------------------------------------------------------- with torch

try:
    import torch
    from torch import nn
except ImportError:  # the tests below are skipped
    torch = nn = None

from pipesearch.profiler import model_layers, profile_module  # noqa: E402
from pipesearch.profiles import load_model  # noqa: E402

needs_torch = pytest.mark.skipif(torch is None, reason="the profiler needs PyTorch: pip install torch==2.13.0")

BATCH = 4


def _tiny():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


@needs_torch
def test_profile_tiny_sequential_sizes_names_times():
    prof = profile_module(_tiny(), torch.randn(BATCH, 16), batch_size=BATCH, warmup=1, repeats=3)
    assert [lay.name for lay in prof.layers] == ["0", "1", "2"]
    assert prof.profiled_batch_size == BATCH and prof.profiled_device == "cpu"
    assert prof.bytes_per_param == 4
    # parameters: (in * out + out) * 4 bytes
    assert [lay.param_bytes for lay in prof.layers] == [(16 * 32 + 32) * 4, 0, (32 * 8 + 8) * 4]
    # outputs: batch * features * 4 bytes
    assert [lay.output_bytes for lay in prof.layers] == [BATCH * 32 * 4, BATCH * 32 * 4, BATCH * 8 * 4]
    # saved for backward: a Linear keeps its input (its weight is a parameter, not counted),
    # ReLU its output; plausible bounds rather than torch's exact choice
    in_bytes = [BATCH * 16 * 4, BATCH * 32 * 4, BATCH * 32 * 4]
    for lay, inp in zip(prof.layers, in_bytes):
        assert 0 < lay.saved_bytes <= inp + lay.output_bytes
    assert prof.layers[0].saved_bytes >= in_bytes[0] and prof.layers[2].saved_bytes >= in_bytes[2]
    for lay in prof.layers:
        assert lay.fwd_s > 0 and lay.bwd_s > 0
    assert "1 thread" in prof.source


@needs_torch
def test_profile_restores_threads_and_clears_grads():
    model = _tiny()
    threads = torch.get_num_threads()
    profile_module(model, torch.randn(BATCH, 16), batch_size=BATCH, warmup=0, repeats=1, clock="wall")
    assert torch.get_num_threads() == threads
    assert all(p.grad is None for p in model.parameters())


@needs_torch
def test_layers_of_a_module_with_a_layers_list():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(8, 8), nn.Tanh()])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    assert [n for n, _ in model_layers(Net())] == ["layers.0", "layers.1"]
    prof = profile_module(Net(), torch.randn(2, 8), batch_size=2, warmup=0, repeats=1)
    assert [lay.name for lay in prof.layers] == ["layers.0", "layers.1"]


@needs_torch
def test_profile_rejects_bad_arguments():
    with pytest.raises(InputError, match="torch.nn.Module"):
        profile_module(object(), torch.randn(2, 16), batch_size=2)
    with pytest.raises(InputError, match="no child modules"):
        profile_module(nn.Linear(2, 2), torch.randn(2, 2), batch_size=2)
    with pytest.raises(InputError, match="layer '0'"):
        profile_module(_tiny(), torch.randn(2, 5), batch_size=2, warmup=0, repeats=1)
    with pytest.raises(InputError, match="clock"):
        profile_module(_tiny(), torch.randn(2, 16), batch_size=2, clock="sundial")


@needs_torch
def test_a_model_that_is_not_the_chain_of_its_children_is_refused():
    """forward = b(x) + a(x): running a then b computes b(a(x)), another
    model, which a plan would split as if it were this one (and the same
    children as an nn.Sequential are accepted)."""
    torch.manual_seed(0)

    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            return self.b(x) + self.a(x)

    model = Residual()
    with pytest.raises(InputError, match=r"layers run in order \(a, b\) do not compute what its forward does"):
        profile_module(model, torch.randn(4, 8), batch_size=4, warmup=0, repeats=1)
    chain = nn.Sequential(model.a, model.b)
    assert [x.name for x in profile_module(chain, torch.randn(4, 8), batch_size=4, warmup=0, repeats=1).layers] == [
        "0", "1"]

    class Noise(nn.Module):  # a chain whose middle child draws random numbers is still a chain
        def forward(self, x):
            return x + torch.randn_like(x)

    noisy = nn.Sequential(nn.Linear(8, 8), Noise(), nn.Linear(8, 8))
    assert len(profile_module(noisy, torch.randn(4, 8), batch_size=4, warmup=0, repeats=1).layers) == 3


@needs_torch
def test_a_tied_embedding_and_head_count_once_and_round_trip(tmp_path):
    """Embedding (64 x 16) and head sharing its weight, a 16 x 16 linear
    between, fp32: the embedding holds 64 x 16 x 4 = 4,096 B, the head none
    of its own, and the profile records the 4,096 B the head shares with
    the first layer (a stage holding the head but not the embedding keeps a
    copy); the CSV keeps it."""
    from pipesearch.profiles.csv_profile import read_profile_csv, write_profile_csv

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(64, 16)
            self.body = nn.Linear(16, 16)
            self.head = nn.Linear(16, 64, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, x):
            return self.head(self.body(self.emb(x)))

    torch.manual_seed(0)
    prof = profile_module(Tied(), torch.randint(0, 64, (4, 8)), batch_size=4, warmup=0, repeats=1)
    assert [x.param_bytes for x in prof.layers] == [4096.0, (16 * 16 + 16) * 4.0, 0.0]
    assert prof.tied_param_bytes == 4096.0
    write_profile_csv(prof, tmp_path / "t.csv")
    assert "# tied_param_bytes: 4096" in (tmp_path / "t.csv").read_text()
    assert read_profile_csv(tmp_path / "t.csv").tied_param_bytes == 4096.0


@needs_torch
def test_cli_profile_writes_a_csv_that_load_model_reads(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    out = tmp_path / "x.csv"
    result = CliRunner().invoke(main, ["profile", "tests/e2e_model.py:make_model", "--input-shape", "1024",
                                       "--batch-size", "8", "--warmup", "1", "--repeats", "2", "-o", str(out)])
    assert result.exit_code == 0, result.output
    prof = load_model(str(out))
    assert prof.name == "e2e_model" and prof.profiled_batch_size == 8 and prof.profiled_device == "cpu"
    assert [lay.name for lay in prof.layers] == [str(i) for i in range(8)]
    assert prof.layers[0].param_bytes == (1024 * 1024 + 1024) * 4
    assert prof.layers[-1].output_bytes == 8 * 320 * 4
    assert all(lay.fwd_s > 0 and lay.bwd_s > 0 for lay in prof.layers)


@needs_torch
def test_cli_profile_errors_exit_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models.py").write_text(
        "def not_a_model():\n    return 42\n\n\ndef broken():\n    raise ValueError('no')\n\n\n"
        "def empty():\n    import torch.nn as nn\n    return nn.Sequential()\n")
    runner = CliRunner()
    cases = [
        (["nocolon"], "MODULE:FACTORY"),
        (["no_such_module_xyz:make"], "cannot import"),
        (["models.py:missing"], "no attribute"),
        (["models.py:not_a_model"], "not a torch.nn.Module"),
        (["models:broken"], "factory raised"),
        (["missing/file.py:f"], "does not exist"),
        (["models.py:empty"], "models.py:empty: cannot profile Sequential: it has no child modules"),
    ]
    for args, message in cases:
        result = runner.invoke(main, ["profile", *args, "--input-shape", "4", "--batch-size", "2", "-o", "o.csv"])
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output, (args, result.output)
    result = runner.invoke(main, ["profile", "models.py:not_a_model", "--input-shape", "4,x", "--batch-size", "2"])
    assert result.exit_code == 2 and "--input-shape" in result.output


@needs_torch
def test_profile_gpt_shape_with_token_inputs(tmp_path):
    """embedding + `layers` ModuleList + head, token-id input: one layer per
    block, the embedding and head around them; sizes from the shapes."""
    out = tmp_path / "gpt.csv"
    res = CliRunner().invoke(main, ["profile", str(REPO / "tests" / "gpt_model.py") + ":make_gpt",
                                    "--input-shape", "32", "--input-dtype", "long", "--vocab-size", "512",
                                    "-b", "4", "--warmup", "1", "--repeats", "2", "-o", str(out)])
    assert res.exit_code == 0, res.output
    prof = load_model(str(out))
    names = [lay.name for lay in prof.layers]
    assert names == ["tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3", "head"]
    width, vocab, batch, seq = 64, 512, 4, 32
    assert prof.layers[0].param_bytes == vocab * width * 4                      # the embedding table
    assert prof.layers[-1].param_bytes == (2 * width + width * vocab + vocab) * 4  # LayerNorm + Linear
    assert [lay.output_bytes for lay in prof.layers[:-1]] == [batch * seq * width * 4] * 5
    assert prof.layers[-1].output_bytes == batch * seq * vocab * 4
    assert all(lay.fwd_s > 0 and lay.bwd_s > 0 for lay in prof.layers[1:])
    assert "--input-dtype long --vocab-size 512" in prof.source
    plan = CliRunner().invoke(main, ["plan", "--model", str(out), "--cluster", "1x2-cpu", "--pp", "2",
                                     "-b", "8", "--top", "1", "-o", str(tmp_path / "p.json")])
    assert plan.exit_code == 0, plan.output


@needs_torch
def test_token_input_needs_a_vocabulary(tmp_path):
    res = CliRunner().invoke(main, ["profile", str(REPO / "tests" / "gpt_model.py") + ":make_gpt",
                                    "--input-shape", "32", "--input-dtype", "long", "-b", "4"])
    assert res.exit_code == 2 and "--vocab-size" in res.output


@needs_torch
def test_model_layers_expands_module_lists_between_prefix_and_suffix():
    sys.path.insert(0, str(REPO / "tests"))
    from gpt_model import make_gpt

    assert [n for n, _ in model_layers(make_gpt())] == [
        "tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3", "head"]


TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1024, "hidden_size": 128,
              "intermediate_size": 344, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 256, "hidden_act": "silu", "rms_norm_eps": 1e-5,
              "tie_word_embeddings": False}


@needs_torch
@pytest.mark.slow
def test_hf_llama_chain_computes_the_models_logits(tmp_path):
    transformers = pytest.importorskip("transformers")
    from pipesearch.profiler import hf_causal_lm_chain

    cfg = transformers.LlamaConfig(**{k: v for k, v in TINY_LLAMA.items() if k not in ("architectures", "model_type")})
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    chain = hf_causal_lm_chain(model)
    assert [n for n, _ in chain.named_children()] == ["embed_tokens", "layers_00", "layers_01", "layers_02",
                                                      "layers_03", "lm_head"]
    tokens = torch.randint(0, 1024, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(chain(tokens), model(tokens).logits)
    # the CLI: built from config.json, token inputs below its vocabulary
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    out = tmp_path / "llama.csv"
    res = CliRunner().invoke(main, ["profile", "--hf-config", str(tmp_path / "config.json"), "--input-shape", "16",
                                    "-b", "2", "--warmup", "1", "--repeats", "2", "-o", str(out)])
    assert res.exit_code == 0, res.output
    prof = load_model(str(out))
    h, v, f, g = 128, 1024, 344, 2
    block = (h * h + 2 * (g * h // 4) * h + h * h + 3 * h * f + 2 * h) * 4  # q, k, v, o, gate/up/down, 2 norms
    assert [lay.param_bytes for lay in prof.layers] == [v * h * 4] + [block] * 4 + [(h + h * v) * 4]
    assert "--vocab-size 1024" in prof.source
    # a config file of another name reads the same (it was read from its directory's config.json)
    (tmp_path / "tiny_llama.json").write_text(json.dumps(dict(TINY_LLAMA, num_hidden_layers=2)))
    out2 = tmp_path / "llama2.csv"
    res = CliRunner().invoke(main, ["profile", "--hf-config", str(tmp_path / "tiny_llama.json"), "--input-shape", "16",
                                    "-b", "2", "--warmup", "1", "--repeats", "2", "-o", str(out2)])
    assert res.exit_code == 0, res.output
    assert len(load_model(str(out2)).layers) == 2 + 2  # its own 2 blocks, embedding and head


@needs_torch
def test_device_name_is_recorded_and_cuda_needs_a_gpu(tmp_path):
    out = tmp_path / "p.csv"
    args = ["profile", str(REPO / "tests" / "gpt_model.py") + ":make_gpt", "--input-shape", "8",
            "--input-dtype", "long", "--vocab-size", "512", "-b", "2", "--warmup", "0", "--repeats", "1"]
    res = CliRunner().invoke(main, args + ["--device-name", "v100-16gb", "-o", str(out)])
    assert res.exit_code == 0, res.output
    prof = load_model(str(out))
    assert prof.profiled_device == "v100-16gb" and "warm-up runs (dropped)" in prof.source
    # a GPU's name on times measured on the CPU: recorded as asked, and said (plans take them as the GPU's)
    assert "warning: --device-name v100-16gb labels times measured on the CPU" in res.output
    res = CliRunner().invoke(main, args + ["--device-name", "cpu", "-o", str(tmp_path / "c.csv")])
    assert res.exit_code == 0 and "warning" not in res.output
    if not torch.cuda.is_available():
        res = CliRunner().invoke(main, args + ["--device", "cuda", "-o", str(tmp_path / "g.csv")])
        assert res.exit_code == 2 and "torch.cuda.is_available() is False" in res.output


@needs_torch
@pytest.mark.skipif(torch is None or not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_profile_uses_events():
    prof = profile_module(_tiny(), torch.randn(BATCH, 16), batch_size=BATCH, warmup=1, repeats=3, device="cuda",
                          num_threads=None, clock="wall")
    assert prof.profiled_device == "cuda" and "CUDA events" in prof.source
    assert all(lay.fwd_s > 0 for lay in prof.layers)


@needs_torch
@pytest.mark.slow
@pytest.mark.parametrize("which", ["gpt", "llama"])
def test_profiled_language_model_runs_its_plan_in_the_torch_pipeline(which, tmp_path):
    """Profile (token inputs), plan pp = 2, run the plan with
    torch.distributed.pipelining in two gloo processes: the losses are
    finite and the step is timed."""
    import functools
    from pipesearch.hardware import load_cluster
    from pipesearch.profiler import hf_model_from_config
    from pipesearch.profiles import write_profile_csv
    from pipesearch.runtime import run_plan
    from pipesearch.search import search
    from pipesearch.search_options import ModelVariant, SearchOptions
    from pipesearch.types import Job

    sys.path.insert(0, str(REPO / "tests"))
    import gpt_model

    if which == "gpt":
        factory, vocab = gpt_model.make_gpt, gpt_model.VOCAB
    else:
        pytest.importorskip("transformers")
        (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
        factory, vocab = functools.partial(hf_model_from_config, tmp_path / "config.json"), TINY_LLAMA["vocab_size"]
    torch.manual_seed(0)
    tokens = torch.randint(0, vocab, (4, 16))
    prof = profile_module(factory(), tokens, batch_size=4, warmup=1, repeats=2, name=which)
    write_profile_csv(prof, tmp_path / "p.csv")
    prof = load_model(str(tmp_path / "p.csv"))
    plan = search([ModelVariant(prof)], load_cluster("1x2-cpu"), Job(global_batch_size=16),
                  SearchOptions(pp=2, dp=1, num_micro_batches=4, schedules=("1f1b",), top=1)).plans[0]
    res = run_plan(factory, plan, input_shape=(16,), vocab_size=vocab, steps=2, warmup=1)
    assert len(res.step_s) == 2 and all(s > 0 for s in res.step_s)
    assert all(0 < loss < 100 for loss in res.losses)


# ---------------------------------------------------------------- fixed + per-sample fit

from pipesearch.profiler import fit_fixed_per_sample, fit_profiles, profile_module_at_sizes  # noqa: E402
from pipesearch.types import Layer, ModelProfile  # noqa: E402


def test_fit_recovers_an_exact_line_and_keeps_both_parts_non_negative():
    # t = 0.5 + 0.25 b exactly
    fixed, per_sample = fit_fixed_per_sample([1, 2, 4, 8], [0.75, 1.0, 1.5, 2.5])
    assert fixed == pytest.approx(0.5, rel=1e-12) and per_sample == pytest.approx(0.25, rel=1e-12)
    # times 0, 2, 6 at b = 1, 2, 3: the free line is 3b - 10/3 (intercept < 0); on the edge fixed = 0
    # the slope is sum(b t) / sum(b^2) = (0 + 4 + 18) / (1 + 4 + 9) = 11/7 (squared error 3.43), better
    # than the flat fit t = 8/3 (squared error 18.67)
    fixed, per_sample = fit_fixed_per_sample([1, 2, 3], [0.0, 2.0, 6.0])
    assert fixed == 0.0 and per_sample == pytest.approx(11 / 7, rel=1e-12)
    # times falling with the batch (noise): per_sample = 0, fixed = the mean
    fixed, per_sample = fit_fixed_per_sample([1, 2], [3.0, 1.0])
    assert (fixed, per_sample) == (pytest.approx(2.0), 0.0)


def test_fit_needs_two_distinct_batch_sizes():
    with pytest.raises(InputError, match="two distinct"):
        fit_fixed_per_sample([4, 4], [1.0, 1.1])
    one = ModelProfile("m", (Layer("a", 1e-3, 2e-3, 0, 0, 0),), 4)
    with pytest.raises(InputError, match="two distinct"):
        fit_profiles([one, one])


def _fake_clock_chain(clock: dict, costs):
    """Layers whose forward and backward advance ``clock["now"]`` by
    ``a + c * batch`` seconds (exact binary fractions, so sums are exact)."""

    class Tick(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, seconds):
            ctx.seconds = seconds
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            clock["now"] += ctx.seconds
            return grad, None

    class Timed(nn.Module):
        def __init__(self, fa, fc, ba, bc):
            super().__init__()
            self.w = nn.Parameter(torch.ones(4))
            self.parts = (fa, fc, ba, bc)

        def forward(self, x):
            fa, fc, ba, bc = self.parts
            clock["now"] += fa + fc * x.shape[0]
            return Tick.apply(x * self.w, ba + bc * x.shape[0])

    return nn.Sequential(*[Timed(*c) for c in costs])


@needs_torch
def test_profiler_fits_layers_whose_time_is_fixed_plus_per_sample():
    """Two layers timed by a fake clock: forward 2^-6 + 2^-9 b and backward
    2^-5 + 2^-8 b seconds (first), forward 0 + 2^-7 b and backward 2^-4 + 0 b
    (second). Profiled at b = 1, 2, 4 the fit gives those parts back, the
    profile is at b = 4, and the times at b = 3 are the lines' values."""
    clock = {"now": 0.0}
    costs = [(2 ** -6, 2 ** -9, 2 ** -5, 2 ** -8), (0.0, 2 ** -7, 2 ** -4, 0.0)]
    model = _fake_clock_chain(clock, costs)
    prof = profile_module_at_sizes(model, lambda b: torch.ones(b, 4), [4, 1, 2], warmup=1, repeats=3,
                                   clock="wall", timer=lambda: clock["now"])
    assert prof.profiled_batch_size == 4
    for lay, (fa, fc, ba, bc) in zip(prof.layers, costs):
        assert lay.fwd_fixed_s == pytest.approx(fa, abs=1e-12) and lay.bwd_fixed_s == pytest.approx(ba, abs=1e-12)
        assert lay.fwd_s == pytest.approx(fa + 4 * fc, rel=1e-12) and lay.bwd_s == pytest.approx(ba + 4 * bc, rel=1e-12)
    at3 = prof.layer_times_at(3)
    assert list(at3["fwd_s"]) == pytest.approx([fa + 3 * fc for fa, fc, _, _ in costs], rel=1e-12)
    assert list(at3["bwd_s"]) == pytest.approx([ba + 3 * bc for _, _, ba, bc in costs], rel=1e-12)
    assert "batch sizes 1,2,4" in prof.source


@needs_torch
def test_cli_profile_batch_sizes_writes_fixed_columns(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    out = tmp_path / "fit.csv"
    result = CliRunner().invoke(main, ["profile", "tests/e2e_model.py:make_model", "--input-shape", "1024",
                                       "--batch-sizes", "2,1", "--warmup", "1", "--repeats", "2", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "fitted over batch sizes 1,2" in result.output
    header = [line for line in out.read_text().splitlines() if not line.startswith("#")][0]
    assert header.split(",")[-3:] == ["fwd_fixed_ms", "bwd_fixed_ms", "shared_saved_bytes"]
    prof = load_model(str(out))
    assert prof.profiled_batch_size == 2 and prof.layers[-1].output_bytes == 2 * 320 * 4
    # each block's Linear keeps as its input the ReLU output the block before keeps: 2 samples x width x fp32
    from e2e_model import WIDTHS  # tests/ is on sys.path

    assert prof.layers[0].shared_saved_bytes is None
    assert [lay.shared_saved_bytes for lay in prof.layers[1:]] == [2 * w * 4 for w in WIDTHS[1:-1]]
    for lay in prof.layers:
        assert 0 <= lay.fwd_fixed_s <= lay.fwd_s and 0 <= lay.bwd_fixed_s <= lay.bwd_s


@needs_torch
def test_cli_profile_batch_sizes_bad_input_exit_2(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    base = ["profile", "tests/e2e_model.py:make_model", "--input-shape", "1024", "-o", str(tmp_path / "o.csv")]
    cases = [
        (["--batch-sizes", "4"], "--batch-sizes '4'"),
        (["--batch-sizes", "4,4"], "two distinct"),
        (["--batch-sizes", "1,x"], "--batch-sizes '1,x'"),
        (["--batch-sizes", "0,2"], "--batch-sizes '0,2'"),
        (["--batch-sizes", "1,2", "--batch-size", "2"], "one of them"),
        ([], "one of them"),
    ]
    for args, message in cases:
        result = CliRunner().invoke(main, base + args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)
        assert "Traceback" not in result.output
    assert not (tmp_path / "o.csv").exists()


@needs_torch
def test_cli_profile_refuses_bad_sizes_names_and_outputs_before_measuring(tmp_path, monkeypatch):
    """Every mistake below ended in "internal error" (exit 1, or a
    misleading line) after the model was built or measured; each is now one
    line naming the option and its value, exit 2, and no file is left."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models.py").write_text(
        "import sys\nfrom torch import nn\n\n\ndef small():\n    return nn.Sequential(nn.Linear(4, 4), nn.ReLU())\n\n\n"
        "def leaves():\n    sys.exit(0)\n")
    (tmp_path / "afile").write_text("x")
    gpt = str(REPO / "tests" / "gpt_model.py") + ":make_gpt"
    base = ["--input-shape", "4", "--batch-size", "2", "-o", "o.csv"]
    cases = [
        (["profile", "models.py:small", "--input-shape", "4", "-b", "2", "-o", "/proc/o.csv"], "/proc/o.csv"),
        (["profile", "models.py:small", "--input-shape", "4", "-b", "2", "-o", "afile/o.csv"], "afile is not a directory"),
        (["profile", "models.py:small", "--input-shape", "4", "-b", str(10**23), "-o", "o.csv"],
         "input elements in one batch"),
        (["profile", "models.py:small", "--input-shape", "4", "--batch-sizes", f"1,{10**23}", "-o", "o.csv"],
         "input elements in one batch"),
        (["profile", "models.py:small", "--input-shape", str(2**63 - 1), "-b", "2", "-o", "o.csv"],
         "at most 16 dimensions"),
        (["profile", "models.py:small", "--input-shape", ",".join(["1"] * 70), "-b", "2", "-o", "o.csv"],
         "at most 16 dimensions"),
        (["profile", gpt, "--input-shape", "8", "-b", "2", "--input-dtype", "long", "--vocab-size", "100000",
          "-o", "o.csv"], "above the model's first embedding's 512 entries"),
        # float inputs into an Embedding: torch's own error, then the options that fix it
        (["profile", gpt, "--input-shape", "8", "-b", "2", "-o", "o.csv"],
         "the first layer is an Embedding, which takes token ids: add --input-dtype long --vocab-size 512"),
        (["profile", "models.py:small", *base[:4], "--name", " ", "-o", "o.csv"], "--name: empty"),
        # it named the CSV's temporary file (the name is a header line)
        (["profile", "models.py:small", *base[:4], "--name", "a,b\nc", "-o", "o.csv"], "--name 'a,b\\nc': the profile's name must be one line"),
        (["profile", f"{tmp_path}:small", *base], "is a directory"),
        (["profile", "models.py:leaves", *base], "called sys.exit(0)"),
    ]
    config = dict(TINY_LLAMA, num_hidden_layers=1)
    for key, value, message in [("num_attention_heads", 3, "not a multiple of num_attention_heads 3"),
                                ("hidden_size", "128", "hidden_size '128': expected an integer >= 1"),
                                ("num_hidden_layers", 2.5, "num_hidden_layers 2.5: expected an integer >= 1"),
                                ("vocab_size", -5, "vocab_size -5: expected an integer >= 1"),
                                ("rms_norm_eps", float("nan"), "rms_norm_eps nan: expected a finite number"),
                                # torch's refusal 28 s into the model's build, named neither file nor key
                                ("num_key_value_heads", 3, "num_attention_heads 4 is not a multiple of "
                                                           "num_key_value_heads 3")]:
        path = tmp_path / f"bad_{key}.json"
        path.write_text(json.dumps(dict(config, **{key: value})))
        cases.append((["profile", "--hf-config", str(path), "--input-shape", "8", "-b", "2", "-o", "o.csv"], message))
    good = tmp_path / "config.json"
    good.write_text(json.dumps(config))
    empty = tmp_path / "nothing_here"
    empty.mkdir()
    (tmp_path / "notjson.json").write_text("{bad")
    (tmp_path / "foo.json").write_text(json.dumps(dict(config, model_type="foo")))
    cases += [  # a JSON syntax error was "cannot read its vocab_size"; transformers' list of every class was quoted
        (["profile", "--hf-config", "notjson.json", *base], "--hf-config notjson.json: not a JSON config (Expecting"),
        (["profile", "--hf-config", "foo.json", *base], "transformers cannot read it (ValueError: The checkpoint you "
                                                        "are trying to load has model type `foo` but Transformers "
                                                        "does not recognize this architecture.)\n")]
    cases += [(["profile", "--hf-config", str(good), "--input-shape", "257", "-b", "2", "-o", "o.csv"],
               "longer than"),
              (["profile", "--hf-config", str(good), "--input-shape", "8", "-b", "2", "--input-dtype", "float",
                "-o", "o.csv"], "--input-dtype float: --hf-config profiles a language model on token ids"),
              # a torch shape error with a hint about branching models
              (["profile", "--hf-config", str(good), "--input-shape", "8,4", "-b", "2", "-o", "o.csv"],
               "--input-shape 8,4: a language model's sample is one sequence of token ids"),
              (["profile", "--hf-config", str(empty), "--input-shape", "8", "-b", "2", "-o", "o.csv"],
               "a directory without a config.json")]  # "cannot read it (No such file or directory)"
    runner = CliRunner()
    for args, message in cases:
        result = runner.invoke(main, args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output, (args, result.output)
        assert "internal error" not in result.output and "Traceback" not in result.output
    assert not (tmp_path / "o.csv").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary file left


@needs_torch
def test_an_encoder_config_is_refused_in_one_line_without_the_library_s_advice(tmp_path):
    """A BERT config.json printed transformers' "[transformers] If you want
    to use BertLMHeadModel as a standalone, add is_decoder=True." on stderr
    before pipesearch's own refusal: two lines for one error."""
    import subprocess
    import sys

    pytest.importorskip("transformers")
    (tmp_path / "bert.json").write_text(json.dumps({
        "model_type": "bert", "vocab_size": 100, "hidden_size": 64, "num_attention_heads": 4,
        "num_hidden_layers": 1, "intermediate_size": 128}))
    res = subprocess.run([sys.executable, "-m", "pipesearch", "profile", "--hf-config", "bert.json", "--input-shape",
                          "8", "-b", "2", "-o", "o.csv"], cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot chain BertLMHeadModel"), res.stderr


def test_a_config_larger_than_the_hosts_memory_is_refused(tmp_path):
    """A Llama-3 8B config was built in fp32 (8.03e9 x 4 bytes, 29.9 GiB)
    on a host with 23 GiB available and the process was killed with no
    message. The parameters are counted first: against 16 GiB available it
    is refused naming both figures; in bf16 (2 bytes, 15.0 GiB) it passes,
    and a tiny config too."""
    from pipesearch.cli.profile_cmd import check_host_memory

    big = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
           "max_position_embeddings": 8192, "tie_word_embeddings": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(big))
    with pytest.raises(InputError, match=r"8\.03 billion parameters take 29\.9 GiB in float32.*16\.0 GiB"):
        check_host_memory(path, 16, available=16 * 2**30)
    # a config in bf16 is built in bf16 (transformers 5): 15.0 GiB, which 16 GiB holds, unless --dtype float32
    path.write_text(json.dumps(big | {"torch_dtype": "bfloat16"}))
    check_host_memory(path, 16, "bfloat16", available=16 * 2**30)
    with pytest.raises(InputError, match=r"29\.9 GiB in float32 \(built in the config's bfloat16"):
        check_host_memory(path, 16, "float32", available=16 * 2**30)
    (tmp_path / "tiny.json").write_text(json.dumps(TINY_LLAMA))
    check_host_memory(tmp_path / "tiny.json", 16, available=16 * 2**30)


@needs_torch
def test_an_in_place_activation_is_profiled_on_a_copy_of_its_input():
    """torchvision writes nn.ReLU(inplace=True): on the profiler's own
    leaf input (which requires grad) torch refuses the in-place operation,
    which was reported as a model that is not a chain. The layer is now
    timed on a copy of its input; its sizes are the out-of-place ReLU's
    (an output of batch x 32 floats; it saves that output)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(inplace=True), nn.Linear(32, 8))
    prof = profile_module(model, torch.randn(BATCH, 16), batch_size=BATCH, warmup=1, repeats=2)
    relu = prof.layers[1]
    assert relu.output_bytes == BATCH * 32 * 4 and relu.saved_bytes == BATCH * 32 * 4
    assert relu.fwd_s > 0 and relu.bwd_s > 0


class _TakeFirst(nn.Module if nn is not None else object):
    def forward(self, out, state=None):
        return out


class _DictOut(nn.Module if nn is not None else object):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        return {"h": self.lin(x)}


class _TakeH(nn.Module if nn is not None else object):
    def forward(self, d):
        return d["h"]


@needs_torch
def test_nested_tuple_outputs_chain_and_other_outputs_are_refused():
    """An LSTM passes ``(out, (h, c))`` on: the nested tuple is detached
    whole and the chain profiles (it crashed with AttributeError, exit 1).
    A layer passing a dict on (as a HuggingFace model's output object) is
    refused, naming the layer and what it returns."""
    torch.manual_seed(0)
    lstm = nn.Sequential(nn.Linear(16, 32), nn.LSTM(32, 32, batch_first=True), _TakeFirst(), nn.Linear(32, 4))
    prof = profile_module(lstm, torch.randn(BATCH, 5, 16), batch_size=BATCH, warmup=1, repeats=2)
    assert [lay.name for lay in prof.layers] == ["0", "1", "2", "3"]
    with pytest.raises(InputError, match=r"layer '0' \(_DictOut\) returns a dict, not tensors"):
        profile_module(nn.Sequential(_DictOut(), _TakeH(), nn.Linear(16, 4)), torch.randn(BATCH, 16),
                       batch_size=BATCH, warmup=1, repeats=2)


def test_hf_configs_the_chain_computes_otherwise_are_refused(tmp_path):
    """The --hf-config chain runs full causal attention and plain logits:
    a Mistral window shorter than the profiled sequence, or Gemma-2's
    softcapped logits, made it time another model than the config's
    (logits 0.85 and 1.31 apart), with no word. Refused before any model is
    built, naming the key and the fix; a window as long as the sequence
    profiles what the model computes."""
    from pipesearch.cli.profile_cmd import check_chained_attention

    with pytest.raises(InputError, match=r"sliding_window 16 < the 64-token sequence.*at most 16 tokens"):
        check_chained_attention({"sliding_window": 16}, "c.json", 64)
    check_chained_attention({"sliding_window": 64}, "c.json", 64)
    check_chained_attention({"sliding_window": 16, "use_sliding_window": False}, "c.json", 64)
    with pytest.raises(InputError, match="final_logit_softcapping 30.0"):
        check_chained_attention({"final_logit_softcapping": 30.0}, "c.json", 16)


def _autograd_saved_bytes(layers, x) -> int:
    """Bytes of the distinct storages autograd keeps for one forward of
    ``layers`` in a row on ``x`` (parameters excluded): the reference a
    stage's saved bytes must equal."""
    params = {p.untyped_storage().data_ptr() for layer in layers for p in layer.parameters()}
    seen = {}

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in params:
            seen[key] = max(seen.get(key, 0), t.untyped_storage().nbytes())
        return t

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        for layer in layers:
            x = layer(x)
    return sum(seen.values())


@needs_torch
@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_stage_saved_bytes_equal_autograds_for_every_range(kind):
    """A stage of layers ``[i, j)`` saves ``sum saved - sum shared[i+1:j]``
    (Layer.shared_saved_bytes) -- on every range of a Linear/ReLU chain and
    a Conv/BatchNorm/ReLU/MaxPool chain, equal to what autograd keeps when
    the stage's layers run in a row (the tensor a ReLU keeps and the next
    layer keeps as its input counted once; layer by layer the chain sums to
    1.6 and 1.4 times that)."""
    torch.manual_seed(0)
    if kind == "mlp":
        model = nn.Sequential(*[m for _ in range(3) for m in (nn.Linear(64, 64), nn.ReLU())])
        x = torch.randn(8, 64)
    else:
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                              nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 8 * 8, 10))
        x = torch.randn(4, 3, 16, 16)
    prof = profile_module(model, x, batch_size=x.shape[0], warmup=0, repeats=1)
    saved = [lay.saved_bytes for lay in prof.layers]
    shared = [lay.shared_saved_bytes or 0.0 for lay in prof.layers]
    layers = list(model)
    inputs = [x]
    with torch.no_grad():
        for layer in layers:
            inputs.append(layer(inputs[-1]))
    L = len(layers)
    for i in range(L):
        for j in range(i + 1, L + 1):
            x_i = inputs[i].clone().requires_grad_(i > 0)
            assert sum(saved[i:j]) - sum(shared[i + 1:j]) == _autograd_saved_bytes(layers[i:j], x_i), (i, j)
    whole = _autograd_saved_bytes(layers, x)
    assert sum(saved) > 1.3 * whole  # what summing the layers alone would count
