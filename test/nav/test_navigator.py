"""The navigator's decision on a tiny random VLM (tiny Llamas on SmolLM2's tokenizer, a random
adapter) and camera frames from the simulator: answers stay in the grammar, speculative modes give
the AR answer token for token, a frame enters as the image's rows (another frame, another answer
state), and malformed frames are refused naming the field."""

import numpy as np
import pytest

from edge_llm_ros.core.engine.config import GenerationConfig
from edge_llm_ros.nav.actions import ANSWER
from edge_llm_ros.nav.camera import Camera
from edge_llm_ros.nav.frames import FrameError, from_compressed, from_raw
from edge_llm_ros.nav.navigator import Navigator, Waiting
from edge_llm_ros.nav.vlm import AdapterConfig, NavAdapter, lora_shapes


@pytest.fixture(scope="module")
def vlm(tiny_lms):
    target, draft = tiny_lms
    adapter = NavAdapter(AdapterConfig(hidden={"target": 32, "draft": 32})).eval()
    return adapter, target, draft


def test_speculative_modes_give_the_ar_answer_and_stay_in_the_grammar(vlm, frames):
    adapter, target, draft = vlm
    answers = {}
    for mode in ("ar", "sd", "tree"):
        config = GenerationConfig(mode=mode, max_new_tokens=64, gamma=3, tree_depth=3, tree_width=6)
        navigator = Navigator(adapter, target, draft if mode != "ar" else None, config)
        answers[mode] = [navigator.decide(frame, "go to the red chair") for frame in frames]
    for mode in ("sd", "tree"):
        assert [d.text for d in answers[mode]] == [d.text for d in answers["ar"]], mode
    grammar = navigator.grammar
    for decision in answers["ar"]:
        ids = target.tokenizer.encode(decision.text, add_special_tokens=False)
        assert grammar.walk(ANSWER.start, decision.text) is not None  # a sentence of the grammar or its prefix
        assert decision.valid == (decision.error == "") and (decision.valid or decision.command.verb == "stop")
        assert 0.0 <= decision.confidence <= 1.0 and ids


def test_the_frame_enters_as_the_images_rows(vlm, frames):
    adapter, target, _ = vlm
    ids = adapter.prompt_ids(target.tokenizer, "go to the red chair")
    assert sum(i in adapter.config.reserved_ids for i in ids) == 8
    views = [adapter.condition(target, frame) for frame in frames[:2]]
    import torch

    rows = [v.embed(torch.tensor([ids]))[0] for v in views]
    image = torch.tensor([i in adapter.config.reserved_ids for i in ids])
    assert torch.equal(rows[0][~image], rows[1][~image])  # the text's rows are the model's own
    assert not torch.allclose(rows[0][image], rows[1][image])  # the image's rows follow the frame


def test_a_navigator_refuses_sampling_and_a_missing_draft(vlm):
    adapter, target, _ = vlm
    with pytest.raises(ValueError, match="needs a draft"):
        Navigator(adapter, target, None, GenerationConfig(mode="sd"))
    with pytest.raises(ValueError, match="greedily"):
        Navigator(adapter, target, None, GenerationConfig(mode="ar", temperature=0.7))


def test_frames_decode_and_malformed_ones_name_the_field():
    import cv2

    rgb = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    assert np.array_equal(from_raw("rgb8", 6, 4, 18, rgb.tobytes()), rgb)
    padded = np.zeros((4, 20), np.uint8)
    padded[:, :18] = rgb.reshape(4, 18)
    assert np.array_equal(from_raw("bgr8", 6, 4, 20, padded.tobytes()), rgb[:, :, ::-1])
    assert from_raw("mono8", 6, 4, 6, bytes(24)).shape == (4, 6, 3)
    ok, png = cv2.imencode(".png", rgb[:, :, ::-1])
    assert ok and np.array_equal(from_compressed("png", png.tobytes()), rgb)
    for args, field in [(("yuv422", 6, 4, 12, bytes(48)), "encoding"), (("rgb8", 0, 4, 0, b""), "width"),
                        (("rgb8", 6, 4, 10, bytes(40)), "step"), (("rgb8", 6, 4, 18, bytes(50)), "data")]:
        with pytest.raises(FrameError, match=f"^{field}"):
            from_raw(*args)
    with pytest.raises(FrameError, match="^data"):
        from_compressed("jpeg", b"not a jpeg")


def test_waiting_counts_only_the_time_the_robot_stood_idle():
    waiting = Waiting(started=0.0)
    waiting.idle(1.0)
    waiting.handed_over(3.0)  # the first decision: 2 s standing
    waiting.handed_over(5.0)  # overlapped: the next one was ready when the robot became idle
    waiting.idle(9.0)
    waiting.idle(9.5)  # still the same wait
    waiting.handed_over(10.0)
    assert waiting.total_s == pytest.approx(3.0) and waiting.rounds == 3 and waiting.waited_rounds == 2
    assert waiting.first_motion_s == pytest.approx(3.0)


def test_adapter_training_lowers_the_loss_checkpoints_and_resumes(vlm, tmp_path):
    """vlm_training on the tiny VLM with LoRA on both LMs: a few steps on simulator samples lower
    the answer loss and leave the LMs' own weights alone; the checkpoint resumes where it stopped;
    the adapter saves and loads back (identity checked)."""
    import torch

    from edge_llm_ros.nav import vlm_training as vt

    adapter, target, draft = vlm
    config_ = AdapterConfig(hidden={"target": 32, "draft": 32},
                            lora={"target": lora_shapes(target), "draft": lora_shapes(draft)})
    fresh = NavAdapter(config_)
    own = {k: v.clone() for k, v in target.hf.state_dict().items()}
    samples = vt.collect_samples([vt.TRAIN_SEED_BASE], Camera(), perturb=2)[:16]
    assert len(samples) == 16
    batch = vt.make_batch(fresh, target.tokenizer, samples, action_weight=3.0)
    with torch.no_grad():
        before = float(vt.answer_loss(fresh.attach(target, "target", trainable=True), fresh, batch, "target"))
    config = vt.NavTrainConfig(epochs=3, batch_size=8, lr=1e-2, checkpoint_every=1)
    checkpoint = tmp_path / "checkpoint.pt"
    first = vt.train_adapter(fresh, target, draft, target.tokenizer, samples, config, checkpoint)
    with torch.no_grad():
        after = float(vt.answer_loss(fresh.attach(target, "target", trainable=True), fresh, batch, "target"))
    assert first["steps"] == 6 and after < before
    assert all(float(low.b.abs().max()) > 0 for low in fresh.lora["target"].values())  # LoRA learned
    assert all(torch.equal(v, own[k]) for k, v in target.hf.state_dict().items())  # the LM did not change
    resumed = vt.train_adapter(NavAdapter(config_), target, draft, target.tokenizer, samples, config, checkpoint)
    assert resumed["steps"] == 6 and resumed["final_loss"] == first["final_loss"]  # nothing left to do
    fresh.identity = {"vocab_size": target.vocab_size}
    loaded = NavAdapter.load(fresh.save(tmp_path / "adapter"))
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), fresh.state_dict().values()))
    with pytest.raises(FileNotFoundError, match="train one with: edge-llm-ros train nav"):
        NavAdapter.load(tmp_path / "missing")


def test_lora_merges_into_a_copy_that_matches_training_and_keeps_speculation_exact(vlm, frames):
    """attach: the merged copy computes what the training parametrization computes, shares every
    weight but the adapted ones, leaves the LM alone; and sd/tree still give the AR answer."""
    import torch

    _, target, draft = vlm
    adapter = NavAdapter(AdapterConfig(hidden={"target": 32, "draft": 32},
                                       lora={"target": lora_shapes(target), "draft": lora_shapes(draft)})).eval()
    torch.manual_seed(1)
    for lows in adapter.lora.values():
        for low in lows.values():
            torch.nn.init.normal_(low.b, std=0.2)
    merged, trained = adapter.attach(target, "target"), adapter.attach(target, "target", trainable=True)
    ids, positions = torch.tensor([1, 2, 3, 4, 5, 6]), torch.arange(6)
    plain = target(ids, positions, None, target.new_cache(8))
    with torch.no_grad():
        got = merged(ids, positions, None, merged.new_cache(8))
        want = trained(ids, positions, None, trained.new_cache(8))
    assert torch.allclose(got, want, atol=1e-5) and not torch.allclose(got, plain, atol=1e-3)
    layer, base = merged.hf.model.layers[0], target.hf.model.layers[0]
    assert layer.mlp.up_proj.weight is base.mlp.up_proj.weight and merged.embed_tokens.weight is target.embed_tokens.weight
    assert layer.self_attn.q_proj.weight is not base.self_attn.q_proj.weight
    assert torch.equal(target(ids, positions, None, target.new_cache(8)), plain)  # the LM itself unchanged
    answers = {}
    for mode in ("ar", "sd", "tree"):
        config = GenerationConfig(mode=mode, max_new_tokens=64, gamma=3, tree_depth=3, tree_width=6)
        navigator = Navigator(adapter, target, draft if mode != "ar" else None, config)
        answers[mode] = [navigator.decide(frame, "go to the red chair").text for frame in frames]
    assert answers["sd"] == answers["ar"] and answers["tree"] == answers["ar"]


def test_the_encoder_pretrains_on_what_frames_show_and_the_action_line_weighs_more(vlm):
    """pretrain_encoder lowers its loss on simulator frames (labels for every target kind); a
    batch weighs the action line's tokens by action_weight, the reason's by 1, the prompt's by 0."""
    from edge_llm_ros.nav import vlm_training as vt

    adapter, target, _ = vlm
    samples = vt.collect_samples([vt.TRAIN_SEED_BASE + 1], Camera(), perturb=1)[:32]
    assert all(s.labels.shape == (len(vt.TRAIN_TARGETS), 3) for s in samples)
    fresh = NavAdapter(AdapterConfig(hidden={"target": 32, "draft": 32}))
    short = vt.pretrain_encoder(fresh, samples, steps=2, batch_size=16, seed=3)
    longer = vt.pretrain_encoder(NavAdapter(AdapterConfig(hidden={"target": 32, "draft": 32})), samples, steps=60,
                                 batch_size=16, seed=3, heldout=samples)
    assert longer["final_loss"] < short["final_loss"] and 0.0 <= longer["heldout_action_accuracy"] <= 1.0
    batch = vt.make_batch(adapter, target.tokenizer, samples[:1], action_weight=3.0)
    tokens, first = vt.answer_tokens(target.tokenizer, samples[0].answer)
    weights = batch.weights[0].tolist()
    prompt = len(adapter.prompt_ids(target.tokenizer, samples[0].instruction))
    assert weights[:prompt - 1] == [0.0] * (prompt - 1)
    assert weights[prompt - 1:prompt - 1 + first] == [1.0] * first
    assert set(weights[prompt - 1 + first:prompt + len(tokens)]) == {3.0}  # the action line and EOS
    assert target.tokenizer.decode(tokens[first:]).startswith("action: ")


def test_train_nav_refuses_bad_options_before_loading_anything():
    from edge_llm_ros.tools.train import main

    assert main(["nav", "--worlds", "0"]) == 2
    assert main(["nav", "--eval-worlds", "9-3"]) == 2
    assert main(["nav", "--eval-worlds", "x"]) == 2
    assert main(["nav-exits", "--worlds", "0"]) == 2
    assert main(["nav-exits", "--layers", "4,x"]) == 2
    assert main(["nav-exits", "--perturb", "-1"]) == 2


def test_nav_exits_learn_the_constrained_targets_answers_frame_by_frame(vlm):
    """nav_exit_features: a row per answer token and EOS, the teacher's top-1 the constrained
    target's argmax; train_nav_exits: exits over the tokens the teacher used, EOS among them."""
    from edge_llm_ros.core.training.exits import ExitTrainConfig
    from edge_llm_ros.nav import vlm_training as vt
    from edge_llm_ros.nav.camera import Camera
    from edge_llm_ros.nav.navigator import answer_grammar

    adapter, target, _ = vlm
    samples = vt.collect_samples(range(vt.TRAIN_SEED_BASE, vt.TRAIN_SEED_BASE + 1), Camera(), perturb=0)[:6]
    grammar = answer_grammar(target.tokenizer, target.vocab_size)
    features = vt.nav_exit_features(adapter, target, samples, [0], grammar, batch_size=4, top_k=4)
    answers = [vt.answer_tokens(target.tokenizer, s.answer)[0] + [target.tokenizer.eos_token_id] for s in samples]
    assert len(features) == sum(len(a) for a in answers) and features.hidden[0].shape[1] == 32
    assert (features.teacher_ids[:, 0].long() == features.greedy).all()
    for row, greedy in enumerate(features.greedy[: len(answers[0])].tolist()):  # allowed by the grammar there
        assert grammar.allowed(answers[0][:row])[greedy]
    exits, result = vt.train_nav_exits(adapter, target, samples[:4], samples[4:], [0], bottleneck=8,
                                       config=ExitTrainConfig(epochs=1, batch_positions=64), progress=False)
    assert exits.layers == (0,) and target.tokenizer.eos_token_id in exits.vocab_ids.tolist()
    assert result.steps >= 1 and exits.training["heldout"]["0"]["positions"] > 0


def test_the_confidence_is_the_constrained_targets_probability_of_the_action_line(vlm, frames):
    """Read off the verified logits (no second pass), it equals a teacher-forced pass over the answer."""
    import math

    import torch

    from edge_llm_ros.core.engine.constraint import constrain
    from edge_llm_ros.core.engine.decoding import generate_all
    from edge_llm_ros.core.engine.drafters import ModelDrafter
    from edge_llm_ros.nav.actions import ACTION_PREFIX
    from edge_llm_ros.nav.navigator import action_confidence

    adapter, target, draft = vlm
    navigator = Navigator(adapter, target, draft, GenerationConfig(mode="sd", max_new_tokens=64, gamma=3))
    grammar, prompt = navigator.grammar, navigator.prompt("go to the red chair")
    for frame in frames:
        view = adapter.condition(navigator.target, frame)
        drafter = ModelDrafter(adapter.condition(navigator.draft, frame, "draft"))
        result = generate_all(view, prompt, navigator.config, drafter, grammar=grammar)
        answer, written, first = result.tokens, "", len(result.tokens)
        for i, token in enumerate(answer):
            written += grammar.texts[token]
            if "\n" + ACTION_PREFIX in written:
                first = i + 1
                break
        ids = prompt + answer
        with torch.inference_mode():
            logits = view.forward(torch.tensor(ids[:-1]), torch.arange(len(ids) - 1), None, view.new_cache(len(ids)),
                                  logits_rows=slice(len(prompt) - 1, None))
        log_p = sum(float(constrain(logits[r], grammar.allowed(answer[:r])).float().log_softmax(-1)[answer[r]])
                    for r in range(first, len(answer)))
        want = math.exp(log_p) if first < len(answer) else 0.0
        assert action_confidence(answer, result.stats.token_probs, grammar) == pytest.approx(want, abs=1e-4)
        decision = navigator.decide(frame, "go to the red chair")  # the same answer, its confidence
        assert decision.confidence == pytest.approx(want if decision.valid else 0.0, abs=1e-4)
