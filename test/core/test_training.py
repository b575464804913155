"""Drafter training: draft files, mismatched targets, KD, checkpoints and the dataset cache on tiny
models; and the shipped SmolLM2 draft, lossless in mode sd."""

import json

import pytest
import torch
from toy import PROMPTS, VOCAB, tiny_target

from edge_llm_ros.core.drafts.draft_models import (
    DraftMismatchError,
    build_draft,
    default_draft_path,
    init_layer_ids,
    load_draft,
    load_drafter,
    save_draft,
)
from edge_llm_ros.core.engine.config import GenerationConfig
from edge_llm_ros.core.engine.decoding import generate_all
from edge_llm_ros.core.engine.drafters import ModelDrafter
from edge_llm_ros.core.engine.models import chat_prompt
from edge_llm_ros.core.training import distill as training
from edge_llm_ros.core.training.distill import (
    TrainConfig,
    evaluate_agreement,
    frequent_vocab,
    generate_responses,
    split_dataset,
    train_draft,
)


def test_responses_are_the_targets_greedy_output(target, dataset):
    for sample in dataset[:4]:
        ref = generate_all(target, sample.prompt_ids, GenerationConfig(max_new_tokens=24)).tokens
        assert sample.response_ids == ref
        assert sample.teacher_ids.shape == (len(ref), 16)
        assert sample.teacher_ids[:, 0].tolist() == ref  # row j's top-1 is the greedy token j


def test_sampled_responses_are_seeded_and_record_the_untempered_target(target, dataset):
    first = generate_responses(target, PROMPTS[:6], 16, batch_size=3, topk=8, temperature=1.5, seed=7,
                               progress=False)
    again = generate_responses(target, PROMPTS[:6], 16, batch_size=3, topk=8, temperature=1.5, seed=7,
                               progress=False)
    assert [s.response_ids for s in first] == [s.response_ids for s in again]
    assert [s.response_ids for s in first] != [s.response_ids for s in dataset[:6]]  # not the greedy ones
    # row j's top-1 is the target's argmax after the sampled prefix, recomputed in one pass
    batch = training.collate(first, training.vocab_index(VOCAB, None))
    ids, _ = training.online_teacher(target, batch, None, topk=1)
    assert torch.equal(ids[:, 0], batch.greedy)


def test_draft_round_trip(target, tmp_path):
    draft = build_draft(target, 2, "spread", vocab_ids=torch.tensor([1, 5, 9, VOCAB - 1]), name="toy")
    assert draft.init_layers == [0, 3]
    save_draft(draft, tmp_path, target)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["init_layers"] == [0, 3] and config["target"]["vocab_size"] == VOCAB
    loaded = load_draft(target, tmp_path)
    ours, theirs = draft.model.hf.model.state_dict(), loaded.model.hf.model.state_dict()
    for key in ours:
        if key.startswith("embed_tokens"):
            continue
        assert torch.equal(ours[key].half().float(), theirs[key]), key  # stored fp16
    assert torch.equal(loaded.vocab_ids, draft.vocab_ids)
    # embeddings and head are the target's own modules, not copies
    assert loaded.model.embed_tokens is target.embed_tokens and loaded.model.lm_head is target.lm_head
    assert isinstance(load_drafter(target, tmp_path), ModelDrafter)
    # only the draft's own weights are stored: no embedding or head tensor in the file
    from safetensors.torch import load_file

    stored = load_file(tmp_path / "model.safetensors")
    assert all(k.startswith(("layers.", "norm.")) or k == "vocab_ids" for k in stored)


def test_mismatched_target_is_refused(target, tmp_path):
    save_draft(build_draft(target, 1), tmp_path, target)
    with pytest.raises(DraftMismatchError, match="vocabulary size: draft 64, target 80"):
        load_draft(tiny_target(vocab_size=80), tmp_path)
    with pytest.raises(DraftMismatchError, match="tokenizer"):
        load_draft(tiny_target(salt="other"), tmp_path)
    with pytest.raises(FileNotFoundError, match="not a draft directory"):
        load_draft(target, tmp_path / "missing")


def test_bad_layer_choices():
    assert init_layer_ids(30, 4, "spread") == [0, 10, 19, 29]
    assert init_layer_ids(30, 2, "first") == [0, 1]
    with pytest.raises(ValueError, match="1..30 layers"):
        init_layer_ids(30, 31)
    with pytest.raises(ValueError, match="unknown init"):
        init_layer_ids(30, 2, "middle")


def test_kd_lowers_the_loss_and_raises_agreement(target, dataset):
    train, heldout = dataset[:12], dataset[12:]
    vocab_ids = frequent_vocab(train, 48, VOCAB, always=[VOCAB - 1])
    draft = build_draft(target, 1, vocab_ids=vocab_ids)
    config = TrainConfig(epochs=30, lr=3e-3, warmup_steps=5, batch_tokens=128, seed=0)
    before = evaluate_agreement(draft.model, train, vocab_ids, config=config)
    result = train_draft(draft.model, train, config, vocab_ids, heldout=heldout, progress=False)
    after = evaluate_agreement(draft.model, train, vocab_ids, config=config)
    assert after["loss"] < 0.5 * before["loss"]
    assert after["agreement"] > before["agreement"] + 0.2
    assert result.evals[-1]["positions"] == sum(len(s.response_ids) for s in heldout)
    # the target recomputed online (right padding, one pass) agrees with what generate recorded
    batch = training.collate(train, training.vocab_index(VOCAB, vocab_ids))
    ids, p = training.online_teacher(target, batch, vocab_ids, topk=8)
    inside = batch.greedy >= 0
    assert torch.equal(ids[inside, 0], batch.greedy[inside])
    assert torch.allclose(p.sum(-1), torch.ones(len(p)))


def test_resume_continues_where_it_stopped(target, dataset, tmp_path, monkeypatch):
    config = TrainConfig(epochs=4, lr=2e-3, warmup_steps=2, batch_tokens=128, checkpoint_every=5, seed=3)
    straight = build_draft(target, 1)
    train_draft(straight.model, dataset, config, progress=False)

    interrupted = build_draft(target, 1)
    calls, real_loss = [0], training.kd_loss

    def failing_loss(*args):
        calls[0] += 1
        if calls[0] == 8:  # after the checkpoint at step 5
            raise KeyboardInterrupt
        return real_loss(*args)

    monkeypatch.setattr(training, "kd_loss", failing_loss)
    with pytest.raises(KeyboardInterrupt):
        train_draft(interrupted.model, dataset, config, checkpoint=tmp_path / "ckpt.pt", progress=False)
    monkeypatch.setattr(training, "kd_loss", real_loss)
    resumed = train_draft(interrupted.model, dataset, config, checkpoint=tmp_path / "ckpt.pt", resume=True,
                          progress=False)
    assert resumed.resumed_from == 5
    assert len(resumed.losses) == resumed.steps  # steps 0..4 from the checkpoint, 5.. from this run
    for a, b in zip(training.trainable_parameters(straight.model), training.trainable_parameters(interrupted.model)):
        assert torch.allclose(a, b, atol=1e-6)
    with pytest.raises(ValueError, match="another run"):
        other = TrainConfig(epochs=2, batch_tokens=128, checkpoint_every=5)
        train_draft(build_draft(target, 1).model, dataset, other, checkpoint=tmp_path / "ckpt.pt", resume=True,
                    progress=False)


def test_dataset_cache_resumes(target, tmp_path, monkeypatch):
    path = tmp_path / "responses.pkl"
    first = generate_responses(target, PROMPTS[:5], 8, batch_size=2, cache_path=path, progress=False)
    with open(path, "ab") as f:
        f.write(b"\x80\x05torn")  # a record cut short by a kill
    generated = []
    real = training._generate_batch

    def counting(target, batch, *args):
        generated.extend(p.text for p, _ in batch)
        return real(target, batch, *args)

    monkeypatch.setattr(training, "_generate_batch", counting)
    again = generate_responses(target, PROMPTS[:8], 8, batch_size=2, cache_path=path, progress=False)
    assert sorted(generated) == sorted(p.text for p in PROMPTS[5:8])
    assert [s.response_ids for s in again[:5]] == [s.response_ids for s in first]
    with pytest.raises(ValueError, match="other settings"):
        generate_responses(target, PROMPTS[:2], 16, cache_path=path, progress=False)


def test_vocab_subset_ranks_by_the_targets_expected_counts():
    import numpy as np

    def sample(ids, probs):
        return training.Sample("k", "toy", [0], [row[0] for row in ids], np.array(ids, dtype=np.int32),
                               np.log(np.array(probs, dtype=np.float16)))

    # expected counts: 7 -> 1.2 (emitted twice), 9 -> 0.9 (never emitted), 5 -> 0.5, 3 -> 0.4
    data = [sample([[7, 9], [7, 3]], [[0.6, 0.4], [0.6, 0.4]]), sample([[5, 9]], [[0.5, 0.5]])]
    assert frequent_vocab(data, 2, VOCAB).tolist() == [7, 9]
    assert frequent_vocab(data, 3, VOCAB, always=[63]).tolist() == [7, 9, 63]
    assert frequent_vocab(data, 6, VOCAB).tolist() == [0, 1, 3, 5, 7, 9]  # the rest: lowest ids first
    with pytest.raises(ValueError, match="subset size"):
        frequent_vocab(data, VOCAB + 1, VOCAB)


def test_split_is_stable_and_disjoint(dataset):
    train, heldout = split_dataset(dataset, 0.25)
    assert {s.key for s in train}.isdisjoint({s.key for s in heldout}) and len(train) + len(heldout) == len(dataset)
    assert split_dataset(list(reversed(dataset)), 0.25)[1] == list(reversed(heldout))


def test_builtin_prompts_and_humaneval():
    prompts = training.load_prompts()
    sources = {p.source for p in prompts}
    assert {"robot", "everyday", "humaneval"} <= sources
    assert sum(p.source == "humaneval" for p in prompts) == 164
    assert 150 <= sum(p.chat for p in prompts) <= 300
    assert len({p.key for p in prompts}) == len(prompts)


def test_shipped_draft_is_lossless_on_smollm2(smollm2):
    drafter = load_drafter(smollm2)  # the default shipped in edge_llm_ros/data/drafters/
    assert default_draft_path().name == "smollm2-135m-instruct"
    prompt = chat_prompt(smollm2.tokenizer, "Walk to the kitchen and tell me what is on the table.")
    ar = generate_all(smollm2, prompt, GenerationConfig(mode="ar", max_new_tokens=32))
    sd = generate_all(smollm2, prompt, GenerationConfig(mode="sd", gamma=4, max_new_tokens=32), drafter=drafter)
    assert sd.tokens == ar.tokens
    assert sd.stats.tau > 1.2  # the trained draft is accepted (an untrained one: tau ~1.05)


def test_train_command_rejects_bad_input_before_loading(capsys):
    from edge_llm_ros.tools.train import main

    assert main(["exits", "--layers", "x"]) == 2
    assert "--layers must be comma-separated integers" in capsys.readouterr().err
    assert main(["draft", "--layers", "0"]) == 2
    assert "--layers must be > 0" in capsys.readouterr().err
    assert main(["draft", "--model", "/nonexistent/model.gguf"]) == 2
    assert "model not found" in capsys.readouterr().err
