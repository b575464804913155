"""Serving many requests at once (issue 12): continuous batching on llama.cpp and the engine's
interleaved server.

Exactness: 16 concurrent greedy requests on SmolLM2's GGUF, prompts of equal lengths among them
(so sibling sequences hold different tokens at the same positions), each equal token for token
to llama.cpp's own greedy decoding of the same GGUF (llama-cpp-python's ``Llama.generate``, EOS
included where it comes first: test/references.py); requests that join while others run, and
requests with their own stop strings and limits in one batch, each equal to that reference too;
sampled requests in a batch each equal the same request with the same seed decoded alone (the
engine on its own one-sequence context); interleaved torch requests equal transformers' own
greedy generate (greedy modes) or the same request alone (sampled). A cancelled request leaves
and frees its sequence; admission beyond capacity fails at once with
BusyError; a prompt over the context window is refused with the limit.
"""

from __future__ import annotations

import pytest
from references import hf_greedy

from edge_llm_ros.core.engine.batching import BatchServer, BusyError, EngineServer, LlamaBatch, ServerClosedError
from edge_llm_ros.core.engine.config import preset
from edge_llm_ros.core.engine.decoding import generate_all
from edge_llm_ros.core.engine.llama_backend import load_llama_cpp
from edge_llm_ros.core.engine.models import chat_prompt, load_tokenizer

PROMPTS = ("Describe how a robot should explore a new house.", "Write a short poem about the sea.",
           "Explain how a robot vacuum cleaner maps a room.", "Give three tips for charging a battery safely.",
           "What should a delivery robot do when a door is closed?", "Name two sensors a drone needs.",
           "Why do robots need maps?", "List three colours.")
NEW_TOKENS = 24
TIMEOUT = 300


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture
def batch(tokenizer):
    """A fresh 16-sequence context per test (a server frees its batch when closed)."""
    b = LlamaBatch(sequences=16, context=512, n_threads=1, tokenizer=tokenizer)
    yield b
    b.close()


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [chat_prompt(tokenizer, p) for p in PROMPTS]


@pytest.fixture(scope="module")
def solo(prompts, references):
    """Each prompt's reference: llama.cpp's own greedy decoding of the GGUF, NEW_TOKENS or up to EOS."""
    return [references.llama_greedy(ids, NEW_TOKENS) for ids in prompts]


@pytest.fixture(scope="module")
def alone(tokenizer):
    """alone(prompt ids, config): the engine's output for one request decoded by itself on llama.cpp
    (its own one-sequence context, no batch)."""
    lm = load_llama_cpp(n_ctx=512, n_threads=1, tokenizer=tokenizer)
    yield lambda ids, config: generate_all(lm, ids, config).tokens
    lm.close()


def finished(streams):
    for s in streams:
        assert s.wait(TIMEOUT), f"request {s.request_id} did not end"
    return streams


def test_sixteen_concurrent_requests_each_equal_their_solo_output(batch, prompts, solo):
    server = BatchServer(batch, max_pending=0)
    try:
        streams = finished([server.submit(ids, preset("ar", max_new_tokens=NEW_TOKENS)) for ids in prompts * 2])
        assert [s.tokens for s in streams] == solo * 2  # the same prompt twice: same tokens at the same positions
        assert server.steps < 2 * NEW_TOKENS  # batched: one decode per step for all, not one per request
        assert all(s.stats.finish_reason in ("length", "eos") and s.stats.ttft_s > 0 for s in streams)
    finally:
        server.close()


def test_requests_joining_a_running_batch_and_their_own_settings(batch, prompts, solo, alone):
    server = BatchServer(batch, max_pending=4)
    try:
        first = server.submit(prompts[0], preset("ar", max_new_tokens=NEW_TOKENS))
        assert first.next_tokens(TIMEOUT)  # running when the others join
        greedy_short = server.submit(prompts[1], preset("ar", max_new_tokens=5))
        sampling = [preset("ar", max_new_tokens=12, temperature=0.8, top_k=40, top_p=0.9, seed=seed)
                    for seed in (7, 7, 8)]
        sampled = [server.submit(prompts[2], config) for config in sampling]
        stop = batch.tokenizer.decode(solo[3][4:6])
        stopped = server.submit(prompts[3], preset("ar", max_new_tokens=NEW_TOKENS, stop_strings=(stop,)))
        finished([first, greedy_short, *sampled, stopped])
        assert first.tokens == solo[0]
        assert greedy_short.tokens == solo[1][:5] and greedy_short.stats.finish_reason == "length"
        # the seed decides, not the neighbours: each equals its request decoded alone
        assert [s.tokens for s in sampled] == [alone(prompts[2], config) for config in sampling]
        assert sampled[0].tokens != sampled[2].tokens and len(sampled[0].tokens) > 0
        assert stopped.stats.finish_reason == "stop" and stopped.tokens == solo[3][: len(stopped.tokens)]
        assert stop in batch.tokenizer.decode(stopped.tokens) and len(stopped.tokens) < NEW_TOKENS
    finally:
        server.close()


def test_cancel_frees_the_sequence_and_the_others_go_on(batch, prompts, solo):
    server = BatchServer(batch, max_requests=2, max_pending=0)
    try:
        doomed = server.submit(prompts[0], preset("ar", max_new_tokens=200))
        other = server.submit(prompts[1], preset("ar", max_new_tokens=NEW_TOKENS))
        assert doomed.next_tokens(TIMEOUT)
        with pytest.raises(BusyError, match="busy: 2 requests running and 0 waiting"):
            server.submit(prompts[2], preset("ar", max_new_tokens=4))
        doomed.cancel()
        finished([doomed])
        assert doomed.stats.finish_reason == "cancelled" and len(doomed.tokens) < 200
        third = server.submit(prompts[2], preset("ar", max_new_tokens=NEW_TOKENS))  # the freed slot
        finished([other, third])
        assert other.tokens == solo[1] and third.tokens == solo[2]
    finally:
        server.close()


def test_prompts_are_prefilled_first_come_first_served_in_chunks_and_stay_exact(batch, prompts, solo):
    """Five prompt rows per step: every prompt is cut across steps (mid-prompt chunks beside other
    sequences' rows), each output still equals its solo decoding, and the first arrival of a burst
    has its first token before the last one's prompt is even read."""
    server = BatchServer(batch, max_requests=4, max_pending=0, prefill_rows=5)
    try:
        streams = finished([server.submit(ids, preset("ar", max_new_tokens=6)) for ids in prompts[:4]])
        assert [s.tokens for s in streams] == [t[:6] for t in solo[:4]]
        ttft = [s.stats.ttft_s for s in streams]
        assert ttft == sorted(ttft) and ttft[0] < ttft[-1]
        assert server.steps >= sum(len(ids) for ids in prompts[:4]) // 5
    finally:
        server.close()
    with pytest.raises(ValueError, match="prefill_rows=510 must be >= 1 and fit beside 4 requests in n_batch=512"):
        BatchServer(batch, max_requests=4, prefill_rows=510)


def test_bad_requests_are_refused_before_they_queue(batch, prompts):
    assert repr(batch) == f"LlamaBatch({batch.path.name}, 16 sequences x 512 tokens, 1 threads)"
    server = BatchServer(batch, max_requests=1, max_pending=1)
    try:
        with pytest.raises(ValueError, match="context window is 512"):
            server.submit(list(prompts[0]) * 40, preset("ar"))
        with pytest.raises(ValueError, match="runs mode ar"):
            server.submit(prompts[0], preset("sd"))
        with pytest.raises(ValueError, match="prompt is empty"):
            server.submit([], preset("ar"))
        running = server.submit(prompts[0], preset("ar", max_new_tokens=200))
        waiting = server.submit(prompts[1], preset("ar", max_new_tokens=2))
        with pytest.raises(BusyError):
            server.submit(prompts[2], preset("ar", max_new_tokens=2))
        running.cancel()
        finished([running, waiting])
        assert waiting.stats.finish_reason == "length" and len(waiting.tokens) == 2
    finally:
        server.close()


def test_close_ends_every_request_and_refuses_new_ones(batch, prompts):
    server = BatchServer(batch, max_requests=1, max_pending=2)
    running = server.submit(prompts[0], preset("ar", max_new_tokens=400))
    waiting = server.submit(prompts[1], preset("ar", max_new_tokens=400))
    assert running.next_tokens(TIMEOUT)
    server.close()
    finished([running, waiting])
    assert {running.stats.finish_reason, waiting.stats.finish_reason} == {"error"}
    assert waiting.error == "server shut down"
    with pytest.raises(ServerClosedError):
        server.submit(prompts[0], preset("ar"))


def test_engine_server_runs_a_llama_cpp_models_requests_one_at_a_time_each_equal_to_solo(tokenizer, prompts, solo):
    """A llama.cpp model holds one live cache (its live_caches is 1): interleaved, the second request's
    new cache would cut the first one's off; one after the other, each gets its solo output."""
    server = EngineServer(load_llama_cpp(n_ctx=512, n_threads=1, tokenizer=tokenizer), max_requests=4,
                          max_pending=0)
    try:
        assert (server.run_limit, server.kind) == (1, "one at a time")
        streams = finished([server.submit(ids, preset("ar", max_new_tokens=NEW_TOKENS)) for ids in prompts[:3]])
        assert [s.tokens for s in streams] == solo[:3]
    finally:
        server.close()  # frees the model too


def test_engine_server_interleaves_requests_on_torch_each_equal_to_solo(tiny, tiny_drafters):
    """Greedy requests (ar, sd, tree) equal transformers' own greedy generate on the same weights;
    the sampled one equals the same request (its seed) decoded alone."""
    prompts = [[1, 2, 3], [4, 5, 6, 7], [8, 9], [10, 11, 12]]
    configs = [preset("ar", max_new_tokens=12), preset("sd", max_new_tokens=12, gamma=3),
               preset("tree", max_new_tokens=10), preset("sd", max_new_tokens=8, temperature=0.9, seed=3)]
    drafter = tiny_drafters["shallow"]
    alone = [hf_greedy(tiny, p, c.max_new_tokens) if c.greedy else generate_all(tiny, p, c, drafter).tokens
             for p, c in zip(prompts, configs)]
    server = EngineServer(tiny, drafter, max_requests=4, max_pending=0)
    try:
        assert server.kind == "interleaved"
        streams = finished([server.submit(p, c) for p, c in zip(prompts, configs)])
        assert [s.tokens for s in streams] == alone
        with pytest.raises(ValueError, match="context window"):
            server.submit(list(range(1, 60)) * 3, configs[0])
    finally:
        server.close()


def test_a_replaced_server_finishes_its_requests_then_closes(tiny):
    server = EngineServer(tiny, max_requests=1, max_pending=1)
    stream = server.submit([1, 2, 3], preset("ar", max_new_tokens=30))
    server.close_when_idle()
    with pytest.raises(ServerClosedError):
        server.submit([1, 2], preset("ar"))
    finished([stream])
    assert stream.stats.finish_reason in ("length", "eos") and stream.tokens
    server._thread.join(TIMEOUT)  # the step thread ends once the last request has
    assert not server._thread.is_alive()


def test_a_listener_hears_every_step_on_the_step_thread_and_one_that_fails_ends_only_its_request(batch, prompts,
                                                                                                  solo):
    import threading

    server = BatchServer(batch, max_pending=0)
    heard, threads = [], set()

    def listen(stream, tokens) -> None:
        heard.append(tokens)
        threads.add(threading.current_thread().name)

    def fail(stream, tokens) -> None:
        raise RuntimeError("the publisher is gone")

    try:
        good = server.submit(prompts[0], preset("ar", max_new_tokens=NEW_TOKENS), listener=listen)
        bad = server.submit(prompts[1], preset("ar", max_new_tokens=NEW_TOKENS), listener=fail)
        finished([good, bad])
        assert [t for ts in heard[:-1] for t in ts] == solo[0] and heard[-1] is None
        assert threads == {"batch-steps"}
        assert bad.stats.finish_reason == "error" and "the publisher is gone" in bad.error
        assert good.tokens == solo[0]
    finally:
        server.close()


def test_a_server_replaced_before_its_first_request_closes_at_once(tiny):
    server = EngineServer(tiny, max_requests=1, max_pending=0)
    server.close_when_idle()
    with pytest.raises(ServerClosedError):
        server.submit([1, 2], preset("ar"))
