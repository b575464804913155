"""Early exits: the adapter's identity start (logit lens), files and mismatched targets, the
self-drafter lossless in every drafting mode, KD training and its resume, the ``train exits``
command and the ``exit:K`` draft spec on tiny models; the shipped SmolLM2 exits, lossless."""

import json

import pytest
import torch
from toy import VOCAB, tiny_target

from edge_llm_ros.core.drafts.draft_models import DraftMismatchError
from edge_llm_ros.core.drafts.exits import (
    ExitDrafter,
    build_exits,
    default_exits_path,
    exit_confidence,
    load_exit_drafter,
    load_exits,
    save_exits,
)
from edge_llm_ros.core.engine.config import GenerationConfig
from edge_llm_ros.core.engine.decoding import generate_all
from edge_llm_ros.core.engine.models import chat_prompt
from edge_llm_ros.core.training import exits as E
from edge_llm_ros.core.training.exits import ExitTrainConfig, evaluate_exits, exit_features, train_exits

SUBSET = torch.tensor([0, 3, 5, 8, 13, 21, 34, 55, VOCAB - 1])


def randomised(exits, scale: float = 0.5, seed: int = 1):
    """Exits with every weight drawn at random (an 'trained' stand-in far from the logit lens)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in exits.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * scale)
    return exits


def hidden_states(target, ids, layers):
    cache = target.new_cache(len(ids))
    _, out = target.run_layers(target.embed(torch.tensor([ids])), torch.arange(len(ids)), None, cache,
                               collect=layers)
    return out


def test_untrained_exit_is_the_logit_lens(target):
    exits = build_exits(target, [0, 1, 2], bottleneck=8)
    out = hidden_states(target, [5, 9, 2, 40, 7, 7, 1], [0, 1, 2])
    for layer in exits.layers:
        lens = target.head(out[layer])
        assert torch.equal(exits.exit_logits(target, layer, out[layer]), lens)
        sub = exits.exit_logits(target, layer, out[layer], vocab_ids=SUBSET)
        assert torch.allclose(sub[..., SUBSET], lens[..., SUBSET], atol=1e-5)
        outside = torch.ones(VOCAB, dtype=torch.bool)
        outside[SUBSET] = False
        assert torch.isinf(sub[..., outside]).all()
    # Eq. 4: S = max softmax, a probability
    conf = exit_confidence(lens)
    assert conf.shape == lens.shape[:-1] and bool(((conf > 0) & (conf <= 1)).all())
    assert torch.allclose(conf, lens.softmax(-1).max(-1).values)
    with pytest.raises(ValueError, match="exits at layers 0, 1, 2"):
        exits.adapter(3)
    with pytest.raises(ValueError, match=r"exit layers must be in \[0, 2\]"):
        build_exits(target, [3])


def test_round_trip(target, tmp_path):
    exits = randomised(build_exits(target, [2, 0], bottleneck=8, vocab_ids=SUBSET, name="toy"))
    exits.training = {"note": "kept"}
    save_exits(exits, tmp_path, target)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["layers"] == [0, 2] and config["bottleneck"] == 8 and config["vocab_subset"] == len(SUBSET)
    assert config["target"]["vocab_size"] == VOCAB
    loaded = load_exits(target, tmp_path)
    assert loaded.layers == (0, 2) and loaded.training == {"note": "kept"} and loaded.name == "toy"
    assert torch.equal(loaded.vocab_ids, SUBSET)
    ours, theirs = exits.adapters.state_dict(), loaded.adapters.state_dict()
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key].half().float(), theirs[key]), key  # stored fp16
    from safetensors.torch import load_file

    stored = load_file(tmp_path / "model.safetensors")
    assert all(k.startswith("exits.") or k == "vocab_ids" for k in stored)
    assert {v.dtype for k, v in stored.items() if k != "vocab_ids"} == {torch.float16}


def test_another_target_is_refused(target, tmp_path):
    save_exits(build_exits(target, [1], bottleneck=4), tmp_path, target)
    with pytest.raises(DraftMismatchError, match="vocabulary size: draft 64, target 80"):
        load_exits(tiny_target(vocab_size=80), tmp_path)
    with pytest.raises(DraftMismatchError, match="tokenizer"):
        load_exits(tiny_target(salt="other"), tmp_path)
    with pytest.raises(DraftMismatchError, match="hidden size: draft 32, target 48"):
        load_exits(tiny_target(hidden_size=48), tmp_path)
    with pytest.raises(FileNotFoundError, match="not an exits directory"):
        load_exits(target, tmp_path / "missing")
    with pytest.raises(ValueError, match="no exit at layer 2 .* use exit:2"):
        load_exit_drafter(target, 3, tmp_path)


def test_exit_drafter_drafts_from_the_exit(target):
    """The drafter's logits after the context are the exit's logits on the target's K-layer output."""
    exits = randomised(build_exits(target, [1], bottleneck=8))
    drafter = exits.drafter(target, 2)
    assert isinstance(drafter, ExitDrafter) and drafter.exit_layer == 1 and list(drafter.model.layer_ids) == [0, 1]
    ids = [4, 8, 15, 16, 23, 42]
    expected = exits.exit_logits(target, 1, hidden_states(target, ids, [1])[1])[0, -1]
    assert torch.allclose(drafter._sync(ids), expected, atol=1e-5)
    assert not torch.allclose(expected, target.head(hidden_states(target, ids, [1])[1])[0, -1])  # not the lens


@pytest.mark.parametrize("mode", ["sd", "tree", "llmcad"])
@pytest.mark.parametrize("subset", [False, True])
def test_exit_drafter_is_lossless(target, dataset, mode, subset):
    exits = randomised(build_exits(target, [0, 1], bottleneck=8, vocab_ids=SUBSET if subset else None), 0.1)
    drafter = exits.drafter(target, 2)
    for sample in dataset[12:14]:
        ar = generate_all(target, sample.prompt_ids, GenerationConfig(max_new_tokens=24))
        out = generate_all(target, sample.prompt_ids, GenerationConfig(mode=mode, max_new_tokens=24), drafter=drafter)
        assert out.tokens == ar.tokens
        assert out.stats.rounds > 0


def test_training_raises_agreement(target, dataset):
    train = dataset[:12]
    features = exit_features(target, train, [0, 1], batch_tokens=256, progress=False)
    assert len(features) == sum(len(s.response_ids) for s in train)
    assert features.hidden[0].dtype == torch.float16 and features.hidden[1].shape == (len(features), 32)
    # the recorded inputs are the engine's own hidden states at those positions
    s = train[0]
    ref = hidden_states(target, s.prompt_ids + s.response_ids, [1])[1][0, len(s.prompt_ids) - 1]
    assert torch.allclose(features.hidden[1][0].float(), ref, atol=1e-2)
    assert features.greedy[: len(s.response_ids)].tolist() == s.response_ids  # greedy data: argmax = response

    exits = build_exits(target, [0, 1], bottleneck=32)
    config = ExitTrainConfig(epochs=40, lr=3e-2, warmup_steps=5, batch_positions=64)
    before = evaluate_exits(target, exits, features)
    result = train_exits(target, exits, features, config, heldout=features, progress=False)
    after = result.evals[-1]["exits"]
    for layer in (0, 1):
        assert after[layer]["loss"] < 0.5 * before[layer]["loss"]
        assert after[layer]["agreement"] > before[layer]["agreement"] + 0.2
    assert result.losses[-1] < result.losses[0]
    assert all(not p.requires_grad for p in exits.parameters())
    assert all(p.grad is None for p in target.hf.parameters())  # the target stays untouched


def test_features_are_cached(target, dataset, tmp_path, monkeypatch):
    train = dataset[:4]
    path = tmp_path / "features.pt"
    first = exit_features(target, train, [1], cache_path=path, progress=False)
    monkeypatch.setattr(type(target), "run_layers", lambda *a, **k: pytest.fail("recomputed"))
    again = exit_features(target, train, [1], cache_path=path, progress=False)
    assert torch.equal(first.hidden[1], again.hidden[1]) and torch.equal(first.teacher_p, again.teacher_p)
    monkeypatch.undo()
    other = exit_features(target, train, [0, 1], cache_path=path, progress=False)  # other layers: recomputed
    assert torch.equal(other.hidden[1], first.hidden[1]) and 0 in other.hidden


def test_resume_continues_where_it_stopped(target, dataset, tmp_path, monkeypatch):
    features = exit_features(target, dataset[:12], [0, 2], progress=False)
    config = ExitTrainConfig(epochs=3, lr=3e-3, warmup_steps=2, batch_positions=32, checkpoint_every=4, seed=3)
    straight = build_exits(target, [0, 2], bottleneck=8)
    train_exits(target, straight, features, config, progress=False)

    interrupted = build_exits(target, [0, 2], bottleneck=8)
    calls, real_loss = [0], E.kd_loss

    def failing_loss(*args):
        calls[0] += 1
        if calls[0] == 2 * 6 + 1:  # two exits per step: dies in step 7, after the checkpoint at step 4
            raise KeyboardInterrupt
        return real_loss(*args)

    monkeypatch.setattr(E, "kd_loss", failing_loss)
    with pytest.raises(KeyboardInterrupt):
        train_exits(target, interrupted, features, config, checkpoint=tmp_path / "ckpt.pt", progress=False)
    monkeypatch.setattr(E, "kd_loss", real_loss)
    resumed = train_exits(target, interrupted, features, config, checkpoint=tmp_path / "ckpt.pt", resume=True,
                          progress=False)
    assert resumed.resumed_from == 4 and len(resumed.losses) == resumed.steps
    for a, b in zip(straight.parameters(), interrupted.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
    with pytest.raises(ValueError, match="another run"):
        train_exits(target, build_exits(target, [0, 2], bottleneck=4), features, config,
                    checkpoint=tmp_path / "ckpt.pt", resume=True, progress=False)


# -- the command and the draft spec -------------------------------------------------------------------


def test_train_exits_command_on_a_tiny_model(tmp_path, capsys):
    from edge_llm_ros.core.drafts.loading import build_drafter
    from edge_llm_ros.core.drafts.loading import tiny_target as byte_target
    from edge_llm_ros.tools.train import main

    model = tmp_path / "model"
    tiny = byte_target()
    tiny.hf.save_pretrained(model)
    tiny.tokenizer.save_pretrained(model)
    out, work = tmp_path / "exits", tmp_path / "work"
    common = ["exits", "--model", str(model), "--work", str(work), "--out", str(out), "--threads", "1", "--quiet"]
    argv = common + ["--prompts", "10", "--heldout", "0.3", "--no-humaneval", "--max-new-tokens", "8",
                     "--layers", "0", "--bottleneck", "8", "--epochs", "2", "--vocab-subset", "64",
                     "--speed-prompts", "1"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "exit at layer 0: held-out agreement" in err and "lossless True" in err
    config = json.loads((out / "config.json").read_text())
    training = config["training"]
    assert config["layers"] == [0] and config["vocab_subset"] == 64
    assert training["command"].startswith("edge-llm-ros train exits --model")
    assert set(training["heldout_before"]["0"]) >= {"agreement", "agreement_full", "loss", "positions"}
    assert training["speed"]["draft"] == "exit:1" and training["speed"]["lossless"]
    assert (work / "exit-features-l0-train.pt").exists() and list(work.glob("checkpoint-exits-*.pt"))
    exits = load_exits(tiny, out)
    assert exits.layers == (0,) and len(exits.vocab_ids) == 64
    draft = build_drafter(f"exit:1:{out}", tiny)
    assert isinstance(draft.drafter, ExitDrafter) and "exit at layer 0" in draft.description
    assert main(argv + ["--resume"]) == 0  # the finished checkpoint resumes to the same end

    for bad, message in (
        (["--layers", "a,b"], "--layers must be comma-separated integers"),
        (["--layers", "-1"], "--layers must list decoder layers >= 0"),
        (["--bottleneck", "0"], "--bottleneck must be > 0"),
        (["--heldout", "1.5"], "--heldout must be in (0, 1)"),
        (["--layers", "1"], "exits go after layers 0..0 of this 2-layer target"),
    ):
        assert main(common + bad) == 2, bad
        lines = capsys.readouterr().err.strip().splitlines()
        assert lines[-1].startswith("error: ") and message in lines[-1], lines
        assert not [line for line in lines if line.startswith("error")][:-1]
    assert main(["exits", "--model", "/nonexistent/model.gguf"]) == 2
    assert "model not found" in capsys.readouterr().err


def test_exit_spec_errors_and_the_transformers_view(target, tmp_path):
    from edge_llm_ros.core.drafts.loading import LoadError, build_drafter, check_draft_spec
    from edge_llm_ros.tools.loading import hf_assist_for

    for spec, message in (("exit", "expected exit:K"), ("exit:x", "expected exit:K"), ("exit:0", "K >= 1"),
                          (f"exit:1:{tmp_path / 'none'}", "not found")):
        with pytest.raises(LoadError, match=message):
            check_draft_spec(spec)
    save_exits(randomised(build_exits(target, [1], bottleneck=8), 0.2), tmp_path, target)
    with pytest.raises(LoadError, match="K must be in"):
        build_drafter(f"exit:4:{tmp_path}", target)
    with pytest.raises(LoadError, match="no exit at layer 0"):
        build_drafter(f"exit:1:{tmp_path}", target)
    draft = build_drafter(f"exit:2:{tmp_path}", target)
    # transformers' assisted generation runs the same draft: layers, then the adapter, norm, head
    assistant = hf_assist_for(draft).assistant
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    with torch.no_grad():
        theirs = assistant(torch.tensor([ids])).logits[0, -1]
    assert torch.allclose(draft.drafter._sync(ids), theirs, atol=1e-4)


# -- the shipped exits on the real SmolLM2 ----------------------------------------------------------------


def test_shipped_exits_are_lossless_on_smollm2(smollm2):
    folder = default_exits_path()
    assert folder.name == "smollm2-135m-instruct"
    assert sum(f.stat().st_size for f in folder.iterdir()) < 20e6
    exits = load_exits(smollm2)
    assert exits.layers == (4, 8, 16, 24)
    after = exits.training["heldout_after"]
    assert all(after[str(k)]["agreement"] > exits.training["heldout_before"][str(k)]["agreement"] for k in exits.layers)
    drafter = load_exit_drafter(smollm2, 5)  # layers 0..4 + the exit at layer 4
    accepted = []
    for text in ("Walk to the kitchen and tell me what is on the table.", "What is the capital of France?"):
        prompt = chat_prompt(smollm2.tokenizer, text)
        ar = generate_all(smollm2, prompt, GenerationConfig(mode="ar", max_new_tokens=32))
        sd = generate_all(smollm2, prompt, GenerationConfig(mode="sd", gamma=4, max_new_tokens=32), drafter=drafter)
        assert sd.tokens == ar.tokens
        accepted += sd.stats.accepted
    assert sum(accepted) > 0  # the trained exit drafts tokens the target accepts
