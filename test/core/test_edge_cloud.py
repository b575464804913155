"""Edge-cloud decoding with early exits (EE): the verifier's early outcomes, the robot's pre-draft cache,
the loop of both, the wire records' checks, the send queue and the Appendix B model — on tiny random
models with tiny exit sets, and on SmolLM2 with the shipped exits and draft."""

import dataclasses
import math
import threading

import pytest
import torch

from edge_llm_ros.core.drafts.exits import ExitSet, build_exits
from edge_llm_ros.core.edge_cloud import (
    EDGE_MODES,
    DraftError,
    DraftRejectedError,
    DraftRequest,
    EarlyExitDrafter,
    EarlyExitVerifier,
    OutcomeSendQueue,
    RequestLimitError,
    SpeculationMissed,
    VerifyOutcome,
    linked_rounds,
    projected_speedup,
    run_edge_cloud,
)
from edge_llm_ros.core.engine.config import GenerationConfig
from edge_llm_ros.core.engine.decoding import generate_all
from edge_llm_ros.core.engine.drafters import ModelDrafter
from edge_llm_ros.core.engine.models import tiny_llama
from edge_llm_ros.core.engine.sampling import Sampler
from edge_llm_ros.core.engine.verifier import verify_greedy

VOCAB, LAYERS, EXITS = 64, 4, (0, 1, 2)
PROMPTS = ([1, 2, 3, 4, 5], [7, 9, 11])
SD = GenerationConfig(mode="sd", gamma=4, max_new_tokens=32)
TREE = GenerationConfig(mode="tree", tree_depth=3, tree_width=6, tree_branch=2, tree_expand=2, max_new_tokens=32)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab_size=VOCAB, hidden_size=32, num_layers=LAYERS, max_context=128, seed=0)


@pytest.fixture(scope="module")
def exits(target):
    """Exits after layers 0, 1, 2 with small random adapters (not the logit lens)."""
    exits = build_exits(target, EXITS, bottleneck=8)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in exits.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return exits


@pytest.fixture(scope="module")
def ar(target):
    return {tuple(p): generate_all(target, p, GenerationConfig(max_new_tokens=32)).tokens for p in PROMPTS}


@pytest.fixture
def robot(target):
    """A robot side drafting with the target's first two layers (partly accepted)."""
    drafter = EarlyExitDrafter(ModelDrafter(target.truncated(2)), seed=0)
    yield drafter
    drafter.close()


def round_zero(verifier, robot, prompt, rid="r", config=SD):
    """Start a request on both sides; the round-0 draft and its outcomes."""
    draft = robot.start(rid, prompt, config)
    return draft, verifier.verify_all(draft)


def as_early(final: VerifyOutcome, layer: int = 0) -> VerifyOutcome:
    return dataclasses.replace(final, final=False, exit_layer=layer)


# -- the loop: lossless --------------------------------------------------------------------------------


@pytest.mark.parametrize("config", [SD, TREE], ids=["chain", "tree"])
@pytest.mark.parametrize("draft", ["shallow", "independent"])
def test_output_equals_greedy_ar(target, exits, ar, config, draft):
    model = target.truncated(2) if draft == "shallow" else tiny_llama(VOCAB, 32, 1, max_context=128, seed=1)
    verifier, robot = EarlyExitVerifier(target, exits), EarlyExitDrafter(ModelDrafter(model), seed=0)
    try:
        for prompt in PROMPTS:
            result = run_edge_cloud(verifier, robot, prompt, config)
            assert result.tokens == ar[tuple(prompt)]
            s = result.stats
            assert s.rounds == len(s.accepted) and s.hits + s.misses == s.rounds - 1  # all rounds but the last look up
            assert s.new_tokens == 32 and s.finish_reason == "length"
        assert verifier.requests == [] and robot.requests == []  # both sides ended the request
        assert set(verifier.stats.exit_rounds) == set(EXITS)
    finally:
        robot.close()


def run_mode(verifier, robot, prompt, name, link=None):
    """One request in edge mode ``name`` (EDGE_MODES) through the in-process loop."""
    drafting, early_exits, send_ahead = EDGE_MODES[name]
    config = SD.with_overrides(mode=drafting) if drafting != "tree" else TREE
    kwargs = {} if link is None else {"link": link}
    return run_edge_cloud(verifier, robot, prompt, config, early_exits=early_exits, send_ahead=send_ahead, **kwargs)


@pytest.mark.parametrize("name", list(EDGE_MODES))
def test_every_edge_mode_equals_greedy_ar(target, exits, ar, name):
    """ar: the verifier generates every token (one round each); sd / tree: no early outcomes are made;
    fsd / ee: pre-drafts; ee also sends finished pre-drafts ahead (the link holds each final until the
    robot's pre-drafting is idle, so they are ready), and the verifier verifies those it confirms."""
    verifier = EarlyExitVerifier(target, exits)
    robot = EarlyExitDrafter(ModelDrafter(target.truncated(2)), seed=0)

    def patient(outcome, deliver):
        if outcome.final:
            assert robot.cache.wait_idle(10)
        deliver(outcome)

    try:
        runs = [run_mode(verifier, robot, p, name, patient) for p in PROMPTS]
    finally:
        robot.close()
    for prompt, run in zip(PROMPTS, runs):
        assert run.tokens == ar[tuple(prompt)]
        assert run.stats.rounds == len(run.stats.accepted) and run.stats.finish_reason == "length"
    hits = sum(r.stats.hits for r in runs)
    ahead = sum(r.stats.sent_ahead for r in runs)
    early = sum(verifier.stats.sent.values())
    if name == "ar":
        assert all(r.stats.rounds == 32 and sum(r.stats.accepted) == 0 for r in runs)
    if name in ("ar", "sd", "tree"):
        assert early == 0 and hits == 0 and verifier.stats.exit_rounds == {}
    else:
        assert early > 0 and hits > 0
        assert all(r.stats.hits + r.stats.misses == r.stats.rounds - 1 for r in runs)
    assert (ahead > 0) == (name == "ee") and ahead <= hits  # a hit's pre-draft may still be drafting at its final
    assert verifier.requests == [] and all(r.stats.verify_s > 0 for r in runs)


class CountingLink:
    """One direction of an emulated link (runtime.link.Link, 5 ms one way) that also keeps what it carried."""

    def __init__(self, name):
        from edge_llm_ros.runtime.link import Link, LinkSpec

        self.link, self.carried = Link(LinkSpec(latency_ms=5.0), name), []

    def send(self, payload, size_bytes, deliver):
        self.carried.append((payload, size_bytes))
        return self.link.send(payload, size_bytes, deliver)


@pytest.mark.parametrize("name", list(EDGE_MODES))
def test_linked_rounds_put_the_server_on_its_thread_behind_both_links_and_stay_lossless(target, exits, ar, name):
    """The server verifies on its own thread what crossed the uplink; every outcome crosses the
    downlink (early ones too, for the pre-drafting modes); the tokens are greedy AR's."""
    drafting, early_exits, send_ahead = EDGE_MODES[name]
    config = SD.with_overrides(mode=drafting) if drafting != "tree" else TREE
    verifier = EarlyExitVerifier(target, exits)
    robot = EarlyExitDrafter(ModelDrafter(target.truncated(2)), seed=0)
    up, down = CountingLink("up"), CountingLink("down")
    try:
        for i, prompt in enumerate(PROMPTS):
            stats, tokens = [], []
            for step, _final in linked_rounds(verifier, robot, prompt, config, uplink=up, downlink=down,
                                             request_id=f"{name}-{i}", stats_out=stats, early_exits=early_exits,
                                             send_ahead=send_ahead, timeout_s=30):
                tokens += step.tokens
            assert tokens == ar[tuple(prompt)]
            assert stats and stats[0].rounds == len(stats[0].accepted)
    finally:
        robot.close()
        up.link.close(), down.link.close()
    drafts = [d for d, _ in up.carried]
    assert drafts and all(size > 0 for _, size in up.carried)
    assert [d.round for d in drafts if d.round == 0] == [0, 0]  # one round 0 per request, on the link
    finals = [o for o, _ in down.carried if o.final]
    assert len(finals) >= sum(len(ar[tuple(p)]) for p in PROMPTS) // (1 if name == "ar" else SD.gamma + 1)
    assert any(not o.final for o, _ in down.carried) == (name in ("fsd", "ee"))
    assert verifier.requests == [] and robot.requests == []


def test_linked_rounds_raise_a_refused_draft_and_time_out_on_a_dead_link(target, exits):
    verifier = EarlyExitVerifier(target, exits)
    robot = EarlyExitDrafter(ModelDrafter(target.truncated(2)), seed=0)

    class Dead:
        def send(self, payload, size_bytes, deliver):
            pass  # lost

    up = CountingLink("up")
    try:
        with pytest.raises(DraftError, match="task"):  # the server's refusal reaches the robot
            list(linked_rounds(verifier, robot, PROMPTS[0], SD, uplink=up, downlink=Dead(), timeout_s=10,
                               task="no-such-task"))
        with pytest.raises(TimeoutError, match="no final outcome"):
            list(linked_rounds(verifier, robot, PROMPTS[0], SD, uplink=Dead(), downlink=Dead(), timeout_s=0.3))
    finally:
        robot.close()
        up.link.close()
    assert verifier.requests == [] and robot.requests == []


def test_speculative_draft_is_verified_only_if_its_assumption_holds(target, exits, robot):
    verifier = EarlyExitVerifier(target, exits)
    draft, outs = round_zero(verifier, robot, PROMPTS[0])
    final = outs[-1]
    tree = robot.cache.draft_now(PROMPTS[0] + final.new_tokens, robot._requests["r"].spec, Sampler(0.0))[0]
    ahead = DraftRequest.from_tree("r", 1, tree, len(PROMPTS[0]) + len(final.new_tokens), (), SD)
    wrong = [t for t in range(VOCAB) if t != final.next_token][0]
    for assumed in (final.accepted_ids + [wrong], [final.next_token] * 9):
        with pytest.raises(SpeculationMissed):
            verifier.verify(dataclasses.replace(ahead, speculative=True, assumed_ids=assumed))
    outcome = verifier.verify_all(dataclasses.replace(ahead, speculative=True, assumed_ids=final.new_tokens))[-1]
    assert outcome.final and outcome.round == 1 and not outcome.error
    with pytest.raises(SpeculationMissed):  # its round has gone by
        verifier.verify(dataclasses.replace(ahead, speculative=True, assumed_ids=final.new_tokens))
    for bad in (dict(speculative=True), dict(assumed_ids=[1]), dict(round=0, speculative=True, assumed_ids=[1])):
        with pytest.raises(DraftError, match="assumed_ids"):
            verifier.verify(dataclasses.replace(ahead, **bad))


def test_cloud_request_generates_until_its_tokens_or_eos(target, exits, ar):
    prompt, expected = PROMPTS[0], ar[tuple(PROMPTS[0])]
    eos = expected[5]
    for tokens, limit in ((3, 3), (32, expected.index(eos) + 1)):
        verifier = EarlyExitVerifier(target, exits, eos_ids=[eos])
        draft = DraftRequest("c", 0, prompt, len(prompt), [], [], [], early_exits=False, cloud_tokens=tokens)
        got = []
        while draft is not None:
            outs = verifier.verify_all(draft)
            assert len(outs) == 1 and outs[0].final and outs[0].accepted_ids == []
            got.append(outs[0].next_token)
            draft = verifier.follow_up("c")
        assert got == expected[:limit]
    with pytest.raises(DraftError, match="cloud_tokens"):
        verifier.verify(DraftRequest("d", 0, prompt, len(prompt), [5], [-1], [0.5], cloud_tokens=3))
    assert verifier.follow_up("nobody") is None


def test_a_repeated_draft_gets_its_final_again_and_changes_nothing(target, exits, ar):
    """A robot resends round 0 while nothing answered it (its first copy may have reached no
    verifier): if both copies arrive, the second gets the first's final outcome, without early
    outcomes or a second commit; the request goes on as if it came once."""
    prompt = PROMPTS[0]
    verifier = EarlyExitVerifier(target, exits)
    draft = DraftRequest("r", 0, prompt, len(prompt), [5, 6], [-1, 0], [0.5, 0.5])
    first = verifier.verify_all(draft)
    assert len(first) > 1 and first[-1].final  # early outcomes, then the final
    again = verifier.verify_all(dataclasses.replace(draft))  # an equal copy off the wire
    assert again == [first[-1]]
    tokens = [*prompt, *first[-1].new_tokens]
    assert tokens[len(prompt):] == ar[tuple(prompt)][:len(first[-1].new_tokens)]
    following = DraftRequest("r", 1, [], len(tokens), [], [], [])  # round 1 commits the next token
    assert verifier.verify_all(following)[-1].next_token == ar[tuple(prompt)][len(first[-1].new_tokens)]
    with pytest.raises(DraftError, match="stale"):  # an older round that is not the last one verified
        verifier.verify(draft)
    with pytest.raises(DraftError, match="stale"):  # round 0 again, but another draft than was verified
        verifier.verify(dataclasses.replace(draft, token_ids=[7, 8]))


def test_a_cloud_round_answered_again_asks_for_no_second_follow_up(target, exits):
    prompt = PROMPTS[0]
    verifier = EarlyExitVerifier(target, exits)
    draft = DraftRequest("c", 0, prompt, len(prompt), [], [], [], early_exits=False, cloud_tokens=4)
    final = verifier.verify_all(draft)[-1]
    follow = verifier.follow_up("c")
    assert follow is not None and follow.round == 1
    assert verifier.verify_all(draft) == [final]  # round 0 resent: answered again
    assert verifier.follow_up("c") is None  # round 1's follow-up is out already
    verifier.verify_all(follow)
    assert verifier.follow_up("c").round == 2


class ChaosLink:
    """Holds a round's early outcomes and delivers them at its final: reversed, each twice, then the final
    twice, then the previous round's first early outcome again (stale)."""

    def __init__(self):
        self.held, self.previous = [], None

    def __call__(self, outcome, deliver):
        if not outcome.final:
            self.held.append(outcome)
            return
        for early in reversed(self.held):
            deliver(early)
            deliver(early)
        deliver(outcome)
        deliver(outcome)
        if self.previous is not None:
            deliver(self.previous)
        self.previous, self.held = (self.held[0] if self.held else None), []


def test_duplicated_reordered_and_stale_outcomes_change_nothing(target, exits, ar, robot):
    verifier = EarlyExitVerifier(target, exits)
    result = run_edge_cloud(verifier, robot, PROMPTS[0], SD, link=ChaosLink())
    assert result.tokens == ar[tuple(PROMPTS[0])]
    ignored = result.stats.ignored
    assert ignored["duplicate"] >= result.stats.rounds  # every early outcome came twice
    assert ignored["stale"] >= result.stats.rounds  # the second final, and the old early outcome


# -- server: early outcomes ----------------------------------------------------------------------------


def test_early_outcomes_come_first_in_layer_order_and_are_the_exits_verification(target, exits, robot, monkeypatch):
    verifier = EarlyExitVerifier(target, exits)
    round_zero(verifier, robot, PROMPTS[0], config=TREE)
    state = verifier._requests["r"]
    prefix, length = list(state.tokens), state.cache.length
    tree = ModelDrafter(target.truncated(2)).propose(prefix, TREE.tree_spec(), Sampler())
    draft = DraftRequest.from_tree("r", 1, tree, len(prefix))
    assert len(tree) > 2 and tree.depth > 1  # a real tree: several branches, several levels

    layers_run = []
    real_layer = target.decoder_layer
    monkeypatch.setattr(target, "decoder_layer", lambda i, *a: (layers_run.append(i), real_layer(i, *a))[1])
    outs, seen = [], []
    for outcome in verifier.verify(draft):
        outs.append(outcome)
        seen.append((outcome.exit_layer, outcome.final, len(layers_run), state.cache.length))
    monkeypatch.undo()
    early, final = seen[:-1], seen[-1]
    assert final[:3] == (LAYERS - 1, True, LAYERS)
    assert early and [layer for layer, *_ in early] == sorted({layer for layer, *_ in early})  # layer order
    for layer, is_final, ran, cache_length in early:
        assert not is_final and ran == layer + 1  # yielded the moment its layer was done
        assert cache_length == length  # nothing committed before the final layer
    assert sum(verifier.stats.sent[e] + verifier.stats.suppressed[e] for e in EXITS) == 2 * len(EXITS)

    # each early outcome is the exit's greedy verification of the tree (reference: one run_layers pass)
    cache = target.new_cache(64)
    target.forward(torch.tensor(prefix[:-1]), torch.arange(len(prefix) - 1), None, cache, logits_rows=None)
    ids = torch.tensor([tree.tokens])
    _, hidden = target.run_layers(target.embed(ids), tree.position_ids(len(prefix) - 1),
                                  tree.attention_mask(len(prefix) - 1), cache, collect=EXITS)
    for outcome in outs[:-1]:
        ref = verify_greedy(tree, exits.exit_logits(target, outcome.exit_layer, hidden[outcome.exit_layer][0]))
        assert outcome.accepted_nodes == [n - 1 for n in ref.path] and outcome.next_token == ref.bonus
        assert outcome.accepted_ids == ref.tokens and len(outcome.probs) == len(ref.tokens) + 1
        assert 0 < outcome.confidence <= 1


def test_duplicate_early_outcomes_are_suppressed_and_confidence_threshold():
    """Logit-lens exits on a target whose later layers add nothing: every exit says the same."""
    same = identity_tail_target()
    lens = build_exits(same, [0, 1], bottleneck=4)
    verifier = EarlyExitVerifier(same, lens)
    draft = DraftRequest("q", 0, [3, 4, 5], 3, [9, 10], [-1, 0], [0.5, 0.5])
    outs = verifier.verify_all(draft)
    assert [o.exit_layer for o in outs] == [0, 2] and outs[0].hypothesis == outs[1].hypothesis
    assert verifier.stats.suppressed[1] == 1 and verifier.stats.agreement() == {0: 1.0, 1: 1.0}
    # EE Eq. 4's threshold: an exit less confident than min_confidence stays silent
    quiet = EarlyExitVerifier(same, lens, min_confidence=min(1.0, outs[0].confidence + 1e-6))
    assert [o.final for o in quiet.verify_all(draft)] == [True]


# -- robot: the pre-draft cache ----------------------------------------------------------------------------


def identity_tail_target():
    """3 layers whose last two add nothing (o_proj = down_proj = 0): the logit lens at layer 0 IS the
    final distribution, bit for bit, so an untrained exit there always agrees with the final outcome."""
    model = tiny_llama(vocab_size=VOCAB, hidden_size=32, num_layers=3, max_context=128, seed=2)
    with torch.no_grad():
        for i in (1, 2):
            model.layers[i].self_attn.o_proj.weight.zero_()
            model.layers[i].mlp.down_proj.weight.zero_()
    return model


class PlannedExits(ExitSet):
    """The logit lens, agreeing with the final outcome when the plan says so, else rolled by one token
    (its argmax then differs at every row, so its hypothesis can never equal the final one)."""

    def __init__(self, base: ExitSet, plan: list[bool]):
        super().__init__(base.config, base.adapters, base.vocab_ids)
        self.plan = list(plan)

    def exit_logits(self, target, layer, hidden, vocab_ids=None):
        logits = super().exit_logits(target, layer, hidden, vocab_ids)
        return logits if self.plan.pop(0) else logits.roll(1, dims=-1)


@pytest.mark.parametrize("plan", [[True] * 40, [False] * 40, [True, False, False, True, True, False] * 7],
                         ids=["agree", "disagree", "mixed"])
def test_cache_hits_exactly_when_the_final_equals_a_hypothesis(plan):
    model = identity_tail_target()
    exits = PlannedExits(build_exits(model, [0], bottleneck=4), plan)
    draft_model = tiny_llama(VOCAB, 32, 1, max_context=128, seed=3)
    verifier, robot = EarlyExitVerifier(model, exits), EarlyExitDrafter(ModelDrafter(draft_model), seed=0)
    reference = ModelDrafter(tiny_llama(VOCAB, 32, 1, max_context=128, seed=3))
    hits, served = [], []
    try:
        draft = robot.start("r", [5, 6, 7], SD)
        context = [5, 6, 7]
        while draft is not None:
            agrees = exits.plan[0]
            outs = verifier.verify_all(draft)
            assert (outs[0].hypothesis == outs[-1].hypothesis) == agrees
            for o in outs[:-1]:
                robot.on_early(o)
            step = robot.on_final(outs[-1])
            context += step.tokens
            if step.draft is not None:
                hits.append(step.hit)
                spec = SD.tree_spec().capped(32 - (len(context) - 3))  # the budget left near the end
                served.append(step.draft.token_ids == reference.propose(context, spec, Sampler()).tokens[1:])
                assert step.hit == agrees
            draft = step.draft
        stats = robot.stats("r")
        assert stats.hits == sum(hits) and stats.misses == len(hits) - sum(hits)
        assert all(served)  # a hit serves exactly the draft a miss would have made
        assert stats.mean_hit_layer == 0 or not any(hits)
        assert context[3:] == generate_all(model, [5, 6, 7], GenerationConfig(max_new_tokens=32)).tokens
    finally:
        robot.close()


def test_never_a_draft_from_another_request_or_round(target, exits, robot):
    verifier = EarlyExitVerifier(target, exits)
    da, db = robot.start("a", PROMPTS[0], SD), robot.start("b", PROMPTS[0], SD)
    assert da.token_ids == db.token_ids  # same prompt, same draft: same hypothesised contexts
    final_a, final_b = verifier.verify_all(da)[-1], verifier.verify_all(db)[-1]
    assert final_a.hypothesis == final_b.hypothesis
    assert robot.on_early(as_early(final_a))  # a pre-draft for a's round 0 ...
    step_b = robot.on_final(final_b)
    assert step_b.hit is False and robot.stats("b").misses == 1  # ... is never served to b
    step_a = robot.on_final(final_a)
    assert step_a.hit is True and robot.stats("a").hits == 1
    # a's round-0 outcomes are stale now: ignored, nothing cached for round 0
    assert not robot.on_early(as_early(final_a, layer=1)) and robot.on_final(final_a) is None
    assert robot.stats("a").ignored["stale"] == 2 and all(k[1] >= 1 for k in robot.cache.keys())

    # round 1: a hypothesis the final contradicts is dropped with its round, never served later
    outs = verifier.verify_all(step_a.draft)
    wrong = dataclasses.replace(as_early(outs[-1]), next_token=(outs[-1].next_token + 1) % VOCAB)
    assert robot.on_early(wrong)
    step = robot.on_final(outs[-1])
    assert step.hit is False and not [k for k in robot.cache.keys() if k[0] == "a" and k[1] <= 1]
    assert robot.stats("a").predrafts_cancelled + robot.stats("a").predrafts_unused == 1
    # unknown requests and malformed early outcomes are ignored and counted
    assert not robot.on_early(dataclasses.replace(wrong, request_id="zzz")) and robot.unknown_outcomes == 1
    bad_path = dataclasses.replace(as_early(verifier.verify_all(step.draft)[-1]), accepted_nodes=[7], accepted_ids=[1])
    assert not robot.on_early(bad_path) and robot.stats("a").ignored["invalid"] == 1


def test_rejected_drafts_and_foreign_finals_raise(target, exits, robot):
    draft = robot.start("r", PROMPTS[0], SD)
    with pytest.raises(DraftRejectedError, match="token_ids: boom"):
        robot.on_final(VerifyOutcome.rejection("r", 0, DraftError("token_ids", "boom")))
    final = EarlyExitVerifier(target, exits).verify_all(draft)[-1]
    with pytest.raises(ValueError, match="does not fit the draft sent"):
        robot.on_final(dataclasses.replace(final, accepted_nodes=[0, 0], accepted_ids=[1, 2]))
    assert robot.on_final(final).draft.round == 1  # the state survived both


# -- server: checks, requests -------------------------------------------------------------------------


def valid_round_one(verifier, robot):
    _, outs = round_zero(verifier, robot, PROMPTS[0])
    return robot.on_final(outs[-1]).draft


BAD = {
    "token_ids": dict(token_ids=[VOCAB, 1, 2, 3]),
    "parents": dict(parents=[-1, 0, 1]),
    "draft_probs": dict(draft_probs=[0.5, 1.5, 0.5, 0.5]),
    "prefix_len": dict(prefix_len=3),
    "context_ids": dict(context_ids=[-1]),
    "temperature": dict(temperature=-1.0),
}


@pytest.mark.parametrize("field", list(BAD) + ["not_topological", "twins", "probs_length", "topk_probs", "topk_ids",
                                                "topk_missing", "stale_round", "future_round", "request_id"])
def test_malformed_drafts_are_rejected_naming_the_field(target, exits, robot, field):
    verifier = EarlyExitVerifier(target, exits)
    draft = valid_round_one(verifier, robot)
    n, absent = len(draft.token_ids), [t for t in range(VOCAB) if t not in draft.token_ids][:2]
    topk_rows = dict(topk=2, topk_ids=[t for tok in draft.token_ids for t in (tok, 0)], topk_probs=[0.5, 0.5] * n,
                     temperature=1.0)
    changes, expected = {
        "not_topological": (dict(parents=[1, -1, 0, 2]), "parents"),
        "twins": (dict(token_ids=[5, 5, 6, 7], parents=[-1, -1, 0, 2]), "token_ids"),
        "probs_length": (dict(draft_probs=[1.0]), "draft_probs"),
        "topk_probs": ({**topk_rows, "topk_probs": [0.5, 0.4] * n}, "topk_probs"),
        "topk_ids": ({**topk_rows, "topk_ids": [1]}, "topk_ids"),
        "topk_missing": ({**topk_rows, "topk_ids": absent * n}, "topk_ids"),
        "stale_round": (dict(round=0), "round"),
        "future_round": (dict(round=5), "round"),
        "request_id": (dict(request_id="nobody"), "request_id"),
    }.get(field, (BAD.get(field), field))
    with pytest.raises(DraftError) as err:
        verifier.verify(dataclasses.replace(draft, **changes))  # raises at the call, before any outcome
    assert err.value.field == expected and str(err.value).startswith(f"{expected}: ")
    assert VerifyOutcome.rejection(draft.request_id, draft.round, err.value).error == str(err.value)
    assert verifier.verify_all(draft)[-1].final  # the request's state is untouched
    with pytest.raises(DraftError, match="token_ids: expected integers"):
        dataclasses.replace(draft, token_ids=[1.5])


def test_requests_are_independent_capped_and_ended(target, exits, ar, robot):
    verifier = EarlyExitVerifier(target, exits, max_requests=2)
    drafts = {rid: robot.start(rid, p, SD) for rid, p in zip("ab", PROMPTS)}
    tokens = {"a": [], "b": []}
    while any(d is not None for d in drafts.values()):  # interleave rounds of the two requests
        for rid, draft in drafts.items():
            if draft is not None:
                step = robot.on_final(verifier.verify_all(draft)[-1])
                tokens[rid] += step.tokens
                drafts[rid] = step.draft
    assert tokens["a"] == ar[tuple(PROMPTS[0])] and tokens["b"] == ar[tuple(PROMPTS[1])]
    with pytest.raises(RequestLimitError, match="max_requests=2"):
        verifier.start("c", [1, 2])
    assert verifier.end("a") and not verifier.end("a")
    verifier.start("c", [1, 2])
    with pytest.raises(DraftError, match="request_id: request 'c' is already started"):
        verifier.start("c", [1, 2])
    capped = EarlyExitDrafter(ModelDrafter(target.truncated(1)), max_requests=1)
    try:
        capped.start("x", [1, 2], SD)
        with pytest.raises(RequestLimitError, match="max_requests=1"):
            capped.start("y", [1, 2], SD)
        assert capped.end("x").rounds == 0 and capped.end("x") is None
    finally:
        capped.close()


# -- the wire records, sampling -------------------------------------------------------------------------


def test_sampled_drafts_carry_their_exact_proposals_and_verify_at_the_final_layer(target, exits):
    drafter = ModelDrafter(target.truncated(2))
    config = GenerationConfig(mode="tree", tree_depth=3, tree_width=6, tree_branch=2, tree_expand=2, temperature=0.8,
                              top_k=8, seed=3, max_new_tokens=24)
    sampler = Sampler(0.8, 8, 1.0, torch.Generator().manual_seed(0))
    tree = drafter.propose([1, 2, 3], config.tree_spec(), sampler)
    record = DraftRequest.from_tree("s", 0, tree, 3, [1, 2, 3], config)
    record.check(VOCAB)
    assert record.topk == 8 and len(record.topk_ids) == 8 * len(tree)
    back = record.to_tree(3, VOCAB)
    assert back.tokens == tree.tokens and back.parents == tree.parents
    for q, r in zip(tree.proposals, back.proposals):
        assert (q is None) == (r is None) and (q is None or torch.allclose(q, r, atol=1e-5))
    robot = EarlyExitDrafter(ModelDrafter(target.truncated(2)), seed=0)
    try:
        result = run_edge_cloud(EarlyExitVerifier(target, exits), robot, [1, 2, 3], config)
    finally:
        robot.close()
    assert len(result.tokens) == 24 and all(0 <= t < VOCAB for t in result.tokens)
    assert result.stats.hits + result.stats.misses == result.stats.rounds - 1


# -- the send queue, the speedup model ---------------------------------------------------------------------


def outcome(rid, rnd, conf, final=False, layer=0):
    return VerifyOutcome(rid, rnd, final, layer, conf, [], [], 1)


def test_send_queue_sends_finals_first_then_the_most_confident():
    q = OutcomeSendQueue()
    for c in (0.2, 0.9, 0.5):
        q.put(outcome("a", 0, c))
    q.put(outcome("b", 3, 1.0, final=True))
    q.put(outcome("a", 0, 0.7))
    order = [q.get(timeout=0) for _ in range(5)]
    assert [(o.request_id, o.final, o.confidence) for o in order] == [
        ("b", True, 1.0), ("a", False, 0.9), ("a", False, 0.7), ("a", False, 0.5), ("a", False, 0.2)]
    assert q.get(timeout=0) is None
    # the final of a round drops that round's pending early outcomes (and later ones are dropped at once)
    q.put(outcome("a", 1, 0.3))
    q.put(outcome("a", 2, 0.4))
    q.put(outcome("a", 1, 0.8, final=True))
    q.put(outcome("a", 1, 0.6))
    assert [(o.round, o.final) for o in (q.get(timeout=0), q.get(timeout=0))] == [(1, True), (2, False)]
    assert q.dropped == 2 and len(q) == 0
    # a consumer blocked in get() wakes on put; close() releases it with None
    got, ready = [], threading.Event()

    def consumer():
        ready.set()
        got.append(q.get(timeout=10))
        got.append(q.get(timeout=10))

    thread = threading.Thread(target=consumer)
    thread.start()
    assert ready.wait(10)
    q.put(outcome("c", 0, 0.5))
    q.close()
    thread.join(10)
    assert [o and o.request_id for o in got] == ["c", None]
    with pytest.raises(RuntimeError, match="closed"):
        q.put(outcome("c", 1, 0.5))


def test_projected_speedup_is_appendix_b():
    assert projected_speedup(4, 0.3, 1.0) == pytest.approx(1.0)  # every round misses: plain SD
    assert projected_speedup(4, 0.3, 0.0) == pytest.approx(2.2)  # every round hits: γc + 1
    # Appendix B: c ≈ 0.3, γ = 4 needs r < 10 % for ~2x; γ = 10 gets 2x at r ≈ 35 %
    assert projected_speedup(4, 0.3, 0.1) == pytest.approx(2.2 / 1.12)
    assert projected_speedup(10, 0.3, 0.35) == pytest.approx(4 / 2.05)
    for bad in ((0, 0.3, 0.1), (4, -1, 0.1), (4, 0.3, 1.5)):
        with pytest.raises(ValueError):
            projected_speedup(*bad)


# -- the real model --------------------------------------------------------------------------------------


def test_smollm2_with_shipped_exits_and_draft_is_lossless(smollm2, capsys):
    from edge_llm_ros.core.drafts.draft_models import load_drafter
    from edge_llm_ros.core.drafts.exits import load_exits
    from edge_llm_ros.core.engine.models import chat_prompt

    verifier = EarlyExitVerifier(smollm2, load_exits(smollm2))
    robot = EarlyExitDrafter(load_drafter(smollm2), seed=0)
    config = GenerationConfig(mode="sd", gamma=4, max_new_tokens=32)
    hits = lookups = 0
    try:
        for text in ("Walk to the kitchen and tell me what is on the table.", "List three things a robot vacuum "
                                                                              "should avoid."):
            prompt = chat_prompt(smollm2.tokenizer, text)
            ar = generate_all(smollm2, prompt, GenerationConfig(mode="ar", max_new_tokens=32))
            result = run_edge_cloud(verifier, robot, prompt, config)
            assert result.tokens == ar.tokens
            hits, lookups = hits + result.stats.hits, lookups + result.stats.hits + result.stats.misses
    finally:
        robot.close()
    agreement = verifier.stats.agreement()
    assert set(agreement) == {4, 8, 16, 24} and hits > 0
    with capsys.disabled():
        print(f"\nEE SmolLM2 γ=4: exit agreement {({k: round(v, 2) for k, v in agreement.items()})}, "
              f"miss rate {1 - hits / lookups:.2f} over {lookups} lookups")
    assert math.isfinite(agreement[24]) and agreement[24] >= agreement[4]
