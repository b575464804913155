"""`edge-llm-ros generate` and `bench`: tiny random model (byte-level tokenizer) for the tools'
behaviour, one real SmolLM2 run for `generate` greedy sd == ar."""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from edge_llm_ros.core.drafts.loading import LoadError, build_drafter, byte_tokenizer, load_target
from edge_llm_ros.core.engine.config import MODES, preset
from edge_llm_ros.core.engine.detokenize import IncrementalDecoder
from edge_llm_ros.core.engine.drafters import ModelDrafter, PromptLookupDrafter
from edge_llm_ros.core.engine.models import chat_prompt
from edge_llm_ros.tools import bench, generate
from edge_llm_ros.tools.loading import hf_view

REPO = Path(__file__).resolve().parents[1]

TINY = ["--tiny", "--threads", "1"]  # tiny kernels: a second OpenMP thread only adds contention


@pytest.fixture(scope="module")
def tiny():
    return load_target(None, tiny=True)  # the same cached object the tools' --tiny uses


def run_main(fn, argv):
    out, err = io.StringIO(), io.StringIO()
    code = fn(argv, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


# -- incremental decoding -----------------------------------------------------------------------


def test_incremental_decoder_never_splits_a_character():
    tok = byte_tokenizer()
    ids = tok("é€🤖a", add_special_tokens=False)["input_ids"]
    assert len(ids) == 2 + 3 + 4 + 1  # UTF-8 bytes, one token each
    decoder = IncrementalDecoder(tok)
    pieces = [decoder.push(t) for t in ids] + [decoder.finish()]
    assert [p for p in pieces if p] == ["é", "€", "🤖", "a"]  # never a half character (U+FFFD)


def test_incremental_decoder_pieces_concatenate_to_the_full_decode():
    tok = byte_tokenizer()
    rng = random.Random(0)
    special = [tok.convert_tokens_to_ids("<|im_start|>"), tok.eos_token_id]
    for _ in range(200):
        # valid text, random bytes (invalid UTF-8 too), and special tokens, mixed
        text = "".join(rng.choice(["a", " ", "é", "€", "🤖", "\n", "ü"]) for _ in range(rng.randint(0, 12)))
        ids = tok(text, add_special_tokens=False)["input_ids"]
        ids += [rng.choice([rng.randrange(256), *special]) for _ in range(rng.randint(0, 6))]
        if rng.random() < 0.3:
            rng.shuffle(ids)
        decoder = IncrementalDecoder(tok)
        streamed = "".join(decoder.push(t) for t in ids) + decoder.finish()
        assert streamed == tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False), ids


# -- generate -----------------------------------------------------------------------------------


def test_generate_streams_the_same_text_in_every_greedy_mode(tiny):
    texts = {}
    for mode in MODES:
        code, out, err = run_main(generate.main, ["Go to the kitchen", *TINY, "--mode", mode, "--max-new-tokens", "24"])
        assert code == 0, err
        assert err == ""
        texts[mode] = out
    assert len(set(texts.values())) == 1, texts
    ids = generate.prompt_ids(tiny, "Go to the kitchen", raw=False)
    assert ids == chat_prompt(tiny.tokenizer, "Go to the kitchen")
    text, tokens, stats = generate.stream_text(tiny, "Go to the kitchen", preset("ar", max_new_tokens=24),
                                               out=io.StringIO())
    assert texts["ar"] == (text if text.endswith("\n") else text + "\n")
    assert stats.new_tokens == len(tokens) <= 24


def test_generate_stats_raw_and_sampling(tiny):
    argv = ["robot, stop", *TINY, "--mode", "tree", "--max-new-tokens", "16", "--raw", "--stats",
            "--temperature", "0.8", "--top-k", "20", "--top-p", "0.9", "--seed", "7"]
    code, out1, err = run_main(generate.main, argv)
    assert code == 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stats: mode=tree draft=shallow:1 ")
    for field in ("tau=", "tokens/s=", "ttft=", "draft_time=", "verify_time=", "acceptance="):
        assert field in lines[0]
    code, out2, _ = run_main(generate.main, argv)
    assert code == 0 and out1 == out2  # a fixed seed reproduces the sample


@pytest.mark.parametrize(
    "argv, message",
    [
        (["hi", "--mode", "beam"], "unknown mode 'beam'"),
        (["hi", "--max-new-tokens", "0"], "max_new_tokens must be > 0"),
        (["hi", "--max-new-tokens", "-3"], "max_new_tokens must be > 0"),
        ([""], "prompt is empty"),
        (["   "], "prompt is empty"),
        (["x" * 400], "context window is 256"),
        (["hi", "--temperature", "-1"], "temperature must be a finite number >= 0"),
        (["hi", "--temperature", "nan"], "temperature must be a finite number >= 0 (0 = greedy), got nan"),
        (["hi", "--top-p", "nan"], "top_p must be in (0, 1] (1 = off), got nan"),
        (["hi", "--top-p", "1.5"], "top_p must be in (0, 1] (1 = off), got 1.5"),
        (["hi", "--seed", "-2"], "seed must be an integer in [0, 2**64)"),
        (["hi", "--draft", "shallow:x"], "bad draft spec"),
        (["hi", "--draft", "shallow:9", "--mode", "sd"], "K must be in [1, 2]"),
        (["hi", "--model", "/no/such/model.gguf"], "model not found"),
        (["hi", "--max-new-tokens", "many"], "invalid int value"),
        (["hi", "--mode", "tree", "--tree-width", "0"], "--tree-width must be >= 1"),
        ([], "required: prompt"),
    ],
)
def test_generate_bad_input_is_one_error_line_and_exit_2(argv, message):
    code, out, err = run_main(generate.main, [*argv, *TINY])
    assert code == 2
    assert out == ""
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and message in err, err


def test_shape_flags_override_the_preset(tiny):
    base = generate.config_from_args(generate.build_parser().parse_args(["hi", "--mode", "tree"]))
    args = generate.build_parser().parse_args(["hi", "--mode", "tree", "--tree-width", "3", "--tree-depth", "2"])
    config = generate.config_from_args(args)
    assert (config.tree_width, config.tree_depth) == (3, 2)
    assert (config.tree_branch, config.tree_expand) == (base.tree_branch, base.tree_expand)  # the rest: preset
    code, out, err = run_main(generate.main, ["hi", "--mode", "sd", "--gamma", "2", "--stats", *TINY])
    assert code == 0 and "mode=sd" in err


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_generate_exit_status_of_a_real_process():
    cmd = [sys.executable, "-m", "edge_llm_ros.tools.generate", "hi", "--mode", "nope", *TINY]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == "error: unknown mode 'nope'; expected one of ar, sd, tree, llmcad"


# -- drafters and the transformers view of the draft ---------------------------------------------


def test_every_core_means_every_core_this_process_may_run_on():
    """threads 0 ("every core") under taskset or a cpuset, as a robot reserves cores: the affinity's
    cores, not the machine's (os.cpu_count() would oversubscribe them)."""
    import os

    script = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
              "from edge_llm_ros.core.drafts.loading import set_threads; import torch; "
              "print(set_threads(None), torch.get_num_threads(), set_threads(3))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["1", "1", "3"], out
    from edge_llm_ros.core.drafts.loading import usable_cores

    assert usable_cores() == len(os.sched_getaffinity(0))


def test_draft_specs(tiny, tmp_path):
    assert isinstance(build_drafter("lookup", tiny).drafter, PromptLookupDrafter)
    d = build_drafter("shallow:1:100", tiny)
    assert isinstance(d.drafter, ModelDrafter) and d.drafter.vocab_ids.tolist() == list(range(100))
    assert d.spec == "shallow:1:100" and len(d.drafter.model.layer_ids) == 1
    with pytest.raises(LoadError, match="V must be"):
        build_drafter("shallow:1:0", tiny)
    empty = tmp_path / "trained"
    empty.mkdir()
    with pytest.raises(LoadError, match="cannot load draft"):
        build_drafter(str(empty), tiny)


def test_trained_draft_folders_and_the_default_go_through_load_drafter(tiny, tmp_path, monkeypatch):
    from edge_llm_ros.core.drafts import loading

    trained = tmp_path / "k2"
    trained.mkdir()
    (trained / "config.json").write_text(json.dumps({"format": "edge_llm_ros.draft/1"}))
    twin = ModelDrafter(tiny)
    calls = []

    def load_drafter(target, path=None):
        calls.append(path)
        if path is None:
            raise FileNotFoundError("no shipped draft")
        return twin

    monkeypatch.setattr(loading, "load_drafter", load_drafter)
    draft = build_drafter(str(trained), tiny)
    assert draft.drafter is twin and calls == [trained]
    fallback = build_drafter(None, tiny)  # nothing shipped: the untrained shallow draft, saying why
    assert fallback.spec == "shallow:1" and "no shipped draft" in fallback.description

    monkeypatch.setattr(loading, "load_drafter", lambda target, path=None: twin)
    assert build_drafter(None, tiny).spec == "trained"


def test_draft_model_directory_drafts_for_generate(tiny, tmp_path):
    """A model directory with the target's tokenizer is an independent draft (here: the target's twin)."""
    tiny.hf.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    texts = []
    for mode, extra in (("ar", []), ("sd", ["--draft", str(tmp_path)])):
        code, out, err = run_main(generate.main, ["hello", *TINY, "--mode", mode, "--max-new-tokens", "20", *extra,
                                                  "--stats"])
        assert code == 0, err
        texts.append(out)
    assert texts[0] == texts[1]
    assert "tau=" in err and "draft=" + str(tmp_path) in err


def test_hf_view_is_the_same_draft(tiny):
    shallow = tiny.truncated(1)
    view = hf_view(shallow)
    ids = torch.tensor([chat_prompt(tiny.tokenizer, "walk forward")])
    cache = shallow.new_cache(ids.shape[1])
    ours = shallow.forward(ids[0], torch.arange(ids.shape[1]), None, cache)  # [T, V]
    with torch.inference_mode():
        theirs = view(ids).logits[0]  # [T, V]
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    assert view.model.layers[0] is tiny.hf.model.layers[0]  # shared, not copied
    sub = hf_view(shallow, torch.arange(50))
    with torch.inference_mode():
        logits = sub(ids).logits[0, -1]
    assert torch.isinf(logits[50:]).all() and torch.allclose(logits[:50], theirs[-1, :50], atol=1e-4)


# -- bench --------------------------------------------------------------------------------------

ENTRY_KEYS = {"tokens_per_s", "tau", "ttft_s", "acceptance_rate", "draft_time_s", "verify_time_s", "new_tokens",
              "speedup_vs_hf_greedy", "speedup_vs_hf_assisted", "lossless"}


def test_bench_quick_writes_the_report_and_prints_the_table(tmp_path):
    path = tmp_path / "bench.json"
    code, out, err = run_main(bench.main, ["--quick", *TINY, "--json", str(path)])
    assert code == 0, err
    report = json.loads(path.read_text())
    assert list(report["modes"]) == ["ar", "sd", "tree", "llmcad", "hf_greedy", "hf_assisted"]
    for name, entry in report["modes"].items():
        assert ENTRY_KEYS <= set(entry), name
        assert isinstance(entry["tokens_per_s"], float) and entry["tokens_per_s"] > 0
        assert isinstance(entry["tau"], float) and entry["tau"] >= 1.0
        assert isinstance(entry["new_tokens"], int) and entry["new_tokens"] > 0
        assert entry["lossless"] is True, (name, entry["mismatches"])
        assert entry["ttft_s"] > 0 and entry["verify_time_s"] > 0
        assert len(entry["per_prompt"]) == 2
    modes = report["modes"]
    assert modes["hf_greedy"]["speedup_vs_hf_greedy"] == 1.0 and modes["hf_assisted"]["speedup_vs_hf_assisted"] == 1.0
    assert modes["ar"]["tau"] == 1.0 and modes["hf_greedy"]["tau"] == 1.0
    assert modes["sd"]["acceptance_rate"] is not None and 0.0 <= modes["sd"]["acceptance_rate"] <= 1.0
    assert all(modes[m]["new_tokens"] == modes["hf_greedy"]["new_tokens"] for m in modes)
    assert report["lossless"] is True
    assert report["machine"]["cpu_count"] >= 1 and report["machine"]["torch_threads"] == 1
    assert report["max_new_tokens"] == bench.QUICK_MAX_NEW_TOKENS and len(report["prompts"]) == 2
    assert report["draft"]["spec"] == "shallow:1" and report["model"] == "tiny-random-llama" and report["date"]
    assert "same 1-layer draft" in report["hf_assisted"]
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("mode "))
    assert "tok/s" in header and "xhf_greedy" in header and "tau" in header and "xllama_ar" in header
    for name in modes:
        assert any(line.startswith(name + " ") and line.rstrip().endswith("yes") for line in lines), name


def test_bench_sampled_section_and_lookup_draft(tmp_path):
    path = tmp_path / "b.json"
    argv = ["--quick", *TINY, "--modes", "ar,sd", "--max-new-tokens", "8", "--sampled", "--draft", "lookup",
            "--json", str(path)]
    code, out, err = run_main(bench.main, argv)
    assert code == 0, err
    report = json.loads(path.read_text())
    assert list(report["modes"]) == ["ar", "sd", "hf_greedy", "hf_assisted"]
    sampled = report["sampled"]["modes"]
    assert list(sampled) == ["ar", "sd", "hf_sample", "hf_assisted"]
    assert all(e["lossless"] is None and e["tokens_per_s"] > 0 for e in sampled.values())
    assert sampled["sd"]["config"]["temperature"] == bench.SAMPLING["temperature"]
    assert "prompt lookup" in report["hf_assisted"] and "[sampled]" in out


def test_bench_reports_a_lossless_failure_loudly(monkeypatch):
    real = bench.run_engine

    def corrupt_sd(target, ids, config, drafter):
        run = real(target, ids, config, drafter)
        if config.mode == "sd":
            run.tokens[-1] = (run.tokens[-1] + 1) % target.vocab_size
        return run

    monkeypatch.setattr(bench, "run_engine", corrupt_sd)
    code, out, err = run_main(bench.main, ["--quick", *TINY, "--modes", "ar,sd", "--max-new-tokens", "6"])
    assert code == 1
    assert "LOSSLESS FAILURE: sd differs from hf_greedy on prompt robot_short at token 5" in err
    assert any(line.startswith("sd ") and line.rstrip().endswith("NO") for line in out.splitlines())
    assert any(line.startswith("ar ") and line.rstrip().endswith("yes") for line in out.splitlines())


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--modes", "ar,beam"], "unknown mode 'beam'"),
        (["--modes", ","], "--modes is empty"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be > 0"),
        (["--json", "/no/such/folder/out.json"], "does not exist"),
        (["--draft", "shallow:1:x"], "bad draft spec"),
        (["--gamma", "0"], "--gamma must be >= 1"),
        (["--bogus"], "unrecognized arguments"),
    ],
)
def test_bench_bad_input_is_one_error_line_and_exit_2(argv, message):
    code, out, err = run_main(bench.main, ["--quick", *TINY, *argv])
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and message in err, err


# -- the real model -----------------------------------------------------------------------------


def test_smollm2_generate_sd_prints_the_same_text_as_ar():
    texts = {}
    for mode in ("ar", "sd"):
        # One thread: on a shared 2-core machine a second OpenMP thread can stall 10x behind a busy core.
        code, out, err = run_main(generate.main, ["Name three things a robot dog can do.", "--mode", mode,
                                                  "--max-new-tokens", "16", "--stats", "--threads", "1"])
        assert code == 0, err
        assert f"stats: mode={mode} " in err and "new_tokens=16 " in err
        texts[mode] = out
    assert texts["sd"] == texts["ar"]
    assert len(texts["ar"].strip()) > 10  # real words, decoded


def test_bench_llama_cpp_rows_on_the_real_model(tmp_path):  # bounds no time: the parallel pass
    """The llama.cpp rows of the engine bench: llama.cpp's own generation (the llama_ros baseline) and our
    modes on the llama.cpp backend, compared with it token for token, in the same run."""
    path = tmp_path / "b.json"
    code, out, err = run_main(bench.main, ["--quick", "--threads", "1", "--modes", "ar,sd,tree", "--max-new-tokens",
                                           "12", "--json", str(path)])
    assert code == 0, err
    modes = json.loads(path.read_text())["modes"]
    assert list(modes)[-4:] == ["ar_llama_cpp", "sd_llama_cpp", "tree_llama_cpp", bench.LLAMA_CPP_AR]
    for name in ("ar_llama_cpp", "sd_llama_cpp", "tree_llama_cpp", bench.LLAMA_CPP_AR):
        assert modes[name]["lossless"] is True and modes[name]["new_tokens"] == 24, name
        assert modes[name]["speedup_vs_llama_cpp_ar"] > 0
    assert modes["sd_llama_cpp"]["tau"] > 1.0 and modes[bench.LLAMA_CPP_AR]["speedup_vs_llama_cpp_ar"] == 1.0
    assert any(line.startswith("llama_cpp_ar ") for line in out.splitlines())


# -- plan --device --------------------------------------------------------------------------------


# The plan follows the speeds it measures, and this test asserts none of them, nor which plan wins: only
# that every backend, draft and candidate is measured and scored and the best one chosen and saved.
# So it runs in the parallel pass (a fresh-clone run, 2026-11-29: 40 s alone in the serial one).
def test_plan_device_quick_measures_both_backends_and_saves_the_plan(tmp_path):
    from edge_llm_ros.tools import plan

    path = tmp_path / "plan.json"
    code, out, err = run_main(plan.main, ["--device", "--quick", "--threads", "1", "--out", str(path)])
    assert code == 0, err
    saved = json.loads(path.read_text())
    assert set(saved["row_costs_ms"]) == {"torch", "llama.cpp"}
    assert all([int(n) for n in c] == list(plan.QUICK_ROWS) and min(c.values()) > 0
               for c in saved["row_costs_ms"].values())
    assert saved["choice"] == max(saved["candidates"], key=lambda c: c["tokens_per_s"])
    widths = [s.width for s in plan.TREE_SHAPES]
    assert all([int(w) for w in c] == widths and min(c.values()) > 0 for c in saved["tree_costs_ms"].values())
    assert out.rstrip().splitlines()[-1].startswith("plan: mode ")
    # both drafters: cost per token, tau per gamma and per tree shape, scored on both backends
    assert [d["backend"] for d in saved["drafts"]] == ["torch", "llama.cpp"]
    for d in saved["drafts"]:
        assert set(d["tau"]) == {str(g) for g in range(1, plan.MAX_GAMMA + 1)} and d["ms_per_token"] > 0
        assert all(t >= 1.0 for t in d["tau"].values())
        assert [t["tree"]["width"] for t in d["trees"]] == widths
        assert all(t["tau"] >= 1.0 and t["draft_ms"] > 0 for t in d["trees"])
    scored = {(c["backend"], c["mode"], c["draft_backend"]) for c in saved["candidates"]}
    assert scored == {(b, m, d) for b in ("torch", "llama.cpp") for m, d in
                      [("ar", None)] + [(m, d) for m in ("sd", "tree") for d in ("torch", "llama.cpp")]}
    assert saved["draft_backend"] == (saved["choice"]["draft_backend"]
                                      or min(saved["drafts"], key=lambda d: d["ms_per_token"])["backend"])
    from edge_llm_ros.core.engine.models import default_model_path
    from edge_llm_ros.core.planning.device_plan import load_plan

    read = load_plan(path, default_model_path())  # what generate and the nodes read
    assert (read.backend, read.mode, read.threads) == (saved["choice"]["backend"], saved["choice"]["mode"], 1)


def test_a_benchs_router_and_environment_are_as_they_were_once_it_is_done(monkeypatch):
    """A bench runs in a process that may go on (a test worker): the router it starts is stopped and
    EDGE_LLM_ZENOH_ROUTER, which every node it launched inherited, names the old router again."""
    import os

    from edge_llm_ros.runtime.router import ENDPOINT_ENV, router_reachable
    from edge_llm_ros.tools.deployment import environment, local_router

    monkeypatch.setenv(ENDPOINT_ENV, "tcp/127.0.0.1:7447")
    with local_router("test-router") as endpoint:
        assert os.environ[ENDPOINT_ENV] == endpoint and router_reachable(endpoint)
    assert os.environ[ENDPOINT_ENV] == "tcp/127.0.0.1:7447"
    assert not router_reachable(endpoint)
    monkeypatch.delenv(ENDPOINT_ENV)
    with pytest.raises(RuntimeError, match="a bench failed"), environment(**{ENDPOINT_ENV: endpoint}):
        raise RuntimeError("a bench failed")
    assert ENDPOINT_ENV not in os.environ
