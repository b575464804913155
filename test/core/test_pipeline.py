"""Decoding across pipeline stages (issue 14): the schedulers and the simulator.

- Every mode (naive pipeline AR, Chunk-PP, FlowSpec) through 2 and 3 stages with uneven splits
  commits exactly the target's greedy tokens, with pipelined prefill, on a tiny random model
  (many rejections, so many prunes of rows in flight); SmolLM2 with its shipped draft through
  stage processes: test/runtime/test_stage_pipeline.py.
- After the request every stage's cache held prompt + accepted tokens (checked before release).
- The simulator reproduces a hand-computed schedule exactly on a toy profile, with and without
  pipelined prefill, and with cores that slow each other.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from edge_llm_ros.core.engine.config import preset
from edge_llm_ros.core.engine.decoding import generate_all
from edge_llm_ros.core.engine.drafters import ModelDrafter, TreeSpec, WrappedDrafter
from edge_llm_ros.core.engine.models import load_model, tiny_llama
from edge_llm_ros.core.engine.partial import load_stage_model
from edge_llm_ros.core.pipeline.schedulers import PAPER_SHAPE, ChunkPP, FlowSpec, FlowSpecShape, PipelineAR
from edge_llm_ros.core.pipeline.stages import Stage
from edge_llm_ros.core.planning.costs import CostModel, CountingDrafter, Link
from edge_llm_ros.core.sim.pipeline import simulate


def stages_of(folder, splits) -> list[Stage]:
    ranges = [range(a, b) for a, b in zip(splits, splits[1:])]
    return [Stage(load_stage_model(folder, r, first=i == 0, last=i == len(ranges) - 1), r, first=i == 0,
                  last=i == len(ranges) - 1) for i, r in enumerate(ranges)]


UNIT = CostModel(stage_s=lambda stage, rows, cached: 1.0, draft_s=0.1, link=Link(0.01))


def schedulers(prompt, drafter, new_tokens, chunks):
    kw = dict(max_new_tokens=new_tokens, prefill_chunks=chunks)
    return {"ar": PipelineAR("ar", prompt, **kw),
            "chunk_pp": ChunkPP("chunk_pp", prompt, CountingDrafter(drafter), TreeSpec(depth=4, branch=2, expand=2,
                                                                                      width=8), 3, **kw),
            "flowspec": FlowSpec("flowspec", prompt, CountingDrafter(drafter),
                                 FlowSpecShape(init_depth=4, init_size=12, branch=2, expand_depth=3, expand_size=6,
                                               segment=4, in_flight=3), **kw)}


class SpecLog(WrappedDrafter):
    """A drafter that records the widths it was asked for."""

    def __init__(self, drafter) -> None:
        super().__init__(drafter)
        self.widths = []

    def propose(self, context, spec, sampler):
        self.widths.append(spec.width)
        return self.drafter.propose(context, spec, sampler)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    tiny_llama(vocab_size=64, hidden_size=32, num_layers=5, seed=3).hf.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("splits", [[0, 1, 5], [0, 2, 3, 5]], ids=["2 stages", "3 stages"])
def test_every_mode_through_stages_commits_the_targets_greedy_tokens_on_a_tiny_model(tiny_folder, splits):
    target = load_model(tiny_folder, with_tokenizer=False)
    prompt = [3, 17, 22, 9, 41, 5, 30, 12, 7]
    expected = generate_all(target, prompt, preset("ar", max_new_tokens=40)).tokens
    drafter = ModelDrafter(target.truncated(2))  # a shallow draft: right sometimes, wrong often
    for mode, scheduler in schedulers(prompt, drafter, 40, [4, 3, 2]).items():
        stages = stages_of(tiny_folder, splits)
        timeline = simulate(scheduler, stages, UNIT)
        assert timeline.tokens == expected, mode
        assert timeline.times == sorted(timeline.times) and timeline.ttft_s > 0
    assert scheduler.rounds > 1 and scheduler.prunes  # flowspec: rounds ended, rows were pruned


def test_d0_on_a_stages_core_with_contention_never_stalls_the_stage(tiny_folder):
    """D0 on stage 0's core, processor sharing between the stages: every mode still commits every
    token. (A D0 event that did no work while stage 0 computed once kept the stage waiting for an
    end time the sharing had since moved earlier, with no event left to wake it: chunk_pp stopped
    after its first token, as bench --scenario pipeline's calibrated 2-stage simulation once did.)"""
    target = load_model(tiny_folder, with_tokenizer=False)
    prompt = [3, 17, 22, 9, 41, 5, 30, 12, 7]
    expected = generate_all(target, prompt, preset("ar", max_new_tokens=24)).tokens
    drafter = ModelDrafter(target.truncated(2))
    for contention in (0.8, 0.96, 1.1):
        costs = CostModel(stage_s=lambda stage, rows, cached: 0.01 * (1 + rows), draft_s=0.01, link=Link(0.0),
                          d0_shares=0, contention=contention)
        for mode, scheduler in schedulers(prompt, drafter, 24, []).items():
            timeline = simulate(scheduler, stages_of(tiny_folder, [0, 3, 5]), costs)
            assert timeline.tokens == expected, (mode, contention, len(timeline.tokens))


def test_flowspec_in_the_papers_setting_is_lossless_and_expands_only_from_new_context(tiny_folder):
    """PAPER_SHAPE (FlowSpec's evaluation setting: 80-node trees, segments of 16, 64-node expansions,
    no score-aware expansion): the target's greedy tokens, and every draft is either a round's
    initial tree or a context-aware expansion."""
    target = load_model(tiny_folder, with_tokenizer=False)
    prompt = [3, 17, 22, 9, 41, 5, 30, 12, 7]
    expected = generate_all(target, prompt, preset("ar", max_new_tokens=40)).tokens
    log = SpecLog(ModelDrafter(target.truncated(2)))
    scheduler = FlowSpec("paper", prompt, CountingDrafter(log), replace(PAPER_SHAPE, in_flight=3), max_new_tokens=40)
    timeline = simulate(scheduler, stages_of(tiny_folder, [0, 2, 5]), UNIT)
    assert timeline.tokens == expected
    assert set(log.widths) == {80, 64} and log.widths.count(80) == scheduler.rounds > 1


def test_chunk_pp_in_chunks_commits_what_one_message_does_one_turn_per_chunk(tiny_folder):
    """Chunk-PP as FlowSpec's §V-A runs it (the tree in chunks of the segment's rows, back to back)
    verifies the same trees as the whole tree in one message: same tokens, same rounds; every
    chunk's answer is a turn."""
    target = load_model(tiny_folder, with_tokenizer=False)
    prompt = [3, 17, 22, 9, 41, 5, 30, 12, 7]
    drafter = ModelDrafter(target.truncated(2))
    spec = TreeSpec(depth=4, branch=2, expand=2, width=8)
    runs = {}
    for chunk in (0, 3):
        scheduler = ChunkPP("c", prompt, CountingDrafter(drafter), spec, chunk, max_new_tokens=30)
        sizes = []
        draft = scheduler.draft
        scheduler.draft = lambda actions, s=scheduler, d=draft, sizes=sizes: (d(actions), sizes.append(len(s.tree.tokens)))
        runs[chunk] = simulate(scheduler, stages_of(tiny_folder, [0, 2, 5]), UNIT), scheduler, sizes
    (whole, one, sizes), (chunked, many, chunked_sizes) = runs[0], runs[3]
    assert chunked.tokens == whole.tokens and many.rounds == one.rounds > 3 and chunked_sizes == sizes
    assert one.turns == one.rounds
    assert many.turns == sum(-(-n // 3) for n in sizes) > one.turns
    with pytest.raises(ValueError, match="chunk must be >= 0"):
        ChunkPP("c", prompt, drafter, spec, -1, max_new_tokens=4)


def test_stage_caches_hold_prompt_plus_accepted_tokens_and_pruned_rows_go_no_further(tiny_folder):
    """Chunk-PP: each round's rows find, on every stage, a cache of exactly the prompt and the
    accepted tokens (Stage.run refuses anything else). FlowSpec: rows pruned on the way are not
    run by the stages after the prune (stage 2 runs fewer rows than stage 1)."""
    target = load_model(tiny_folder, with_tokenizer=False)
    prompt = [3, 17, 22, 9, 41, 5]
    drafter = ModelDrafter(target.truncated(2))
    for mode in ("chunk_pp", "flowspec"):
        scheduler = schedulers(prompt, drafter, 24, [])[mode]
        stages = stages_of(tiny_folder, [0, 2, 3, 5])
        seen = [[] for _ in stages]  # (prefix_len, cache length) of each round's first rows; rows run
        ran = [0] * len(stages)
        for i, stage in enumerate(stages):
            def run(rows, i=i, inner=stage.run, stage=stage):
                if rows.first_row == 0 and rows.visible is not None:
                    seen[i].append((rows.prefix_len, stage.cache_length(rows.request_id)))
                ran[i] += len(rows)
                return inner(rows)
            stage.run = run
        rounds = []
        if mode == "chunk_pp":
            draft = scheduler.draft
            scheduler.draft = lambda actions: (rounds.append(len(scheduler.context) - 1), draft(actions))
        timeline = simulate(scheduler, stages, UNIT)
        if mode == "chunk_pp":
            expected = [(n, n) for n in rounds]  # prompt + accepted tokens, the round's root not yet cached
            assert all(s == expected for s in seen) and len(rounds) == scheduler.rounds > 3
            assert rounds[-1] < len(prompt) + len(timeline.tokens)
        else:
            assert ran[0] >= ran[1] >= ran[2] and ran[2] < ran[0], ran


def test_the_simulator_reproduces_a_hand_computed_schedule(tiny_folder):
    """Two stages, a message costs rows / 10 s, every hop 0.5 s, a 20-token prompt."""
    toy = CostModel(stage_s=lambda stage, rows, cached: rows / 10, link=Link(0.5))
    prompt = list(range(1, 21))
    # unchunked: S0 0.5-2.5, S1 3.0-5.0, D0 5.5; then a token per lap: S0 6.0-6.1, S1 6.6-6.7, D0 7.2
    whole = simulate(PipelineAR("a", prompt, max_new_tokens=3), stages_of(tiny_folder, [0, 2, 5]), toy)
    assert whole.times == pytest.approx([5.5, 7.2, 8.9])
    # two chunks of 10: A S0 0.5-1.5, S1 2.0-3.0; B S0 1.5-2.5, S1 3.0-4.0; D0 4.5
    chunked = simulate(PipelineAR("b", prompt, max_new_tokens=3, prefill_chunks=[10, 10]),
                       stages_of(tiny_folder, [0, 2, 5]), toy)
    assert chunked.times == pytest.approx([4.5, 6.2, 7.9])
    assert chunked.turns == 2 and chunked.alt == 1.0
    # cores that slow each other 2x while both compute: B S0 1.5-3.0 (from 2.0 at half pace beside A),
    # A S1 2.0-3.5 (half pace until B leaves S0 at 3.0, then alone); B S1 3.5-4.5; D0 5.0; a lap 1.7
    shared = simulate(PipelineAR("c", prompt, max_new_tokens=3, prefill_chunks=[10, 10]),
                      stages_of(tiny_folder, [0, 2, 5]), replace(toy, contention=2.0))
    assert shared.times == pytest.approx([5.0, 6.7, 8.4])
    assert shared.busy_s == pytest.approx([1.0 + 1.5 + 0.2, 1.5 + 1.0 + 0.2])
