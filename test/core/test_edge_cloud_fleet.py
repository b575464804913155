"""Edge-cloud decoding shared by a fleet (issue 11): a full verifier refuses newcomers as busy and
never evicts a live request, idle requests expire, refused drafts leave no state behind, the
verifier's intake serves live requests first, and sampled drafts from a truncated proposal (what
goes on the wire) keep the target's distribution exactly — on tiny random models."""

import dataclasses
import gc
import threading
import tracemalloc

import pytest
import torch
from test_sampling import chi_square_pvalue, exact_marginals

from edge_llm_ros.core.edge_cloud import (
    MAX_REQUEST_ID,
    PROPOSAL_TOP_K,
    DraftError,
    DraftInbox,
    DraftRequest,
    EarlyExitDrafter,
    EarlyExitVerifier,
    OutcomeSendQueue,
    RequestLimitError,
    VerifyOutcome,
    run_edge_cloud,
)
from edge_llm_ros.core.engine.config import GenerationConfig
from edge_llm_ros.core.engine.decoding import generate_all
from edge_llm_ros.core.engine.drafters import ModelDrafter
from edge_llm_ros.core.engine.models import tiny_llama
from edge_llm_ros.core.engine.sampling import Sampler

VOCAB = 64
PROMPTS = ([1, 2, 3, 4, 5], [7, 9, 11])
SD = GenerationConfig(mode="sd", gamma=3, max_new_tokens=24)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab_size=VOCAB, hidden_size=32, num_layers=3, max_context=128, seed=0)


def fresh_round_zero(rid: str) -> DraftRequest:
    """The issue's reproduction: a valid round-0 draft with a fresh request id."""
    return DraftRequest(rid, 0, [1, 2, 3], 3, [5, 6], [-1, 0], [0.5, 0.5])


def test_a_full_verifier_refuses_newcomers_as_busy_and_live_requests_finish_exactly(target):
    verifier = EarlyExitVerifier(target, None, max_requests=2)
    robot = EarlyExitDrafter(ModelDrafter(target.truncated(1)), seed=0)
    ar = {rid: generate_all(target, p, GenerationConfig(max_new_tokens=24)).tokens for rid, p in zip("ab", PROMPTS)}
    try:
        drafts = {rid: robot.start(rid, p, SD, early_exits=False) for rid, p in zip("ab", PROMPTS)}
        tokens = {"a": [], "b": []}
        rounds = 0
        while any(d is not None for d in drafts.values()):
            for rid, draft in drafts.items():
                if draft is not None:
                    step = robot.on_final(verifier.verify_all(draft)[-1])
                    tokens[rid] += step.tokens
                    drafts[rid] = step.draft
            rounds += 1
            if rounds == 2:  # between two rounds of both live requests: 20 newcomers
                for i in range(20):
                    with pytest.raises(RequestLimitError, match=r"^busy: the verifier is serving 2 of max_requests=2"):
                        verifier.verify_all(fresh_round_zero(f"new-{i}"))
                assert sorted(verifier.requests) == ["a", "b"]
        assert tokens == ar
    finally:
        robot.close()
    assert verifier.end("a") and verifier.end("b")
    assert verifier.verify_all(fresh_round_zero("late"))[-1].final  # room again: served


def test_idle_requests_expire_and_free_their_slot(target):
    verifier = EarlyExitVerifier(target, None, max_requests=1)
    outcome = verifier.verify_all(fresh_round_zero("gone"))[-1]
    assert outcome.final and not outcome.error
    with pytest.raises(RequestLimitError, match="busy"):
        verifier.verify_all(fresh_round_zero("next"))
    state_time = verifier._requests["gone"].last_used
    assert verifier.expire_idle(30.0, now=state_time + 29.0) == []  # not idle long enough
    assert verifier.expire_idle(30.0, now=state_time + 31.0) == ["gone"]
    assert verifier.requests == [] and not verifier.active("gone")
    assert verifier.verify_all(fresh_round_zero("next"))[-1].final


def test_refused_drafts_leave_no_state_behind(target):
    """The issue's memory repro: 4,000 drafts with unique 25 kB ids, each refused; what the verifier
    and its send queue keep afterwards must not grow with them."""
    verifier, queue = EarlyExitVerifier(target, None, max_requests=2), OutcomeSendQueue()
    big = "x" * 25_000
    tracemalloc.start()
    try:
        for i in range(4000):
            draft = dataclasses.replace(fresh_round_zero("ok"), round=7) if i % 2 else None
            try:
                if draft is None:
                    DraftRequest(f"{big}{i}", 0, [1, 2, 3], 3, [5, 6], [-1, 0], [0.5, 0.5])
                else:
                    verifier.verify_all(dataclasses.replace(draft, request_id=f"unknown-{i}"))
                raise AssertionError("the draft was not refused")
            except DraftError as exc:
                queue.put(VerifyOutcome.rejection(f"{big}{i}" if draft is None else f"unknown-{i}", 0, exc))
            assert queue.get(timeout=0).error  # the sender drains it
        gc.collect()
        kept, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert kept < 2_000_000, f"{kept} bytes still held after 4,000 refused drafts"
    assert verifier.requests == [] and len(queue) == 0


def test_request_ids_are_bounded():
    with pytest.raises(DraftError, match=rf"^request_id: has {MAX_REQUEST_ID + 1} characters, at most "):
        DraftRequest("r" * (MAX_REQUEST_ID + 1), 0, [1], 1, [], [], [])
    assert DraftRequest("r" * MAX_REQUEST_ID, 0, [1], 1, [], [], []).request_id


def test_inbox_serves_live_requests_first_yet_never_starves_newcomers():
    inbox = DraftInbox(max_new=3, max_live=4, fairness=2)
    assert all(inbox.put(f"new{i}", live=False) for i in range(3))
    assert not inbox.put("new3", live=False)  # full: the caller refuses it as busy
    assert all(inbox.put(f"live{i}", live=True) for i in range(4))
    assert not inbox.put("live4", live=True)
    order = [inbox.get(timeout=0) for _ in range(7)]
    assert order == ["live0", "live1", "new0", "live2", "live3", "new1", "new2"]
    assert inbox.get(timeout=0) is None and len(inbox) == 0
    got = []
    waiter = threading.Thread(target=lambda: got.append(inbox.get(timeout=10)))
    waiter.start()
    inbox.close()
    waiter.join(10)
    assert got == [None] and not inbox.put("late", live=True)


def test_sampled_drafts_of_a_wide_vocabulary_fit_on_the_wire():
    """A draft whose proposal spans 8,192 tokens (the llama.cpp draft's subset, the issue's abort):
    the robot samples from its top-PROPOSAL_TOP_K, so every record carries at most that many."""
    wide = tiny_llama(vocab_size=8192, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1, seed=4,
                      init_range=0.02)
    sent = []
    robot = EarlyExitDrafter(ModelDrafter(wide.truncated(1)), seed=0, sender=sent.append)
    try:
        config = GenerationConfig(mode="sd", gamma=3, temperature=0.7, seed=1, max_new_tokens=8)
        draft = robot.start("s", [1, 2, 3], config)
        assert 0 < draft.topk <= PROPOSAL_TOP_K
        result = run_edge_cloud(EarlyExitVerifier(wide, None), robot, [1, 2, 3], config, request_id="w",
                                early_exits=False)
        assert len(result.tokens) == 8
    finally:
        robot.close()
    with pytest.raises(ValueError, match="proposal_top_k must be in"):
        EarlyExitDrafter(ModelDrafter(wide.truncated(1)), proposal_top_k=0)


SAMPLES = 500
SMALL = 8


@pytest.mark.parametrize("config", [
    GenerationConfig(mode="sd", gamma=3, temperature=1.0, max_new_tokens=2),
    GenerationConfig(mode="tree", tree_depth=2, tree_branch=3, tree_expand=2, tree_width=5, temperature=1.0,
                     max_new_tokens=2),
], ids=["chain", "tree"])
def test_truncated_proposals_keep_the_targets_distribution(config):
    """Edge-cloud sampling through the wire records with the draft's proposal cut to its top 3 of 8
    tokens: the first and second tokens follow the target's exact distribution (chi-square)."""
    dims = dict(vocab_size=SMALL, hidden_size=16, num_heads=2, num_kv_heads=1, init_range=0.5)
    target, draft = tiny_llama(num_layers=2, seed=3, **dims), tiny_llama(num_layers=1, seed=11, **dims)
    prompt = [1, 2, 3, 4]
    first, second = exact_marginals(target, Sampler(1.0), steps=2, prompt=prompt)
    robot = EarlyExitDrafter(ModelDrafter(draft), seed=0, proposal_top_k=3)
    verifier = EarlyExitVerifier(target, None)
    counts = torch.zeros(2, SMALL)
    try:
        for seed in range(SAMPLES):
            tokens = run_edge_cloud(verifier, robot, prompt, config.with_overrides(seed=seed, eos_token_ids=()),
                                    request_id=f"s{seed}", early_exits=False).tokens
            counts[0, tokens[0]] += 1
            counts[1, tokens[1]] += 1
    finally:
        robot.close()
    assert chi_square_pvalue(counts[0], first) > 1e-3
    assert chi_square_pvalue(counts[1], second) > 1e-3


@pytest.mark.parametrize("bad, message", [
    (dict(temperature=float("nan")), "temperature must be a finite number >= 0"),
    (dict(temperature=float("inf")), "temperature must be a finite number >= 0"),
    (dict(top_p=float("nan")), "top_p must be in (0, 1]"),
    (dict(top_p=1.5), "top_p must be in (0, 1]"),
    (dict(top_p=0.0), "top_p must be in (0, 1]"),
    (dict(seed=-3), "seed must be an integer in [0, 2**64)"),
    (dict(max_new_tokens=2.5), "max_new_tokens must be an integer"),
    (dict(top_k=-1), "top_k must be >= 0"),
])
def test_generation_config_range_checks_every_number(bad, message):
    with pytest.raises(ValueError) as err:
        GenerationConfig(**bad)
    assert message in str(err.value)
