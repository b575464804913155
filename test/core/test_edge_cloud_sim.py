"""The edge-cloud simulator (core/sim/edge_cloud.py): the real robot and server with simulated time.
Lossless in every mode, a hand-computed schedule reproduced for ar and sd, pre-drafting and
sending ahead paying off where they should (and never where the exits disagree), deterministic;
on tiny random models."""

import dataclasses

import pytest
import torch
from test_edge_cloud import identity_tail_target  # 3 layers whose last two add nothing

from edge_llm_ros.core.drafts.exits import ExitSet, build_exits
from edge_llm_ros.core.edge_cloud import EDGE_MODES, DraftRequest, EarlyExitDrafter, EarlyExitVerifier, VerifyOutcome
from edge_llm_ros.core.edge_cloud.records import outcome_bytes
from edge_llm_ros.core.engine.config import GenerationConfig, preset
from edge_llm_ros.core.engine.decoding import generate_all
from edge_llm_ros.core.engine.drafters import ModelDrafter
from edge_llm_ros.core.engine.models import tiny_llama
from edge_llm_ros.core.planning.costs import DraftCost, LayerProfile, Link
from edge_llm_ros.core.sim.edge_cloud import EdgeCloudCosts, simulate_edge_cloud

VOCAB, PROMPT = 64, [1, 2, 3, 4, 5]


def toy(**changes) -> EdgeCloudCosts:
    """Unit costs: every target layer 1 s whatever its rows, heads free, a draft forward 0.1 s, 10 ms
    one way, unlimited bandwidth, a core per thread."""
    costs = EdgeCloudCosts(layer_s=lambda layer, rows, cached: 1.0, draft_s=0.1, uplink=Link(0.01),
                           downlink=Link(0.01))
    return dataclasses.replace(costs, **changes)


def config_of(mode: str, tokens: int) -> tuple[GenerationConfig, bool, bool]:
    """(config, early_exits, send_ahead) of edge mode ``mode`` (EDGE_MODES), γ = 4."""
    drafting, early_exits, send_ahead = EDGE_MODES[mode]
    overrides = dict(tree_depth=3, tree_width=6, tree_branch=2, tree_expand=2) if drafting == "tree" else {}
    return GenerationConfig(mode=drafting, gamma=4, max_new_tokens=tokens, **overrides), early_exits, send_ahead


def simulate(verifier, robot, mode: str, costs: EdgeCloudCosts, tokens: int = 24):
    config, early_exits, send_ahead = config_of(mode, tokens)
    return simulate_edge_cloud(verifier, robot, PROMPT, config, costs, early_exits=early_exits,
                               send_ahead=send_ahead, request_id="r")


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab_size=VOCAB, hidden_size=32, num_layers=4, max_context=128, seed=0)


@pytest.fixture(scope="module")
def exits(target):
    """Exits after layers 0, 1, 2 with small random adapters (agreeing with the final now and then)."""
    exits = build_exits(target, (0, 1, 2), bottleneck=8)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in exits.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return exits


def robot_of(*models) -> EarlyExitDrafter:
    """A robot drafting with ``models``; all but one pre-draft on workers, as draft_node's
    predraft_workers + 1 drafters (one model: it also pre-drafts)."""
    return EarlyExitDrafter([ModelDrafter(m) for m in models], seed=0, workers=max(1, len(models) - 1))


@pytest.fixture
def robot(target):
    robot = robot_of(target.truncated(2), target.truncated(2))
    yield robot
    robot.close()


# -- lossless -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", list(EDGE_MODES))
def test_every_mode_commits_the_targets_greedy_tokens(target, exits, robot, mode):
    verifier = EarlyExitVerifier(target, exits)
    timeline = simulate(verifier, robot, mode, toy(cores=2))
    assert timeline.tokens == generate_all(target, PROMPT, preset("ar", max_new_tokens=24)).tokens
    assert len(timeline.times) == 24 and timeline.times == sorted(timeline.times) and timeline.tokens_per_s > 0
    stats = timeline.stats
    assert stats.finish_reason == "length" and timeline.rounds == stats.rounds == len(stats.accepted)
    assert timeline.server_busy_s > 0 and verifier.requests == [] and robot.requests == []
    if mode == "ar":
        assert stats.rounds == 24 and timeline.d0_busy_s == 0
    if mode in ("fsd", "ee"):
        assert stats.hits + stats.misses == stats.rounds - 1 and stats.predrafts > 0
    assert (stats.sent_ahead > 0) == (mode == "ee")


# -- a schedule computed by hand ----------------------------------------------------------------------------


def test_ar_schedule_by_hand(target):
    """The prompt goes up (10 ms); round 0 prefills 4 prompt rows (4 layers: 4 s) and runs the root
    (4 s): its token leaves at 8.01 and takes 1 s on the wire (the downlink carries exactly one
    outcome a second) and 10 ms: 9.02. Each next round starts when the last ends (4 s): 12.01 ->
    13.02, 16.01 -> 17.02. Nothing is drafted."""
    probe = VerifyOutcome("r", 0, True, 3, 1.0, [], [], 7, [0.5])  # a cloud round's outcome: one token
    costs = toy(downlink=Link(0.01, bandwidth_bps=8 * outcome_bytes(probe)))
    robot = robot_of(target.truncated(1))
    try:
        timeline = simulate(EarlyExitVerifier(target, None), robot, "ar", costs, tokens=3)
    finally:
        robot.close()
    assert timeline.times == pytest.approx([9.02, 13.02, 17.02])
    assert timeline.ttft_s == pytest.approx(9.02) and timeline.tokens_per_s == pytest.approx(2 / 8)
    assert timeline.server_busy_s == pytest.approx(16) and timeline.d0_busy_s == 0


def test_sd_schedule_by_hand(target):
    """The target drafts for itself, so every round accepts all γ = 4 and adds the bonus token.
    Round 0: drafted in 4 x 0.1 = 0.4 s, up at 0.41; prefill 4 s + 4 layers 4 s: final at 8.41, at
    the robot 8.42, which drafts round 1 (0.4 s) before its 5 tokens count: 8.82. Up at 8.83, 4 s
    of layers, final at 12.83, at the robot 12.84: the last 5 tokens, no draft."""
    robot = robot_of(target)
    try:
        timeline = simulate(EarlyExitVerifier(target, None), robot, "sd", toy(), tokens=10)
    finally:
        robot.close()
    assert timeline.stats.accepted == [4, 4]
    assert timeline.times == pytest.approx([8.82] * 5 + [12.84] * 5)
    assert timeline.tokens_per_s == pytest.approx(9 / (12.84 - 8.82))
    assert timeline.server_busy_s == pytest.approx(12) and timeline.d0_busy_s == pytest.approx(0.8)


def test_measured_costs_read_a_layer_profile():
    """Round 1 of a 4-token chain after 51 committed tokens: 5 rows over 50 cached, so every layer
    costs 0.035 s (bilinear between the grid's 0.03 and 0.04), an exit and the head 0.006 s each."""
    profile = LayerProfile(rows=[1, 5], cached=[0, 100], layer_s=[[0.01, 0.02], [0.03, 0.04]], head_s=[0.002, 0.006])
    costs = EdgeCloudCosts.measured(profile, DraftCost(0.001, 0.005), Link(0.025), Link(0.025), round_s=0.003)
    draft = DraftRequest("r", 1, [], 51, [5, 6, 7, 8], [-1, 0, 1, 2], [0.5] * 4)
    ready, total = costs.verification(draft, layers=range(4), exits=(1,))
    assert ready == {1: pytest.approx(0.003 + 2 * 0.035 + 0.006)}
    assert total == pytest.approx(0.003 + 4 * 0.035 + 0.006 + 0.006)
    assert (costs.draft_call_s, costs.draft_s) == (0.001, 0.005)


# -- where pre-drafting and sending ahead pay off -------------------------------------------------------------


class RolledExits(ExitSet):
    """The logit lens rolled by one token: its argmax differs at every row, so it never agrees."""

    def exit_logits(self, target, layer, hidden, vocab_ids=None):
        return super().exit_logits(target, layer, hidden, vocab_ids).roll(1, dims=-1)


@pytest.fixture(scope="module")
def tail():
    return identity_tail_target()


def tail_rates(tail, exits, costs: EdgeCloudCosts, modes=("sd", "fsd", "ee")) -> dict:
    """Each mode's timeline on the identity-tail target, drafted by an independent tiny model."""
    draft = tiny_llama(VOCAB, 32, 1, max_context=128, seed=3)
    out = {}
    for mode in modes:
        robot = robot_of(draft, draft)
        try:
            out[mode] = simulate(EarlyExitVerifier(tail, exits), robot, mode, costs)
        finally:
            robot.close()
    return out


def round_period(timeline) -> float:
    """Seconds between the second and the third round's tokens (full-depth drafts, past round 0)."""
    times = sorted(set(timeline.times))
    return times[2] - times[1]


@pytest.mark.parametrize("one_way, periods", [(0.01, dict(sd=3.42, fsd=3.02, ee=3.0)),
                                              (1.0, dict(sd=5.4, fsd=5.0, ee=3.4))], ids=["near", "far"])
def test_predrafting_hides_drafting_and_sending_ahead_hides_the_round_trip(tail, one_way, periods):
    """A slow server (3 layers of 1 s, the exit's outcome after the first) and an exit that always
    agrees: every pre-draft hits. A round of sd: drafting 0.4 s + up + 3 s + down. fsd: the pre-draft
    (0.4 s) starts when the exit's outcome arrives and is done before the final: up + 3 s + down.
    ee sends it ahead: it reaches the server 1 s + one way + 0.4 s + one way after the round
    started, and is verified once the round's 3 s are over (near: at once; far: 3.4 s)."""
    runs = tail_rates(tail, build_exits(tail, [0], bottleneck=4), toy(uplink=Link(one_way), downlink=Link(one_way)))
    assert runs["fsd"].tokens == runs["sd"].tokens == runs["ee"].tokens
    assert {mode: round_period(run) for mode, run in runs.items()} == pytest.approx(periods)
    for mode in ("fsd", "ee"):
        assert runs[mode].stats.hits == runs[mode].stats.rounds - 1 and runs[mode].stats.misses == 0
        assert runs[mode].tokens_per_s > runs["sd"].tokens_per_s
    assert runs["ee"].stats.sent_ahead == runs["ee"].stats.hits
    assert runs["ee"].tokens_per_s > (1.3 if one_way == 1.0 else 1.0) * runs["fsd"].tokens_per_s


def test_one_shared_core_leaves_little_to_hide(tail):
    """On one core the pre-draft waits for the verification it should overlap: it starts when the
    server's 3 s are over, 10 ms before the final reaches the robot, which waits for it. A round of
    fsd is sd's (0.4 + 0.01 + 3 + 0.01 s) less that one-way latency."""
    runs = tail_rates(tail, build_exits(tail, [0], bottleneck=4), toy(cores=1), modes=("sd", "fsd"))
    assert runs["fsd"].stats.hits == runs["fsd"].stats.rounds - 1
    assert round_period(runs["sd"]) == pytest.approx(3.42) and round_period(runs["fsd"]) == pytest.approx(3.41)


def test_exits_that_never_agree_never_hit(tail):
    lens = build_exits(tail, [0], bottleneck=4)
    rolled = RolledExits(lens.config, lens.adapters, lens.vocab_ids)
    runs = tail_rates(tail, rolled, toy(), modes=("fsd", "ee"))
    expected = generate_all(tail, PROMPT, preset("ar", max_new_tokens=24)).tokens
    for run in runs.values():
        assert run.tokens == expected and run.stats.predrafts > 0
        assert run.stats.hits == run.stats.sent_ahead == 0 and run.stats.misses == run.stats.rounds - 1


# -- determinism ----------------------------------------------------------------------------------------------


def test_two_runs_give_identical_timelines(target, exits, robot):
    verifier = EarlyExitVerifier(target, exits)
    costs = toy(cores=2, downlink=Link(0.02, 1e5))
    first, second = (simulate(verifier, robot, "ee", costs) for _ in range(2))
    assert first.tokens == second.tokens and first.times == second.times
    assert first.stats.as_dict() == second.stats.as_dict() and first.busy_s == second.busy_s
