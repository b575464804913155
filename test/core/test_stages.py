"""Pipeline stages (issue 14): a layer range each, loaded alone, chained equal to the whole model.

- Stages of uneven layer ranges, chained, give the whole model's logits, and greedy decoding
  through them equals the engine's `ar` on SmolLM2 for 2 and 3 stages.
- Pipelined prefill (Jupiter §IV-A): a prompt injected in chunks, each attending to the cached
  earlier chunks, gives the logits of the prompt in one pass.
- A stage loads only its own tensors; the rest of the model stays on the meta device.
- Tree rows with masks, then a prune: the cache keeps prefix + kept rows; rows of an earlier step
  arriving after the prune are pruned on arrival, renumbered, and give the logits of a pass over
  the pruned tree; pruned rows never run.
- Rows that do not fit (wrong width, stale cache length, wrong mask shape) are refused with the
  field named.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from edge_llm_ros.core.engine.config import preset
from edge_llm_ros.core.engine.decoding import generate_all
from edge_llm_ros.core.engine.models import chat_prompt, load_model, tiny_llama, weights_folder
from edge_llm_ros.core.engine.partial import load_stage_model
from edge_llm_ros.core.pipeline.stages import Prune, Rows, Stage, StageError, prune_rows


def stages_of(folder, splits, tokenizer=None) -> list[Stage]:
    """Stages over layer ranges cut at ``splits`` (e.g. [0, 4, 30] -> 0-3 and 4-29), each loaded alone."""
    ranges = [range(a, b) for a, b in zip(splits, splits[1:])]
    return [Stage(load_stage_model(folder, r, first=i == 0, last=i == len(ranges) - 1, tokenizer=tokenizer), r,
                  first=i == 0, last=i == len(ranges) - 1) for i, r in enumerate(ranges)]


def through(stages: list[Stage], rows: Rows) -> torch.Tensor:
    """The rows through every stage in turn (as the nodes forward them): the last stage's logits."""
    out = rows
    for stage in stages:
        result = stage.run(stage.arrive(out))
        out = Rows(rows.request_id, rows.step, rows.prefix_len, rows.first_row, rows.positions, result, rows.visible)
    return out.data


def prompt_rows(rid: str, ids: list[int], start: int = 0, step: int = 0) -> Rows:
    return Rows(rid, step, start, 0, torch.arange(start, start + len(ids)), torch.tensor(ids), None)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    tiny_llama(vocab_size=64, hidden_size=32, num_layers=5, seed=3).hf.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny(tiny_folder):
    return load_model(tiny_folder, with_tokenizer=False)


def full_logits(model, ids: list[int], mask=None, positions=None) -> torch.Tensor:
    cache = model.new_cache(64)
    pos = torch.arange(len(ids)) if positions is None else positions
    return model.forward(torch.tensor(ids), pos, mask, cache)


@pytest.mark.parametrize("splits", [[0, 1, 5], [0, 3, 4, 5], [0, 5]])
def test_uneven_stages_chained_give_the_whole_models_logits(tiny, tiny_folder, splits):
    stages = stages_of(tiny_folder, splits)
    ids = [5, 9, 2, 33, 17, 8, 41]
    torch.testing.assert_close(through(stages, prompt_rows("r", ids)), full_logits(tiny, ids), rtol=0, atol=1e-5)
    assert [s.cache_length("r") for s in stages] == [len(ids)] * len(stages)


def test_a_stage_holds_only_its_own_tensors(tiny_folder):
    middle = load_stage_model(tiny_folder, range(2, 4), first=False, last=False)
    real = {n for n, p in middle.hf.named_parameters() if p.device.type != "meta"}
    assert real and all(n.startswith(("model.layers.2.", "model.layers.3.")) for n in real)
    last = load_stage_model(tiny_folder, range(4, 5), first=False, last=True)
    real = {n for n, p in last.hf.named_parameters() if p.device.type != "meta"}
    assert "model.norm.weight" in real and "model.embed_tokens.weight" in real  # the tied head's table
    assert last.hf.lm_head.weight is last.hf.model.embed_tokens.weight
    assert not any(n.startswith(("model.layers.0.", "model.layers.3.")) for n in real)


def test_pipelined_prefill_chunks_attend_to_the_cached_earlier_chunks(tiny, tiny_folder):
    stages = stages_of(tiny_folder, [0, 2, 5])
    ids = list(range(3, 40, 2))
    logits, at = [], 0
    for step, size in enumerate([7, 5, 4, 3]):  # later chunks shorter, as Jupiter's plan makes them
        logits.append(through(stages, prompt_rows("r", ids[at:at + size], at, step)))
        at += size
    whole = full_logits(tiny, ids)
    torch.testing.assert_close(torch.cat(logits), whole, rtol=1e-4, atol=1e-4)  # other matmul shapes: rounding
    assert torch.equal(torch.cat(logits).argmax(-1), whole.argmax(-1))


def tree_rows(rid, step, prefix, first, tokens, parents, depth) -> Rows:
    """Rows for round rows first..first+T-1 of a tree given by each node's parent (-1 = the prefix)."""
    n = first + len(tokens)
    visible = torch.zeros(len(tokens), n, dtype=torch.bool)
    for r in range(len(tokens)):
        node = first + r
        while node >= 0:
            visible[r, node] = True
            node = parents[node]
    return Rows(rid, step, prefix, first, torch.tensor([prefix + d for d in depth[first:n]]), torch.tensor(tokens),
                visible)


def test_prune_keeps_prefix_and_kept_rows_and_prunes_rows_in_flight(tiny, tiny_folder):
    stages = stages_of(tiny_folder, [0, 2, 5])
    prompt = [4, 8, 15, 16, 23, 42]
    through(stages, prompt_rows("r", prompt))
    p = len(prompt)
    # a tree of 6 round rows: 0 -> 1 -> 3, 0 -> 2, 1 -> 4, 3 -> 5 (parents), verified in two segments
    tokens, parents, depth = [7, 11, 13, 17, 19, 29], [-1, 0, 0, 1, 1, 3], [0, 1, 1, 2, 2, 3]
    first_segment = tree_rows("r", 1, p, 0, tokens[:3], parents, depth)
    through(stages, first_segment)
    second_segment = tree_rows("r", 2, p, 3, tokens[3:], parents, depth)  # still between stage 0 and 1:
    in_flight = dataclasses.replace(second_segment, data=stages[0].run(stages[0].arrive(second_segment)))
    # the target's choice after the root (node 0) is node 1: the root is committed, node 1 is the new
    # root, and its subtree 1 -> {3, 4} -> 5 stays; node 2 goes
    prune = Prune("r", 3, p, (0, 1, 3, 4, 5), committed=1)
    for stage in stages:
        stage.prune(prune)
    assert [s.cache_length("r") for s in stages] == [p + 5, p + 2]  # stage 1 holds only segment 1's kept rows
    arrived = stages[1].arrive(in_flight)
    assert (arrived.prefix_len, arrived.first_row, len(arrived), arrived.step) == (p + 1, 1, 3, 3)
    out = stages[1].run(arrived)
    # the same logits as one pass over the pruned tree (rows 0, 1, 3, 4, 5 with their ancestors)
    kept = [0, 1, 3, 4, 5]
    mask = torch.full((p + 5, p + 5), torch.finfo(torch.float32).min)
    mask[:, :p] = 0
    mask[:p, :p] = torch.triu(torch.full((p, p), torch.finfo(torch.float32).min), 1)
    pruned_tree = tree_rows("r", 0, p, 0, [tokens[k] for k in kept], [-1, 0, 1, 1, 2], [depth[k] for k in kept])
    mask[p:, p:] = torch.where(pruned_tree.visible, 0.0, torch.finfo(torch.float32).min)
    positions = torch.cat([torch.arange(p), pruned_tree.positions])
    expected = full_logits(tiny, prompt + [tokens[k] for k in kept], mask, positions)
    torch.testing.assert_close(out, expected[p + 2:], rtol=0, atol=1e-5)
    assert stages[1].cache_length("r") == p + 5 == stages[0].cache_length("r")



def test_rows_that_do_not_fit_are_refused_with_the_field_named(tiny_folder):
    first, last = stages_of(tiny_folder, [0, 2, 5])
    with pytest.raises(StageError, match=r"hidden states \[rows, 32\], got \(2, 16\)"):
        last.run(Rows("r", 0, 0, 0, torch.arange(2), torch.zeros(2, 16)))
    with pytest.raises(StageError, match=r"token ids \[rows\] \(long\) at the first stage"):
        first.run(Rows("r", 0, 0, 0, torch.arange(2), torch.zeros(2, 32)))
    with pytest.raises(StageError, match=r"visible is \(2, 2\), expected \(2, first_row \+ rows = 3\)"):
        first.run(Rows("r", 0, 0, 1, torch.arange(2), torch.tensor([1, 2]), torch.ones(2, 2, dtype=torch.bool)))
    first.run(prompt_rows("r", [1, 2, 3]))
    with pytest.raises(StageError, match="expect 5 cached rows .* has 3"):  # a chunk was lost on the way
        first.run(prompt_rows("r", [4], start=5, step=1))
    first.prune(Prune("r", 4, 3, ()))
    with pytest.raises(StageError, match="prune of step 2 after step 4"):
        first.prune(Prune("r", 2, 3, ()))
    assert prune_rows(prompt_rows("r", [5], start=3, step=5), Prune("r", 4, 3, ())).step == 5  # built after it


SMOLLM_PROMPT = "Name three things a robot needs to see."


@pytest.fixture(scope="module")
def smollm():
    return load_model()


def test_greedy_through_uneven_stages_equals_ar_on_smollm2(smollm):
    """Prefill in chunks through three uneven stages, then one token per pass: the engine's `ar` tokens."""
    splits = [0, 7, 19, 30]
    ids = chat_prompt(smollm.tokenizer, SMOLLM_PROMPT)
    expected = generate_all(smollm, ids, preset("ar", max_new_tokens=24)).tokens
    stages = stages_of(weights_folder(), splits)
    at, step, logits = 0, 0, None
    for size in (20, 16, len(ids)):
        chunk = ids[at:at + size]
        if chunk:
            logits = through(stages, prompt_rows("q", chunk, at, step))
            at, step = at + len(chunk), step + 1
    out = [int(logits[-1].argmax())]
    while len(out) < len(expected):
        logits = through(stages, prompt_rows("q", out[-1:], len(ids) + len(out) - 1, step))
        out.append(int(logits[-1].argmax()))
        step += 1
    assert out == expected
    assert all(s.cache_length("q") == len(ids) + len(out) - 1 for s in stages)


RSS_SCRIPT = """
import gc, sys
from edge_llm_ros.core.engine.models import weights_folder
from edge_llm_ros.core.engine.partial import load_stage_model
def rss_mb():
    return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1]) / 1024
folder = weights_folder()
before = rss_mb()
model = load_stage_model(folder, range(12, 20), first=False, last=False)
gc.collect()
print(rss_mb() - before)
"""


DRAFT_HOME_SCRIPT = """
import gc, sys
import transformers  # noqa: F401  (imported before the baseline: both runs load it)
from edge_llm_ros.core.drafts.draft_models import load_drafter
from edge_llm_ros.core.drafts.loading import draft_home
from edge_llm_ros.core.engine.models import load_model
def rss_mb():
    return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1]) / 1024
before = rss_mb()
home = draft_home(None, None) if sys.argv[1] == "home" else load_model()
drafter = load_drafter(home)
gc.collect()
print(sum(1 for p in home.hf.parameters() if p.is_meta), rss_mb() - before)
"""


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.timeout(360)
def test_a_robots_draft_holds_the_targets_embedding_and_head_not_the_target():
    """By RSS, each in a fresh process: the shipped draft on its home (core/drafts/loading.draft_home: the
    target's embedding, norm, head and first layer, the other 29 layers never read) against the same
    draft on the whole target (332 MB against 733 MB here); and it drafts what it drafts there."""
    import subprocess
    import sys

    from edge_llm_ros.core.drafts.draft_models import load_drafter
    from edge_llm_ros.core.drafts.loading import draft_home
    from edge_llm_ros.core.engine.drafters import TreeSpec
    from edge_llm_ros.core.engine.sampling import Sampler

    def grown(which: str) -> tuple[int, float]:
        out = subprocess.run([sys.executable, "-c", DRAFT_HOME_SCRIPT, which], capture_output=True, text=True,
                             check=True, timeout=300).stdout.split()
        return int(out[-2]), float(out[-1])

    (meta, home), (none, whole) = grown("home"), grown("whole")
    assert meta > 0 and none == 0 and home < 0.6 * whole, (home, whole)
    context = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 28, 2]
    spec = TreeSpec.chain(6)
    slim = load_drafter(draft_home(None, None)).propose(context, spec, Sampler(0.0))
    assert slim.tokens == load_drafter(load_model()).propose(context, spec, Sampler(0.0)).tokens


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.timeout(360)
def test_a_middle_stage_of_smollm2_grows_its_process_by_a_fraction_of_the_model():
    """By RSS, in a fresh process: 8 of 30 layers, no embedding, no head."""
    import subprocess
    import sys

    from safetensors import safe_open

    folder = weights_folder()
    with safe_open(str(next(folder.glob("*.safetensors"))), framework="pt") as f:
        model_mb = sum(torch.Size(f.get_slice(n).get_shape()).numel() for n in f.keys()) * 4 / 2**20  # float32
    grown = float(subprocess.run([sys.executable, "-c", RSS_SCRIPT], capture_output=True, text=True, check=True,
                                 timeout=300).stdout.split()[-1])
    assert grown < 0.5 * model_mb, f"a stage of 8 of 30 layers grew RSS by {grown:.0f} MB; the model is {model_mb:.0f} MB"


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_rows_cross_the_wire_as_hidden_states_messages(dtype):
    from edge_llm_ros.nodes.wire import StageMessage
    from edge_llm_ros.runtime.interfaces import registry

    visible = torch.tensor([[1, 0, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    rows = Rows("r", 7, 12, 2, torch.tensor([14, 15]), torch.randn(2, 32), visible)
    reg = registry()
    msg = reg.new("edge_llm_ros/msg/HiddenStates", **StageMessage.from_rows(rows, stage=1, dtype=dtype).fields())
    back = StageMessage.from_msg(reg.deserialize(reg.serialize(msg), "edge_llm_ros/msg/HiddenStates")).to_rows(32)
    assert (back.request_id, back.step, back.prefix_len, back.first_row) == ("r", 7, 12, 2)
    assert torch.equal(back.positions, rows.positions) and torch.equal(back.visible, visible)
    torch.testing.assert_close(back.data, rows.data.to(getattr(torch, dtype)).float())
    ids = StageMessage.from_rows(Rows("r", 0, 0, 0, torch.arange(3), torch.tensor([5, 6, 7])), stage=0)
    assert ids.dtype == "int64" and ids.mask == b"" and torch.equal(ids.to_rows(None).data, torch.tensor([5, 6, 7]))
    assert ids.task == "" and ids.grammar_states == ids.image_features == ids.choice_probs == []
    # a task's rows: the task, each row's grammar state, the image (first rows); an answer's probabilities
    task = Rows("r", 1, 0, 0, torch.arange(3), torch.tensor([5, 6, 7]), task="nav", states=torch.tensor([-1, 0, 17]),
                image=torch.randn(8, 4))
    msg = reg.new("edge_llm_ros/msg/HiddenStates", **StageMessage.from_rows(task, 0, probs=[0.5, 0.25, 1.0]).fields())
    message = StageMessage.from_msg(reg.deserialize(reg.serialize(msg), "edge_llm_ros/msg/HiddenStates"))
    back = message.to_rows(None)
    assert back.task == "nav" and back.states.tolist() == [-1, 0, 17] and message.choice_probs == [0.5, 0.25, 1.0]
    torch.testing.assert_close(back.image, task.image.flatten())


def test_malformed_hidden_states_are_refused_with_the_field_named():
    from edge_llm_ros.nodes.wire import StageMessage, WireError

    good = StageMessage.from_rows(Rows("r", 0, 0, 1, torch.arange(2), torch.randn(2, 32),
                                       torch.ones(2, 3, dtype=torch.bool)), stage=1)
    cases = {"shape": (dataclasses.replace(good), 16), "dtype": (dataclasses.replace(good, dtype="float64"), 32),
             "data": (dataclasses.replace(good, data=good.data[:-4]), 32),
             "mask": (dataclasses.replace(good, mask=good.mask + b"\0"), 32),
             "position_ids": (dataclasses.replace(good, position_ids=[]), 32),
             "grammar_states": (dataclasses.replace(good, grammar_states=[0]), 32),
             "image_features": (dataclasses.replace(good, image_features=[float("nan")] * 8), 32),
             "choice_probs": (dataclasses.replace(good, choice_probs=[1.0] * 3), 32)}
    for field, (message, width) in cases.items():
        with pytest.raises(WireError, match=f"^{field}: ") as caught:
            message.to_rows(width)
        assert caught.value.field == field
    with pytest.raises(WireError, match="dtype: token ids into the first stage are int64, got float32"):
        good.to_rows(None)


def test_a_forked_request_continues_from_the_shared_rows_as_if_it_had_prefilled_them(tiny, tiny_folder):
    """Outline points (Jupiter §V-B) share the outline's cache: a fork of its first rows, then only
    the point's own rows, gives the logits of the whole prompt prefilled alone."""
    stages = stages_of(tiny_folder, [0, 2, 5])
    shared, own = [4, 8, 15, 16, 23, 42, 7], [11, 3, 9]
    through(stages, prompt_rows("outline", shared + [30, 31]))  # the source holds more than is shared
    for stage in stages:
        stage.prune(Prune("point", 1, len(shared), fork_from="outline"))
    assert [s.cache_length("point") for s in stages] == [len(shared)] * 2
    out = through(stages, prompt_rows("point", own, len(shared), step=2))
    torch.testing.assert_close(out, full_logits(tiny, shared + own)[len(shared):], rtol=1e-4, atol=1e-4)
    with pytest.raises(StageError, match="cannot fork 20 rows of request outline"):
        stages[0].prune(Prune("other", 1, 20, fork_from="outline"))


def test_outline_points_parse_and_the_follow_up_turn_continues_the_chat(smollm):
    from edge_llm_ros.core.pipeline.outline import follow_up_ids, parse_points

    text = "Here is an outline:\n1. Charge the battery\n2) Map the room. Then rest\n3. **Avoid stairs**: they hurt"
    assert parse_points(text, 5) == ["Charge the battery", "Map the room", "Avoid stairs"]
    assert parse_points(text, 2) == ["Charge the battery", "Map the room"]
    inline = "1. **Safety**: a robot should detect hazards, such as edges. 2. **Comfort**: A home robot should have"
    assert parse_points(inline, 4) == ["Safety", "Comfort"]  # SmolLM2's way, cut off by the token limit
    assert parse_points("Points:\n- Wheels\n* Lights\nNothing in 2024.", 4) == ["Wheels", "Lights"]
    tok = smollm.tokenizer
    whole = tok.apply_chat_template([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"},
                                     {"role": "user", "content": "Expand point 1."}], tokenize=False,
                                    add_generation_prompt=True)
    follow = tok.decode(follow_up_ids(tok, "Q", "Expand point 1."))
    assert whole.endswith(follow) and whole[: -len(follow)].endswith("A")
