"""The converted-GGUF cache: a second load of SmolLM2 reads safetensors + a saved tokenizer
instead of converting the GGUF again, and gives the same logits bit for bit and the same
tokenizer behaviour. Every test uses a temporary cache folder and a copy of the GGUF."""

import errno
import logging
import os
import shutil

import pytest
import torch

from edge_llm_ros.core.engine import models
from edge_llm_ros.core.engine.models import (
    MODEL_CACHE_ENV,
    chat_prompt,
    default_model_path,
    encode,
    gguf_cache_entry,
    load_model,
    load_tokenizer,
    model_cache_root,
)

TEXTS = [
    "Move forward two meters, then turn left and stop next to the red box.",
    "def fib(n):\n\treturn n if n < 2 else fib(n - 1) + fib(n - 2)  # 🤖 wörld",
    "  leading spaces, <|im_end|> a special token inside, and trailing newlines\n\n",
]


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory):
    """A temporary cache folder in $EDGE_LLM_ROS_MODEL_CACHE for this module."""
    root = tmp_path_factory.mktemp("model_cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(MODEL_CACHE_ENV, str(root))
        yield root


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    """A copy of the SmolLM2 GGUF, so entries are keyed on a file no other test uses."""
    path = tmp_path_factory.mktemp("gguf") / default_model_path().name
    shutil.copyfile(default_model_path(), path)
    return path


@pytest.fixture(scope="module")
def cold(cache_root, gguf):
    """First load: converts the GGUF (~30 s) and writes the cache."""
    return load_model(gguf)


@pytest.fixture(scope="module")
def warm(cold, gguf):
    """Second load: from the cache."""
    return load_model(gguf)


def forward_logits(model, ids):
    """Logits of a long prefill, a 4-row chunk and a 1-row step: each takes another matmul form
    (nn.Linear, (W @ x^T)^T, the transposed head copy; see models.py)."""
    cache, n = model.new_cache(len(ids)), len(ids)
    return [model(torch.tensor(ids[a:b]), torch.arange(a, b), None, cache)
            for a, b in [(0, n - 5), (n - 5, n - 1), (n - 1, n)]]


def test_env_var_zero_turns_the_cache_off(gguf, monkeypatch):
    monkeypatch.setenv(MODEL_CACHE_ENV, "0")
    assert model_cache_root() is None
    assert gguf_cache_entry(gguf, "float32") is None


def test_first_load_writes_complete_entries(cold, cache_root, gguf):
    weights, tokenizer = gguf_cache_entry(gguf, "float32"), gguf_cache_entry(gguf, "tokenizer")
    assert weights.parent.parent == cache_root
    assert {"model.safetensors", "config.json"} <= set(os.listdir(weights))
    assert "tokenizer.json" in os.listdir(tokenizer)
    assert "quantization_config" not in (weights / "config.json").read_text()
    assert not [p for p in weights.parent.iterdir() if p.name.startswith(".")], "temporary folders left behind"
    assert (weights / "model.safetensors").stat().st_mode & 0o044 == 0o044  # readable by others sharing the folder


def test_cached_model_gives_identical_logits(cold, warm):
    assert warm.dtype == cold.dtype == torch.float32
    assert warm.hf.lm_head.weight is warm.hf.model.embed_tokens.weight  # still tied
    assert warm.config._name_or_path == cold.config._name_or_path
    for prompt in TEXTS[:2]:
        ids = chat_prompt(cold.tokenizer, prompt)
        assert len(ids) - 5 > models.SWAPPED_HEAD_ROWS
        for a, b in zip(forward_logits(cold, ids), forward_logits(warm, ids)):
            assert torch.equal(a, b)
        with torch.inference_mode():
            assert torch.equal(cold.hf(torch.tensor([ids])).logits, warm.hf(torch.tensor([ids])).logits)


def test_cached_tokenizer_behaves_identically(cold, warm):
    a, b = cold.tokenizer, warm.tokenizer
    assert type(a) is type(b)
    assert (a.eos_token_id, a.bos_token_id, a.pad_token_id, a.unk_token_id) == (
        b.eos_token_id, b.bos_token_id, b.pad_token_id, b.unk_token_id)
    assert a.all_special_tokens == b.all_special_tokens
    assert len(a) == len(b) and a.get_vocab() == b.get_vocab()
    for text in TEXTS:
        assert encode(a, text) == encode(b, text)
        assert a(text)["input_ids"] == b(text)["input_ids"]
        assert chat_prompt(a, text, system="You are a robot.") == chat_prompt(b, text, system="You are a robot.")
        ids = encode(a, text)
        assert a.decode(ids) == b.decode(ids)
    ids = list(range(0, len(a), 97))
    assert a.decode(ids) == b.decode(ids)
    assert a.decode(ids, skip_special_tokens=True) == b.decode(ids, skip_special_tokens=True)


def test_changed_file_gets_a_new_entry(cold, gguf, tmp_path):
    """A replaced GGUF (other mtime) misses the old entries and is converted again."""
    copy = tmp_path / gguf.name
    shutil.copy2(gguf, copy)
    old = gguf_cache_entry(copy, "tokenizer")
    stat = copy.stat()
    os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    new = gguf_cache_entry(copy, "tokenizer")
    assert new != old and not new.exists()
    assert gguf_cache_entry(copy, "float32") != gguf_cache_entry(copy, "bfloat16")
    tokenizer = load_tokenizer(copy)
    assert new.is_dir()
    assert encode(tokenizer, TEXTS[0]) == encode(cold.tokenizer, TEXTS[0])


def test_unwritable_cache_warns_once_and_still_loads(cold, gguf, tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv(MODEL_CACHE_ENV, str(blocker / "cache"))  # mkdir under a file fails, even as root
    monkeypatch.setattr(models, "_cache_write_failed", False)
    with caplog.at_level(logging.WARNING, logger=models.__name__):
        tokenizer = load_tokenizer(gguf)
        models._write_cache_entry(blocker / "cache" / "other", lambda folder: None)  # fails again, silently
    assert encode(tokenizer, TEXTS[0]) == encode(cold.tokenizer, TEXTS[0])
    assert len([r for r in caplog.records if "could not cache" in r.getMessage()]) == 1


def test_failed_write_leaves_no_entry_and_no_temporary_folder(tmp_path, monkeypatch, caplog):
    """A full disk midway through the save: nothing half-written stays behind."""
    monkeypatch.setattr(models, "_cache_write_failed", False)
    entry = tmp_path / "model-abc" / "float32"

    def save(folder):
        (folder / "model.safetensors").write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    with caplog.at_level(logging.WARNING, logger=models.__name__):
        models._write_cache_entry(entry, save)
    assert not entry.exists() and os.listdir(entry.parent) == []
    assert "No space left" in caplog.text


def test_concurrent_writer_keeps_the_first_entry(tmp_path, monkeypatch, caplog):
    """Two processes converting at once: the second rename fails quietly and the first entry stays."""
    monkeypatch.setattr(models, "_cache_write_failed", False)
    entry = tmp_path / "model-abc" / "tokenizer"

    def save(folder):
        (folder / "tokenizer.json").write_text("ours")
        entry.mkdir()  # the other process finishes first
        (entry / "tokenizer.json").write_text("theirs")

    with caplog.at_level(logging.WARNING, logger=models.__name__):
        models._write_cache_entry(entry, save)
    assert (entry / "tokenizer.json").read_text() == "theirs"
    assert os.listdir(entry.parent) == ["tokenizer"]
    assert not caplog.records
