"""stage_node through real processes (issue 14): SmolLM2 split unevenly into two stage processes
(layers 0-10 and 11-29) on the embedded runtime, this test acting as the scheduler.

- A chat prompt in two pipelined prefill chunks into stage_0/in (the second sent before the first
  comes out), then one token per message: the argmax ids on stage_2/in are SmolLM2's greedy
  tokens by transformers' own generate on the same weights (test/references.py).
- A HiddenStates of the wrong width into stage 1 is answered on `verify` by a final VerifyResult
  naming the stage and the `shape` field, and logged; the next request is served.
- A request's rows sent again from prefix 0 are refused (its cache holds them); after a PruneInfo
  with `release` the same rows are served again, with the same output.
- A new request beyond `max_requests` is refused as busy; a release makes room.
- A request belongs to its sender (issue 30): rows into both stages, a prune and a release for a
  live request from another node are refused by each stage (counted on /diagnostics, logged), and
  the request goes on to the reference tokens.
- Parameters: `layers` with a gap is refused before anything loads (exit 2), a last stage that
  does not end at the model's last layer is refused at configure (exit 2), a launch file's slot
  beyond the stages exits at once (0); launch/stages.launch.py offers `layers`.
"""

from __future__ import annotations

import sys
import threading

import pytest
import torch
from hosts import host_for
from support import REPO, Diagnostics, Proc, cli, key_values, level_of, setup_budget, stamped_now, wait_until

pytestmark = pytest.mark.slow  # real node processes with SmolLM2

PARAMS = str(REPO / "config" / "stages.yaml")
SPLIT = ("0-10", "11-29")
PROMPT = "Name three things a robot needs to see."
MAX_NEW_TOKENS = 16
MAX_REQUESTS = 4
WIDTH = 576  # SmolLM2-135M's hidden size
WARN = 1  # DiagnosticStatus level
FOREIGN = "foreign messages refused"  # a stage's count on /diagnostics


def stage_cmd(*params: str, name: str = "stage_node") -> list[str]:
    overrides = [arg for p in params for arg in ("-p", p)]
    return [sys.executable, "-m", "edge_llm_ros.nodes.stage_node", "--ros-args", "-r", f"__node:={name}",
            "--params-file", PARAMS, *overrides]


def prompt_rows(request_id: str, ids: list[int], start: int = 0, step: int = 0):
    """Rows of token ids at positions start.. after ``start`` committed ones (causal: no mask)."""
    from edge_llm_ros.core.pipeline.stages import Rows

    return Rows(request_id, step, start, 0, torch.arange(start, start + len(ids)), torch.tensor(ids))


class Scheduler:
    """This test as the pipeline's scheduler: rows into any stage (naming its prune publisher, as
    the pipeline's client does), releases on `prune`, and the last stage's outputs and the
    VerifyResults on `verify` by (request id, round)."""

    def __init__(self, host, probe) -> None:
        from edge_llm_ros.nodes.ownership import gid_field

        self.HiddenStates = host.message("edge_llm_ros/msg/HiddenStates")
        self.PruneInfo = host.message("edge_llm_ros/msg/PruneInfo")
        self.inputs = [probe.create_publisher(self.HiddenStates, f"stage_{i}/in", 100) for i in range(len(SPLIT))]
        self.prune = probe.create_publisher(self.PruneInfo, "prune", 100)
        self.prune_gid = gid_field(host.publisher_gid(self.prune))
        self.answers: dict[tuple[str, int], object] = {}
        self.arrived = threading.Condition()
        probe.create_subscription(self.HiddenStates, f"stage_{len(SPLIT)}/in", self.on_answer, 100)
        probe.create_subscription(host.message("edge_llm_ros/msg/VerifyResult"), "verify", self.on_answer, 100)

    def on_answer(self, msg) -> None:
        with self.arrived:
            self.answers[msg.request_id, msg.round] = msg
            self.arrived.notify_all()

    def send(self, rows, stage: int = 0) -> None:
        from edge_llm_ros.nodes.wire import StageMessage

        self.inputs[stage].publish(self.HiddenStates(**StageMessage.from_rows(rows, stage).fields(),
                                                     prune_gid=self.prune_gid))

    def release(self, request_id: str) -> None:
        self.prune.publish(self.PruneInfo(request_id=request_id, release=True))

    def answer(self, request_id: str, round: int, timeout: float = 60.0):
        """The output or VerifyResult for a request's round (waited for)."""
        with self.arrived:
            if not self.arrived.wait_for(lambda: (request_id, round) in self.answers, timeout):
                raise AssertionError(f"no answer to request {request_id!r} round {round} within {timeout:g} s")
            return self.answers.pop((request_id, round))

    def tokens(self, request_id: str, round: int) -> list[int]:
        """The target's greedy token for each row of a round (the answer must not be an error)."""
        from edge_llm_ros.nodes.wire import StageMessage

        msg = self.answer(request_id, round)
        assert not getattr(msg, "error", ""), msg.error
        assert msg.stage == len(SPLIT) and stamped_now(msg)
        return StageMessage.from_msg(msg).to_rows(None).data.tolist()


@pytest.fixture(scope="module")
def processes(router_endpoint, request):
    """The two stage processes, started (not yet waited for)."""
    host = host_for(request)
    procs = [Proc(stage_cmd(f"index:={i}", f"count:={len(SPLIT)}", f"layers:={layers}", "threads:=1",
                            f"max_requests:={MAX_REQUESTS}", name=f"stage_{i}"), env=host.child_env)
             for i, layers in enumerate(SPLIT)]
    yield procs
    for proc in procs:
        proc.stop()


@pytest.fixture(scope="module")
def prompt_and_expected(processes, references):
    """The chat prompt's ids and transformers' own greedy tokens on the whole model (the reference,
    test/references.py), computed here while the stages load."""
    torch.set_num_threads(1)
    ids = list(references.chat_ids(PROMPT))
    return ids, references.transformers_greedy(ids, MAX_NEW_TOKENS)


@pytest.fixture(scope="module")
@setup_budget(390)
def scheduler(request, processes, prompt_and_expected):
    host = host_for(request)
    processes[0].wait_for_line("active: stage 0 of 2: embedding + layers 0-10, ", 180)
    processes[1].wait_for_line("active: stage 1 of 2: layers 11-29 + head, ", 180)
    probe = host.Node("stage_probe", namespace="edge_llm")
    try:
        scheduler = Scheduler(host, probe)
        scheduler.diagnostics = Diagnostics(probe, host.message("diagnostic_msgs/msg/DiagnosticArray"))
        wait_until(lambda: all(probe.count_subscribers(f"/edge_llm/stage_{i}/in") >= 1 for i in range(len(SPLIT)))
                   and probe.count_subscribers("/edge_llm/prune") >= 2
                   and probe.count_publishers("/edge_llm/verify") >= 2, 30, "the stages' topics")
        yield scheduler
    finally:
        probe.destroy_node()


def test_greedy_through_two_uneven_stage_processes_equals_ar(scheduler, prompt_and_expected):
    ids, expected = prompt_and_expected
    cut = len(ids) // 2
    scheduler.send(prompt_rows("greedy", ids[:cut], 0, step=0))
    scheduler.send(prompt_rows("greedy", ids[cut:], cut, step=1))  # pipelined: chunk 0 is still on its way
    assert len(scheduler.tokens("greedy", 0)) == cut
    out = scheduler.tokens("greedy", 1)[-1:]
    while len(out) < len(expected):
        step = len(out) + 1
        scheduler.send(prompt_rows("greedy", out[-1:], len(ids) + len(out) - 1, step))
        out += scheduler.tokens("greedy", step)
    assert out == expected
    scheduler.release("greedy")


def test_malformed_rows_are_answered_naming_the_stage_and_field(scheduler, processes, prompt_and_expected):
    from edge_llm_ros.core.pipeline.stages import Rows

    scheduler.send(Rows("bad", 3, 0, 0, torch.arange(3), torch.zeros(3, 16)), stage=1)
    answer = scheduler.answer("bad", 3)
    error = f"stage 1 (/edge_llm/stage_1): shape: expected [3, {WIDTH}] (rows, width {WIDTH}), got [3, 16]"
    assert answer.final and answer.error == error and stamped_now(answer)
    processes[1].wait_for_line(f"request 'bad' round 3: {error}", 10)
    ids, _ = prompt_and_expected
    scheduler.send(prompt_rows("after-bad", ids[:5]))
    assert len(scheduler.tokens("after-bad", 0)) == 5
    scheduler.release("after-bad")


def test_a_release_frees_the_cache_for_the_same_request_from_prefix_0(scheduler, prompt_and_expected):
    ids, _ = prompt_and_expected
    rows = prompt_rows("again", ids[:6])
    scheduler.send(rows)
    first = scheduler.tokens("again", 0)
    scheduler.send(rows)  # its cache holds these rows already
    refused = scheduler.answer("again", 0)
    assert refused.final and refused.error.startswith(
        "stage 0 (/edge_llm/stage_0): request again: rows of step 0 expect 0 cached rows"), refused.error
    scheduler.release("again")
    scheduler.send(rows)
    assert scheduler.tokens("again", 0) == first
    scheduler.release("again")


def foreign_refused(scheduler, stage: int, at_least: int = 0) -> int:
    """The count of foreign messages a stage refused, from its status on /diagnostics: the newest
    status, or the first that counts ``at_least``."""
    status = scheduler.diagnostics.status(f"stage_{stage}: stage", lambda s: int(key_values(s)[FOREIGN]) >= at_least,
                                          timeout=30)
    return int(key_values(status)[FOREIGN])


def test_rows_prunes_and_a_release_from_another_node_leave_a_live_request_alone(
        request, scheduler, processes, prompt_and_expected):
    """A process that read a live request's id (it is on `verify` whenever a stage refuses) sends,
    from its own node, the request's next rows into both stages, a prune that keeps nothing and a
    release. Each would cut or end the request; each stage refuses all three (not answered: that
    would end the request too), counts and logs them, and the request's tokens are the reference."""
    from edge_llm_ros.core.pipeline.stages import Rows
    from edge_llm_ros.nodes.wire import StageMessage

    ids, expected = prompt_and_expected
    host = host_for(request)
    forger = host.Node("forger", namespace="edge_llm")
    try:
        rows_into = [forger.create_publisher(scheduler.HiddenStates, f"stage_{i}/in", 100) for i in range(len(SPLIT))]
        prune = forger.create_publisher(scheduler.PruneInfo, "prune", 100)
        wait_until(lambda: all(pub.get_subscription_count() >= 1 for pub in rows_into)
                   and prune.get_subscription_count() >= len(SPLIT), 30, "the forger's publishers matched")
        before = [foreign_refused(scheduler, i) for i in range(len(SPLIT))]
        scheduler.send(prompt_rows("owned", ids))
        out = scheduler.tokens("owned", 0)[-1:]
        at = len(ids)  # the request's next position
        forged = [prompt_rows("owned", out, at, step=1), Rows("owned", 1, at, 0, torch.arange(at, at + 1),
                                                              torch.zeros(1, WIDTH))]
        for stage, rows in enumerate(forged):
            rows_into[stage].publish(scheduler.HiddenStates(**StageMessage.from_rows(rows, stage).fields()))
        prune.publish(scheduler.PruneInfo(request_id="owned", round=1, prefix_len=2))
        prune.publish(scheduler.PruneInfo(request_id="owned", release=True))
        for stage in range(len(SPLIT)):
            assert foreign_refused(scheduler, stage, before[stage] + 3) == before[stage] + 3
            processes[stage].wait_for_line("release for request 'owned' from publisher ", 10)
        assert "not the owner: request 'owned' belongs to another publisher" in processes[0].output
        while len(out) < len(expected):
            step = len(out)
            scheduler.send(prompt_rows("owned", out[-1:], at + len(out) - 1, step))
            out += scheduler.tokens("owned", step)
        assert out == expected
    finally:
        scheduler.release("owned")
        forger.destroy_node()


def served_once_room_is_made(scheduler, request_id: str, ids: list[int], timeout: float = 20.0) -> list[int]:
    """Send the rows, and again (a new round) while a stage answers busy, as its refusal asks. A
    release travels on `prune`, apart from the rows, so it may land after rows sent later: stage 0 may
    take a round's rows that stage 1, still full, refuses (a fresh-clone run, 2026-11-28). Then stage 0 holds them, so a
    retry first releases the request, as the pipeline's client does with a refused request, and a
    retry that overtakes that release is refused for its stale rows, and retried the same way."""
    import time

    deadline = time.monotonic() + timeout
    for round in range(10_000):
        scheduler.send(prompt_rows(request_id, ids, step=round))
        answer = scheduler.answer(request_id, round)
        error = getattr(answer, "error", "")  # a VerifyResult, or the last stage's output
        if not error:
            scheduler.answers[request_id, round] = answer
            return scheduler.tokens(request_id, round)
        stale = f"request {request_id}: rows of step {round} expect 0 cached rows"
        assert (": busy: " in error or stale in error) and time.monotonic() < deadline, error
        scheduler.release(request_id)
    raise AssertionError(f"{request_id} was never served")


def test_a_request_beyond_max_requests_is_refused_as_busy(scheduler, prompt_and_expected):
    ids, _ = prompt_and_expected
    held = [f"held-{i}" for i in range(MAX_REQUESTS)]
    for request_id in held:  # earlier tests' releases may still be on their way
        assert len(served_once_room_is_made(scheduler, request_id, ids[:2])) == 2
    scheduler.send(prompt_rows("one-too-many", ids[:2]))
    assert scheduler.answer("one-too-many", 0).error.startswith(
        f"stage 0 (/edge_llm/stage_0): busy: {MAX_REQUESTS} requests hold a cache here")
    # stage 0's status on /diagnostics: WARN for the refusal, its layers, the hop latency of what it served
    # (the WARN of the refusal's period: an earlier test's period may have warned of foreign messages)
    busy = scheduler.diagnostics.status(
        "stage_0: stage", lambda s: level_of(s) == WARN and "message(s) refused in the last 1 s" in s.message,
        timeout=30)
    values = key_values(busy)
    assert values["layers"] == "0-10"
    assert values["lifecycle state"] == "active" and float(values["resident MB"]) > 0
    assert int(values["requests holding a cache"]) >= 1
    # stage 1 is fed by stage 0, which stamps what it sends: its hop latency is measured
    hops = key_values(scheduler.diagnostics.status("stage_1: stage", timeout=30))
    assert hops["layers"] == "11-29" and float(hops["hop latency p50 s (last 60 s)"]) > 0, hops
    scheduler.release(held[0])
    assert len(served_once_room_is_made(scheduler, "one-too-many", ids[:2])) == 2
    for request_id in [*held[1:], "one-too-many"]:
        scheduler.release(request_id)


def test_each_stage_profiles_itself_on_request(request, scheduler):
    """Jupiter's per-device profile: `~/profile` times the stage's own layers (and head) per row count."""
    from edge_llm_ros import runtime as rt

    srv = rt.service("edge_llm_ros/srv/Profile")
    probe = host_for(request).Node("profile_probe", namespace="edge_llm")
    try:
        for i in range(len(SPLIT)):
            client = probe.create_client(srv, f"/edge_llm/stage_{i}/profile")
            assert client.wait_for_service(20)
            answer = client.call(srv.Request(token_counts=[1, 8], prefix_len=64, quick=True), timeout_sec=60)
            assert answer.success and list(answer.token_counts) == [1, 8], answer.message
            assert all(ms > 0 for ms in answer.latency_ms) and answer.device.startswith(f"stage {i} (")
    finally:
        probe.destroy_node()


@pytest.mark.timeout(300)
def test_bad_layers_are_refused_before_any_weights_load(router_endpoint):
    gap = Proc(stage_cmd("layers:=0-10,12-29", name="stage_0"))
    short = Proc(stage_cmd("index:=1", "count:=2", "layers:=11-28", name="stage_1"))
    beyond = Proc(stage_cmd("index:=2", "layers:=0-10,11-29", name="stage_2"))
    assert beyond.wait(60) == 2, beyond.output
    assert "error: parameter 'index' is 2, but layers gives 2 stages (0-10,11-29)" in beyond.lines, beyond.output
    assert gap.wait(60) == 2, gap.output
    assert "error: parameter 'layers' (0-10,12-29): layer 11 is in no stage" in gap.lines, gap.output
    assert short.wait(120) == 2, short.output
    assert ("error: stage 1 (the last of 2) must end at the model's last layer 29, its layers are 11-28"
            in short.lines), short.output


def test_the_launch_file_starts_one_node_per_range_and_refuses_a_gap(router_endpoint):
    shown = cli("launch", "stages", "-s", "--router", router_endpoint)
    assert shown.returncode == 0, shown.stderr
    layers = next(line for line in shown.stdout.splitlines() if line.startswith("layers:="))
    assert layers.startswith("layers:=0-10,11-29 ")
    from edge_llm_ros.runtime.launcher import apply_launch_args, load_plan

    plan = load_plan("stages")
    apply_launch_args(plan, ["layers:=0-7,8-19,20-29"])
    assert [node.name for node in plan.nodes] == ["stage_0", "stage_1", "stage_2", "draft_node"]
    refused = cli("launch", "stages", "layers:=0-7,9-29", "--router", router_endpoint)
    assert refused.returncode == 2
    assert "layers:=0-7,9-29: layer 8 is in no stage" in refused.stderr, refused.stderr
