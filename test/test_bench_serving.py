"""`edge-llm-ros bench --scenario serving`: the schedule, the report's arithmetic on made-up requests,
the raw batch loop's bookkeeping on a fake LlamaBatch, bad input, and one real run of the launched
pipeline through the command line."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest
from support import REPO, require

from edge_llm_ros.errors import Status
from edge_llm_ros.tools import bench
from edge_llm_ros.tools import bench_serving as bs

PROMPTS = [bs.BenchPrompt(f"p{i}", "chat", f"prompt {i}") for i in range(3)]
EOS = 99


def test_schedule_gives_concurrent_clients_different_prompts_and_cycles():
    assert bs.schedule(2, 3, 6) == [[0, 2, 4], [1, 3, 5]]
    plan = bs.schedule(4, 2, 6)
    assert [p[0] for p in plan] == [0, 1, 2, 3] and [p[1] for p in plan] == [4, 5, 0, 1]
    assert bs.schedule(1, 3, 2) == [[0, 1, 0]]


def test_percentile_interpolates_like_numpy():
    values = [0.5, 0.1, 0.3, 0.9, 0.2, 0.7, 0.4]
    for q in (0, 50, 95, 100):
        assert bs.percentile(values, q) == pytest.approx(np.percentile(values, q))
    assert bs.percentile([2.0], 95) == 2.0 and bs.percentile([], 50) is None


def test_same_tokens_ignores_only_a_trailing_eos_on_one_side():
    assert bs.same_tokens([1, 2, EOS], [1, 2, EOS], EOS) and bs.same_tokens([1, 2], [1, 2, EOS], EOS)
    assert not bs.same_tokens([1, 3], [1, 2], EOS) and not bs.same_tokens([1, 2, 3], [1, 2], EOS)
    assert not bs.same_tokens([1, 2], [1, 2, EOS], None)
    assert bs.first_difference([1, 2, 3], [1, 4, 3]) == 1 and bs.first_difference([1, 2], [1, 2, 3]) == 2


def request(client, index, prompt, sent, first, done, tokens, status=Status.OK, error=""):
    return bs.Request(client, index, prompt, sent, first, done, tuple(tokens), status, error)


REFS = [[1] * 10, [2] * 10, [3] * 10]


def test_summary_of_a_client_count():
    """Two clients: 40 tokens from t=0 to t=4 -> 10 tok/s aggregate; per request 10/1, 10/2, 10/2, 10/2."""
    requests = [request(0, 0, 0, 0.0, 0.1, 1.0, REFS[0]), request(0, 1, 2, 1.0, 1.3, 3.0, REFS[2]),
                request(1, 0, 1, 0.0, 0.2, 2.0, REFS[1]), request(1, 1, 0, 2.0, 2.4, 4.0, REFS[0])]
    s = bs.summarize_node(requests, REFS, PROMPTS, EOS)
    assert s["requests"] == 4 and s["tokens"] == 40 and s["wall_s"] == pytest.approx(4.0)
    assert s["aggregate_tokens_per_s"] == pytest.approx(10.0)
    assert s["per_request_tokens_per_s"] == pytest.approx((10 + 5 + 5 + 5) / 4)
    assert s["ttft_p50_s"] == pytest.approx(np.percentile([0.1, 0.3, 0.2, 0.4], 50))
    assert s["ttft_p95_s"] == pytest.approx(np.percentile([0.1, 0.3, 0.2, 0.4], 95))
    assert s["exact"] is True and s["inexact"] == []


def test_inexact_requests_are_listed_with_why():
    requests = [request(0, 0, 0, 0.0, 0.1, 1.0, [1] * 4 + [7] * 6),  # differs at token 4
                request(0, 1, 1, 1.0, None, None, [], status=None, error="rejected"),
                request(1, 0, 2, 0.0, None, 2.0, [], status=Status.FAILED, error="error")]
    s = bs.summarize_node(requests, REFS, PROMPTS, EOS)
    assert s["exact"] is False and s["ttft_p50_s"] == pytest.approx(0.1)
    assert [(i["client"], i["request"], i["prompt"]) for i in s["inexact"]] == [(0, 0, "p0"), (0, 1, "p1"),
                                                                                  (1, 0, "p2")]
    assert s["inexact"][0]["first_difference"] == 4 and s["inexact"][1]["error"] == "rejected"
    assert s["inexact"][2]["status"] == Status.FAILED == 7
    none = bs.summarize_node([request(0, 0, 0, 0.0, None, None, [], None, "x")], REFS, PROMPTS, EOS)
    assert none["aggregate_tokens_per_s"] == 0.0 and none["per_request_tokens_per_s"] is None


def made_up_report() -> dict:
    runs = [{"clients": n, "requests": 2 * n, "aggregate_tokens_per_s": tps, "llama_cpp_batch_tokens_per_s": batch,
             "llama_cpp_batch_exact": True, "per_request_tokens_per_s": tps / n, "ttft_p50_s": 0.05 * n,
             "ttft_p95_s": 0.08 * n, "exact": n != 4, "inexact": [] if n != 4 else [{"client": 3}]}
            for n, tps, batch in ((1, 40.0, 50.0), (2, 60.0, 80.0), (4, 80.0, None))]
    report = {"scenario": "serving", "label": "2-core CPU, SmolLM2-135M-Instruct.Q4_1, greedy",
              "machine": {"cpu": "AMD EPYC", "cores": 2, "llama_cpp_python": "0.3.36", "threads": 2},
              "deployment": {"nodes": ["planner_node", "serve_node", "monitor"]}, "max_new_tokens": 16,
              "requests_per_client": 2, "baseline": {"tokens_per_s": 50.0}, "runs": runs}
    bs.add_ratios(report)
    return report


def test_ratios_table_and_plot(tmp_path):
    report = made_up_report()
    one, two, four = report["runs"]
    assert report["one_client_over_baseline"] == pytest.approx(0.8)
    assert one["node_over_llama_cpp_batch"] == pytest.approx(0.8)
    assert two["node_over_llama_cpp_batch"] == pytest.approx(0.75)
    assert four["node_over_llama_cpp_batch"] is None  # nothing to compare with
    assert [r["over_one_client"] for r in report["runs"]] == pytest.approx([1.0, 1.5, 2.0])
    assert two["over_baseline"] == pytest.approx(1.2) and two["llama_cpp_batch_over_baseline"] == pytest.approx(1.6)
    table = bs.format_table(report)
    lines = table.splitlines()
    assert "2-core CPU, SmolLM2-135M-Instruct.Q4_1, greedy" in lines[0] and "50.0 tok/s" in lines[1]
    assert lines[2].split()[:3] == ["clients", "reqs", "node"]
    assert lines[3].split() == ["1", "2", "40.0", "50.0", "0.80", "1.00", "0.80", "40.0", "50", "80", "yes"]
    assert lines[5].split()[-1] == "NO" and lines[5].split()[3] == "-"
    json.dumps(report)  # serializable as it stands
    require("matplotlib", "pip install -e .[bench] (make install)")
    png = tmp_path / "s.png"
    bs.plot({**report, "runs": report["runs"][:2]}, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_prefill_chunks_pack_prompts_within_n_batch():
    prompts = [list(range(5)), list(range(10, 17)), [20, 21]]
    chunks = bs.prefill_chunks(prompts, 6)
    assert all(sum(len(t) for _, t, _ in c) <= 6 for c in chunks)
    assert chunks == [[(0, [0, 1, 2, 3, 4], 0), (1, [10], 0)], [(1, [11, 12, 13, 14, 15, 16], 1)], [(2, [20, 21], 0)]]
    assert bs.prefill_chunks([[1, 2]], 512) == [[(0, [1, 2], 0)]]


class FakeBatch:
    """A LlamaBatch whose next token is a function of (sequence's prompt head, position): checks the
    loop's positions, row counts and drops without llama.cpp."""

    n_batch, vocab = 4, 128

    def __init__(self) -> None:
        self.seen: dict[int, list[int]] = {}  # sequence -> tokens decoded at positions 0..
        self.decodes, self.dropped = [], []

    def decode(self, work):
        assert sum(len(t) for _, t, _ in work) <= self.n_batch
        self.decodes.append(len(work))
        out = []
        for seq, tokens, first in work:
            held = self.seen.setdefault(seq, [])
            assert first == len(held), "positions must continue the sequence"
            held.extend(tokens)
            logits = np.zeros(self.vocab, dtype=np.float32)
            logits[EOS if held[0] == 9 and len(held) >= 3 else (held[0] * 10 + len(held)) % 90] = 1.0
            out.append(logits)
        return out

    def drop(self, seq):
        self.dropped.append(seq)
        self.seen.pop(seq, None)


def test_greedy_batch_prefills_then_steps_until_eos_or_the_limit():
    batch = FakeBatch()
    out = bs.greedy_batch(batch, [[1, 1, 1], [9, 9, 9], [2, 2]], max_new_tokens=3, eos=EOS)
    assert out == [[13, 14, 15], [EOS], [22, 23, 24]]  # prompt 1 ends at EOS after its prompt
    assert batch.decodes[:2] == [2, 2]  # 8 prompt rows in chunks of 4: (0, 1 part), (1 rest, 2)
    assert batch.decodes[2:] == [2, 2]  # then one row per unfinished sequence per step
    assert sorted(batch.dropped) == [0, 1, 2]


def test_raw_rows_in_waves_per_round_of_the_clients():
    batch = FakeBatch()
    ids = [[1, 1], [2, 2], [3, 3]]
    row, outputs = bs.run_llama_cpp_batch(batch, ids, bs.schedule(2, 2, 3), max_new_tokens=2, eos=None)
    assert [p for p, _ in outputs] == [0, 1, 2, 0] and row["tokens"] == 8 and row["tokens_per_s"] > 0


@pytest.mark.parametrize("argv, message", [
    (["--clients", "1,x"], "--clients takes comma-separated whole numbers"),
    (["--clients", "0"], "--clients takes numbers >= 1"),
    (["--max-new-tokens", "0"], "must be >= 1"),
    (["--threads", "0"], "--threads must be >= 1"),
    (["--json", "/no/such/folder/x.json"], "does not exist"),
    (["--model", "/no/such.gguf"], "model not found"),
    (["--set", "no_such_parameter:=1"], "unknown launch argument 'no_such_parameter'"),
])
def test_bad_input_is_one_error_line_and_exit_2(argv, message):
    out, err = io.StringIO(), io.StringIO()
    code = bench.main(["--scenario", "serving", *argv], out=out, err=err)
    assert code == 2 and out.getvalue() == ""
    assert len(err.getvalue().splitlines()) == 1 and message in err.getvalue(), err.getvalue()


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.timeout(960)
def test_quick_run_of_the_launched_pipeline_writes_json_and_png(tmp_path):
    """The real thing, small: the pipeline launched, 1, 2 and 4 clients x 2 requests x 16 tokens, every
    request exact against llama.cpp's sequential greedy output; then (--foxglove) 4 clients again with
    foxglove_bridge_node and a Foxglove client on every channel. The ratio with/without the bridge is
    the bench's to measure (its target makes the exit status 1 when missed), not this test's: on a run
    this short it is noise, so a miss of that target alone is accepted here."""
    require("llama_cpp", "make install (llama-cpp-python, the cpu extra)")
    path = tmp_path / "serving.json"
    proc = subprocess.run([sys.executable, "-m", "edge_llm_ros.tools.bench", "--scenario", "serving", "--quick",
                           "--foxglove", "--json", str(path), "--no-progress"],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    report = json.loads(path.read_text())
    from edge_llm_ros.tools.serving_report import failures

    assert proc.returncode == 0 or (proc.returncode == 1 and [f.split(":")[0] for f in failures(report)]
                                    == ["foxglove ratio"]), proc.stdout + proc.stderr
    fox = report["foxglove"]
    assert fox["clients"] == 4 and fox["exact"] is True and fox["channels"] > 0 and fox["messages"] > 0
    assert fox["tokens_per_s_with"] > 0 and fox["ratio"] > 0 and fox["bridge_cpu_s"] > 0 and "foxglove (4 clients" in proc.stdout
    assert report["scenario"] == "serving" and report["exact"] is True
    assert report["baseline"]["tokens_per_s"] > 0 and report["one_client_over_baseline"] > 0
    assert report["machine"]["cores"] and report["machine"]["llama_cpp_python"] and report["machine"]["threads"] >= 1
    assert "max_requests:=16" in report["deployment"]["launch_arguments"]
    assert [r["clients"] for r in report["runs"]] == [1, 2, 4]
    for run in report["runs"]:
        assert run["requests"] == 2 * run["clients"] and run["exact"] is True and run["inexact"] == []
        assert run["aggregate_tokens_per_s"] > 0 and run["llama_cpp_batch_tokens_per_s"] > 0
        assert run["llama_cpp_batch_exact"] is True and run["node_over_llama_cpp_batch"] > 0
        assert 0 < run["ttft_p50_s"] <= run["ttft_p95_s"] and run["per_request_tokens_per_s"] > 0
    assert report["runs"][0]["over_one_client"] == pytest.approx(1.0)
    assert (tmp_path / "serving.png").read_bytes()[:4] == b"\x89PNG" and "clients" in proc.stdout
