"""The navigator's task through pipeline stages (issue 15: "local, edge-cloud or pipeline"), in one
process on a tiny random VLM with LoRA: every stage runs the task's view of its layers (the
adapter's LoRA merged), the first conditioned on the frame's features its first rows carry, the
last masking each row by the grammar state D0 computed for it; every lossless pipeline mode gives
the one-device constrained answer token for token. Faults are named by field."""

import pytest
import torch

from edge_llm_ros.core.engine.config import GenerationConfig
from edge_llm_ros.core.pipeline.schedulers import FlowSpecShape
from edge_llm_ros.core.pipeline.stages import Rows, Stage, StageError, StageTask
from edge_llm_ros.core.planning.costs import CostModel, Link
from edge_llm_ros.core.sim.pipeline import simulate
from edge_llm_ros.nav.navigator import Navigator, PipelineNavigator, answer_grammar, answer_vocabulary

INSTRUCTION = "go to the red chair"
UNIT = CostModel(stage_s=lambda stage, rows, cached: 1.0, draft_s=0.1, link=Link(0.01))


@pytest.fixture(scope="module")
def vlm(lora_vlm):
    return lora_vlm


def nav_stages(adapter, target, grammar, splits=(0, 1, 2)) -> list[Stage]:
    """Stages over the tiny target's layers, each serving task nav with the adapter's view."""
    view = adapter.attach(target, "target").with_vocabulary(answer_vocabulary(grammar))
    ranges = [range(a, b) for a, b in zip(splits, splits[1:])]
    stages = []
    for i, layers in enumerate(ranges):
        first, last = i == 0, i == len(ranges) - 1
        task = StageTask(view, (lambda m, f: adapter.condition_on(m, f, "target")) if first else None,
                         grammar if last else None)
        stages.append(Stage(target, layers, first=first, last=last, tasks={"nav": task}))
    return stages


def test_every_pipeline_mode_gives_the_one_device_constrained_answer(vlm, frames):
    """PipelineNavigator (the robot as D0) over two stages in simulated time: the text and the
    confidence (the stages' probability of each choice) of the one-device navigator."""
    adapter, target, draft = vlm
    grammar = answer_grammar(target.tokenizer, target.vocab_size)
    config = GenerationConfig(max_new_tokens=64)
    local = Navigator(adapter, target, None, config)
    for mode in ("ar", "chunk_pp", "flowspec"):
        used = []

        def run(scheduler):
            stages = nav_stages(adapter, target, grammar)
            timeline = simulate(scheduler, stages, UNIT)
            assert all(not s.requests and not s.caches for s in stages)  # released at the end
            used.append(scheduler)
            yield timeline.tokens

        remote = PipelineNavigator(adapter, draft, run, mode, config, segment=4, in_flight=2, prefill_chunk=7,
                                   shape=FlowSpecShape(init_depth=3, init_size=8, branch=2, expand_depth=3,
                                                       expand_size=4))
        for frame in frames:
            want, got = local.decide(frame, INSTRUCTION), remote.decide(frame, INSTRUCTION)
            assert got.text == want.text, mode
            assert got.confidence == pytest.approx(want.confidence, rel=1e-4), mode
            assert grammar.complete(used[-1].generated), mode
        if mode != "ar":
            assert sum(s.rounds for s in used) < sum(len(s.generated) for s in used), mode  # drafts accepted


def test_a_stage_names_what_a_tasks_rows_lack(vlm, frames):
    adapter, target, _ = vlm
    grammar = answer_grammar(target.tokenizer, target.vocab_size)
    first, last = nav_stages(adapter, target, grammar)
    prompt = torch.tensor(adapter.prompt_ids(target.tokenizer, INSTRUCTION))
    positions = torch.arange(len(prompt))

    def rows(**fields):
        return Rows("r", 1, 0, 0, positions, prompt, **fields)

    features = adapter.features(frames[0])
    cases = [(dict(task="chess"), r"task: this stage serves no task 'chess' \(tasks: 'nav'\)"),
             (dict(task="nav"), r"image: task 'nav' needs the image features with its first rows"),
             (dict(image=features), r"image: an image needs a task"),
             (dict(task="nav", image=features[:3]), r"image: image features must be 8 x 64")]
    for fields, message in cases:
        with pytest.raises(StageError, match=message):
            first.run(rows(**fields))
        assert not first.caches and not first.requests
    first.run(rows(task="nav", image=features))
    more = Rows("r", 2, len(prompt), 0, torch.tensor([len(prompt)]), torch.tensor([5]))
    with pytest.raises(StageError, match=r"task: '', the request runs 'nav'"):
        first.run(more)
    hidden = torch.zeros(2, 32)
    with pytest.raises(StageError, match=r"states is \(1,\), expected \(2,\)"):
        last.run(Rows("x", 1, 0, 0, torch.arange(2), hidden, task="nav", states=torch.tensor([0])))
    plain = Rows("y", 1, 0, 0, torch.arange(2), hidden, states=torch.tensor([0, -1]))
    with pytest.raises(StageError, match=r"states: task '' has no grammar here"):
        last.run(plain)


def test_grammar_states_are_numbered_the_same_in_every_process():
    """A state's number is its place in a breadth-first walk over the sorted alphabet: a grammar
    built anew numbers every state alike, and each number gives back its state's mask."""
    from edge_llm_ros.core.engine.models import load_tokenizer

    tokenizer = load_tokenizer()
    one, two = (answer_grammar(tokenizer, len(tokenizer)) for _ in range(2))
    two.warm()  # masks made in another order first
    states = one.reachable()
    assert states == two.reachable() and states[0] == one.start and len(states) > 100
    answer = tokenizer("reason: red chair ahead, 2 m\naction: forward", add_special_tokens=False)["input_ids"]
    for k in range(len(answer) + 1):
        state = one.state_after(answer[:k])
        assert one.state_id(state) == two.state_id(two.state_after(answer[:k])) >= 0
        assert torch.equal(two.mask_of(one.state_id(state)), one.allowed(answer[:k]))
    assert one.state_id(None) == -1 and not one.mask_of(-1).any()
    with pytest.raises(ValueError, match="not one of the"):
        one.mask_of(len(states))
