"""Independent references for every greedy output a test calls exact: not the engine's own `ar`,
but the decoding of the same weights by another implementation, computed in the test process.

- llama.cpp backend: llama-cpp-python's own high-level ``Llama.generate`` over the same GGUF
  (greedy: top_k 1, temperature 0), a fresh evaluation of the prompt per request.
- torch backend: transformers' own ``generate`` (``do_sample=False``) on the same weights.

Both stop as the engine does: at the model's EOS (the EOS token is the last one returned, as the
engine yields it) or after ``max_new_tokens``; the EOS id comes from each implementation itself
(llama.cpp's ``token_eos``, the model's generation config), not from the engine. SmolLM2's
references are cached per session by prompt: the longest decode of a prompt so far serves every
shorter request of it (greedy decoding's first n tokens do not depend on how many follow); a longer
one decodes afresh. Text is the tokenizer's decoding with special tokens skipped, as the engine's.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence

import torch

LLAMA_CONTEXT = 1024  # llama.cpp's context for the reference (prompt + HORIZON fit)


def hf_greedy(model, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
    """transformers' own greedy generate on ``model.hf`` (a TorchCausalLM's HF model): the new tokens,
    ending with the generation config's EOS if it came first."""
    with torch.inference_mode():
        out = model.hf.generate(
            torch.tensor([list(prompt)]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt):].tolist()


@functools.cache
def _llama():
    """One llama.cpp model of SmolLM2's GGUF per session, settings as test_llama_backend's reference."""
    from llama_cpp import Llama

    from edge_llm_ros.core.engine.models import default_model_path

    return Llama(model_path=str(default_model_path()), n_ctx=LLAMA_CONTEXT, n_threads=1, n_batch=512, verbose=False)


class Longest:
    """Per prompt, the longest greedy continuation decoded so far by ``decode(prompt, n)``."""

    def __init__(self, decode, eos) -> None:
        self.decode, self.eos, self.done = decode, eos, {}
        self.lock = threading.Lock()  # one decode at a time: a test may ask from a thread of its own

    def __call__(self, prompt: Sequence[int], n: int) -> list[int]:
        key = tuple(int(t) for t in prompt)
        with self.lock:
            have = self.done.get(key)
            if have is None or (len(have) < n and (not have or have[-1] != self.eos())):
                have = self.done[key] = list(self.decode(key, n))
            return have[:n]

    def clear(self) -> None:
        self.done.clear()


def _llama_run(prompt: tuple[int, ...], n: int) -> list[int]:
    llm = _llama()
    llm.reset()  # no prefix reuse from the last request: the prompt is evaluated afresh
    eos, tokens = llm.token_eos(), []
    for token in llm.generate(list(prompt), top_k=1, temp=0.0, reset=True):
        tokens.append(int(token))
        if token == eos or len(tokens) == n:
            break
    return tokens


_llama_cached = Longest(_llama_run, lambda: _llama().token_eos())


def llama_greedy(prompt: Sequence[int], max_new_tokens: int) -> list[int]:
    """llama.cpp's own greedy continuation of ``prompt`` on SmolLM2's GGUF (cached per session)."""
    return _llama_cached(prompt, max_new_tokens)


@functools.cache
def _smollm2():
    """SmolLM2 on torch (fp32, CPU, one thread as the nodes run it), loaded once per session."""
    from edge_llm_ros.core.engine.models import load_model

    return load_model()


_hf_cached = Longest(lambda prompt, n: hf_greedy(_smollm2(), prompt, n),
                     lambda: _smollm2().hf.generation_config.eos_token_id)


def transformers_greedy(prompt: Sequence[int], max_new_tokens: int) -> list[int]:
    """transformers' own greedy continuation of ``prompt`` on SmolLM2's weights (cached per session)."""
    return _hf_cached(prompt, max_new_tokens)


@functools.cache
def tokenizer():
    from edge_llm_ros.core.engine.models import load_tokenizer

    return load_tokenizer()


def chat_ids(prompt: str) -> tuple[int, ...]:
    """The prompt ids a node decodes for the instruction ``prompt`` (the chat template applied)."""
    from edge_llm_ros.core.engine.models import chat_prompt

    return tuple(chat_prompt(tokenizer(), prompt))


def text(tokens: Sequence[int]) -> str:
    """The text of ``tokens`` as the engine reports it (special tokens, such as EOS, skipped)."""
    return tokenizer().decode(list(tokens), skip_special_tokens=True, clean_up_tokenization_spaces=False)


class Greedy:
    """One backend's reference: ``ids(prompt_ids, n)``; for an instruction (chat template applied)
    ``tokens(prompt, n)``, ``text(prompt, n)`` and ``finish_reason(prompt, n)`` ("eos" when the
    last token is EOS, else "length")."""

    def __init__(self, backend: str) -> None:
        if backend not in ("llama.cpp", "torch"):
            raise ValueError(f"no reference for backend {backend!r}")
        self.backend = backend
        self._decode = llama_greedy if backend == "llama.cpp" else transformers_greedy

    def ids(self, prompt: Sequence[int], n: int) -> list[int]:
        return self._decode(prompt, n)

    def tokens(self, prompt: str, n: int) -> list[int]:
        return self._decode(chat_ids(prompt), n)

    def text(self, prompt: str, n: int) -> str:
        return text(self.tokens(prompt, n))

    def eos(self) -> int:
        """The EOS id by the reference implementation itself."""
        return (_llama_cached if self.backend == "llama.cpp" else _hf_cached).eos()

    def finish_reason(self, prompt: str, n: int) -> str:
        tokens = self.tokens(prompt, n)
        return "eos" if tokens and tokens[-1] == self.eos() else "length"


def close() -> None:
    """Free the session's llama.cpp model (the torch model goes with the process)."""
    if _llama.cache_info().currsize:
        _llama().close()
        _llama.cache_clear()
        _llama_cached.clear()
