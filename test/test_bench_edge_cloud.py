"""`edge-llm-ros bench --scenario edge-cloud`: the report's arithmetic on made-up goals, bad input, and one
real run (two node processes over an emulated 50 ms link, one short prompt) through the command line."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
from support import REPO

from edge_llm_ros.client import Stats
from edge_llm_ros.core.edge_cloud import projected_speedup
from edge_llm_ros.core.engine.llama_backend import llama_cpp_available
from edge_llm_ros.tools import bench
from edge_llm_ros.tools import bench_edge_cloud as ec


def goal(tokens: int, wall_s: float, tau: float, draft_s: float = 0.0, verify_s: float = 0.0, miss: float = 0.0,
         exit_layer: float = 0.0):
    stats = Stats(tau=tau, draft_time_s=draft_s, verify_time_s=verify_s, cache_miss_rate=miss,
                  avg_exit_layer=exit_layer, ttft_s=0.1)
    return ec.Goal(list(range(tokens)), wall_s, stats)


def test_summary_splits_each_round_and_appendix_b_uses_the_measured_c_and_r():
    # sd: 2 prompts x 30 tokens at tau 1.5 -> 40 rounds; 4 s drafting, 4 s verifying, 12 s wall
    sd = ec.summarize([goal(30, 6.0, 1.5, 2.0, 2.0), goal(30, 6.0, 1.5, 2.0, 2.0)], gamma=4)
    assert sd["ms_per_token"] == pytest.approx(200.0) and sd["rounds"] == pytest.approx(40)
    assert sd["tau"] == pytest.approx(1.5)
    assert sd["draft_ms_per_round"] == pytest.approx(100.0) and sd["verify_ms_per_round"] == pytest.approx(100.0)
    assert sd["link_ms_per_round"] == pytest.approx(100.0)
    assert sd["draft_ms_per_token_drafted"] == pytest.approx(25.0)
    # fsd: miss rate 0.25 and 0.75 over 20 rounds each -> 0.5; exits 24 (15 hit rounds) and 8 (5 hit rounds)
    fsd = ec.summarize([goal(30, 4.0, 1.5, miss=0.25, exit_layer=24), goal(30, 4.0, 1.5, miss=0.75, exit_layer=8)], 4)
    assert fsd["cache_miss_rate"] == pytest.approx(0.5) and fsd["avg_exit"] == pytest.approx(20.0)
    ar = ec.summarize([goal(60, 9.0, 1.0)], gamma=0)
    assert ar["draft_ms_per_token_drafted"] is None and ar["avg_exit"] is None
    modes = {"ar": ar, "sd": sd, "fsd": fsd}
    s = ec.speedups(modes)
    assert s["ar_to_sd"] == pytest.approx(150 / 200) and s["sd_to_fsd"] == pytest.approx(200 / (8000 / 60))
    assert s["sd_to_ee"] is None
    b = ec.appendix_b(modes, gamma=4)
    assert b["c"] == pytest.approx(0.25) and b["r"] == pytest.approx(0.5)
    assert b["projected_sd_to_fsd"] == pytest.approx(projected_speedup(4, 0.25, 0.5)) == pytest.approx(2 / 1.5)
    assert b["measured_sd_to_fsd"] == pytest.approx(s["sd_to_fsd"])
    assert b["table4_sd_ms_per_token"] == pytest.approx((100 + 100 + 100) / 1.5)  # 2 T_c + gamma T_p + T_q


PROMPTS = [ec.BenchPrompt("a", "chat", "first prompt"), ec.BenchPrompt("b", "chat", "second prompt")]


def test_second_backend_shares_ar_as_reference_and_the_ratios_compare_the_backends():
    """torch drafts at 25 ms per drafted token, llama.cpp at 5 (sd: 2 x 30 tokens, 40 rounds of 4);
    llama.cpp's modes are checked against torch's ar and its speedups use that ar."""
    ar = [goal(30, 3.0, 1.0), goal(30, 3.0, 1.0)]
    torch_goals = {"ar": ar, "sd": [goal(30, 6.0, 1.5, 2.0, 2.0)] * 2, "ee": [goal(30, 4.0, 1.5, 1.0, 2.0)] * 2}
    torch_run = ec.report_backend(torch_goals, PROMPTS, 4)
    assert torch_run["draft_ms_per_token"] == pytest.approx(25.0) and torch_run["lossless"] is True
    reference = {"goals": ar, "summary": torch_run["ar"]}
    wrong = ec.Goal([1] * 30, 3.0, goal(30, 3.0, 1.5).stats)  # differs from ar on the second prompt
    llama_goals = {"sd": [goal(30, 4.0, 1.5, 0.4, 2.0)] * 2, "ee": [goal(30, 3.0, 1.5, 0.2, 2.0), wrong]}
    llama_run = ec.report_backend(llama_goals, PROMPTS, 4, reference)
    assert "ar" not in llama_run and llama_run["draft_ms_per_token"] == pytest.approx(5.0)
    assert llama_run["speedup"]["ar_to_sd"] == pytest.approx(100 / (8000 / 60))  # the shared ar: 100 ms/token
    assert llama_run["lossless"] is False and llama_run["mismatches"] == [{"mode": "ee", "prompt": "b"}]
    ratio = ec.compare_backends(torch_run, llama_run, ["ar", "sd", "ee"])
    assert ratio["draft_ms_per_token"] == pytest.approx(5.0)
    assert ratio["ms_per_token"] == {"sd": pytest.approx(6 / 4), "ee": pytest.approx(4 / 3)}
    no_ar = ec.report_backend({"sd": torch_goals["sd"]}, PROMPTS, 4)  # nothing to compare with
    assert no_ar["lossless"] is None and no_ar["speedup"]["ar_to_sd"] is None


def made_up_report(backends: list[str]) -> dict:
    """Two RTTs, modes ar, sd, ee on each backend in ``backends`` (the layout run_scenario writes)."""
    ar = [goal(30, 3.0, 1.0)]
    goals = {"torch": {"sd": [goal(30, 6.0, 1.5, 2.0, 2.0)], "ee": [goal(30, 4.0, 1.8, 1.0, 2.0, miss=0.3,
                                                                           exit_layer=20)]},
             "llama.cpp": {"sd": [goal(30, 4.5, 1.5, 0.4, 2.0)], "ee": [goal(30, 3.6, 1.8, 0.2, 2.0, miss=0.3,
                                                                              exit_layer=20)]}}
    runs = []
    for rtt in (10.0, 50.0):
        run = {"rtt_ms": rtt, "bandwidth_mbps": 100.0, "draft_backend": backends[0],
               **ec.report_backend({"ar": ar, **goals[backends[0]]}, PROMPTS[:1], 4)}
        for backend in backends[1:]:
            run[ec.backend_key(backend)] = ec.report_backend(goals[backend], PROMPTS[:1], 4,
                                                             {"goals": ar, "summary": run["ar"]})
        if len(backends) == 2:
            run["torch_over_llama_cpp"] = ec.compare_backends(run, run["llama_cpp"], ["ar", "sd", "ee"])
        runs.append(run)
    return {"label": ec.LABEL, "deployment": {"gamma": 4}, "prompts": [{}], "max_new_tokens": 30,
            "modes": ["ar", "sd", "ee"], "draft_backends": backends, "runs": runs}


def test_table_and_plot(tmp_path):
    report = made_up_report(["torch", "llama.cpp"])
    table = ec.format_table(report)
    lines = table.splitlines()
    assert "emulated link" in lines[0] and "draft on torch, llama.cpp" in lines[0]
    rows = [line.split() for line in lines if line.split()[:2] == ["50", "100"]]
    assert rows[0][2:6] == ["torch", "100.0", "200.0", "133.3"] and rows[0][-1] == "yes"
    assert rows[1][2:6] == ["llama.cpp", "100.0", "150.0", "120.0"] and rows[1][-1] == "yes"  # ar: torch's
    assert rows[1][6] == "0.67"  # AR>SD against the shared ar
    # the comparison: draft ms per drafted token 25 (torch) vs 5 (llama.cpp), latency ratios per mode
    assert rows[2] == ["50", "100", "25.00", "5.00", "5.00", "1.33", "1.11"]
    png = tmp_path / "s.png"
    ec.plot(report, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_table_of_one_backend_has_no_comparison():
    table = ec.format_table(made_up_report(["llama.cpp"]))
    rows = [line.split() for line in table.splitlines() if line.split()[:2] == ["50", "100"]]
    assert len(rows) == 1 and rows[0][2:6] == ["llama.cpp", "100.0", "150.0", "120.0"]
    assert "torch vs llama.cpp" not in table


def test_pinning_puts_each_node_on_a_core_of_its_own(monkeypatch):
    monkeypatch.setattr(ec.os, "sched_getaffinity", lambda pid: {3, 1, 2})
    assert ec.node_cores(True) == {"verifier_node": 1, "draft_node": 2}
    assert ec.node_cores(False) is None
    monkeypatch.setattr(ec.os, "sched_getaffinity", lambda pid: {0})
    assert ec.node_cores(True) is None  # one core: nothing to pin apart


@pytest.mark.parametrize("argv, message", [
    (["--rtt", "ten"], "--rtt takes comma-separated numbers"),
    (["--bandwidth", "0"], "--bandwidth must be > 0"),
    (["--modes", "ar,beam"], "--modes: expected a subset"),
    (["--prompts", "9"], "--prompts must be in 1..6"),
    (["--json", "/no/such/folder/x.json"], "does not exist"),
    (["--set", "foo:=1"], "--set: unknown launch argument 'foo'"),
    (["--draft-backends", "torch,gpu"], "--draft-backends: expected a subset of torch,llama.cpp"),
    (["--draft-backends", "llama.cpp", "--draft", "shallow:4"], "--draft-backends llama.cpp: draft 'shallow:4' runs "
                                                                 "on torch"),
    (["--draft", "llama.cpp:/no/such.gguf"], "--draft-backends torch: draft 'llama.cpp:/no/such.gguf' runs on "
                                              "llama.cpp"),
    (["--draft", "exit:x", "--draft-backends", "torch"], "--draft-backends torch: bad draft spec 'exit:x'"),
])
def test_bad_input_is_one_error_line_and_exit_2(argv, message):
    out, err = io.StringIO(), io.StringIO()
    code = bench.main(["--scenario", "edge-cloud", *argv], out=out, err=err)
    assert code == 2 and out.getvalue() == ""
    assert len(err.getvalue().splitlines()) == 1 and message in err.getvalue(), err.getvalue()


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.timeout(660)
def test_quick_run_over_two_processes_writes_json_and_png(tmp_path):
    """The real thing, small: SmolLM2 in draft_node and verifier_node, RTT 50 ms, one prompt x 16 tokens,
    the draft on torch and (when llama-cpp-python is installed, the default) on llama.cpp."""
    path = tmp_path / "ec.json"
    proc = subprocess.run([sys.executable, "-m", "edge_llm_ros.tools.bench", "--scenario", "edge-cloud", "--quick",
                           "--rtt", "50", "--bandwidth", "100", "--json", str(path), "--no-progress"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(path.read_text())
    assert report["scenario"] == "edge-cloud" and report["label"] == "emulated link" and report["lossless"] is True
    [run] = report["runs"]
    assert run["rtt_ms"] == 50 and run["bandwidth_mbps"] == 100 and run["lossless"] is True
    for mode in ("ar", "sd", "fsd", "ee"):
        assert run[mode]["ms_per_token"] > 0 and run[mode]["tokens"] == 16, mode
    assert run["ar"]["tau"] == pytest.approx(1.0) and run["sd"]["tau"] >= 1.0
    assert 0.0 <= run["ee"]["cache_miss_rate"] <= 1.0 and run["ee"]["tau"] >= 1.0
    assert run["speedup"]["ar_to_sd"] > 0 and run["appendix_b"]["c"] > 0
    assert run["draft_backend"] == "torch" and run["draft_ms_per_token"] > 0
    if llama_cpp_available():
        assert report["draft_backends"] == ["torch", "llama.cpp"]
        llama = run["llama_cpp"]
        assert "ar" not in llama and llama["lossless"] is True  # checked against torch's ar
        for mode in ("sd", "fsd", "ee"):
            assert llama[mode]["ms_per_token"] > 0 and llama[mode]["tokens"] == 16, mode
        assert llama["draft_ms_per_token"] > 0 and llama["speedup"]["ar_to_sd"] > 0
        ratio = run["torch_over_llama_cpp"]
        assert ratio["draft_ms_per_token"] == pytest.approx(run["draft_ms_per_token"] / llama["draft_ms_per_token"])
        assert set(ratio["ms_per_token"]) == {"sd", "fsd", "ee"}
        assert "torch vs llama.cpp" in proc.stdout
    else:
        assert report["draft_backends"] == ["torch"] and "llama_cpp" not in run
    assert (tmp_path / "ec.png").read_bytes()[:4] == b"\x89PNG"
    assert "verifying /edge_llm/draft" in (tmp_path / "ec.log").read_text()  # the nodes' output is kept
    print("\n" + proc.stdout)
