"""The decoding engine: ar, sd, tree and llmcad behind one streaming ``generate``.

Contract: token ids in, token ids out. :func:`generate` validates the request
eagerly, then returns an iterator that yields each token as soon as the target
has accepted it; :func:`generate_all` collects them. Every mode is one loop of
the same steps (a chain or an empty tree is just a small tree):

    prefill -> [draft_step -> (predraft) -> verify_step -> update_alpha -> emit]*

Greedy output is the target's greedy output token for token; sampled output
follows the target's warped distribution exactly (see ``verifier.py``).
Knows nothing about ROS.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from .config import GenerationConfig, GenerationStats
from .constraint import TokenGrammar, constrain
from .drafters import Drafter, PromptLookupDrafter, TreeSpec
from .kv_cache import KVCache
from .models import CausalLM, TorchCausalLM
from .sampling import Sampler, make_generator
from .tree import TokenTree, Verification
from .verifier import verify

Observer = Callable[[int, torch.Tensor], None]  # (first context index, target features [T, E])


@dataclass
class GenerationResult:
    tokens: list[int]
    text: str | None
    stats: GenerationStats


# -- request checks -----------------------------------------------------------------------------


def context_window(target: CausalLM, drafter: Drafter | None) -> int:
    """The target's window, or the drafter's when that is smaller."""
    window = target.max_context
    return min(window, (drafter.max_context if drafter is not None else None) or window)


def check_drafter(target: CausalLM, drafter: Drafter) -> None:
    """The draft must speak the target's vocabulary, or its proposals mean other tokens."""
    vocab = drafter.vocab_size
    if vocab is not None and vocab != target.vocab_size:
        raise ValueError(f"draft vocabulary size {vocab} differs from the target's {target.vocab_size}")
    ours, theirs = target.tokenizer, drafter.tokenizer
    if ours is not None and theirs is not None and ours is not theirs and ours.get_vocab() != theirs.get_vocab():
        raise ValueError("draft tokenizer differs from the target's (different vocabularies)")
    if drafter.needs_features and not target.provides_features:
        raise ValueError(f"{type(drafter).__name__} drafts from the target's hidden states, which this target "
                         f"({type(target).__name__}) does not expose; use a torch target")


class TokenModel(Protocol):
    """What a prompt is checked against: a vocabulary and a tokenizer (None: token ids only), as
    every CausalLM and the llama.cpp batch (core/engine/batching.LlamaBatch) declare them."""

    vocab_size: int
    tokenizer: Any


def check_prompt(model: TokenModel, prompt_ids: Sequence[int], config: GenerationConfig, window: int) -> list[int]:
    """The prompt as a list of ids, or ValueError: empty, ids outside ``model``'s vocabulary, no room
    left in ``window`` tokens, or stop strings without a tokenizer to find them with."""
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ValueError("prompt is empty: give at least one token")
    if min(prompt) < 0 or max(prompt) >= model.vocab_size:
        raise ValueError(f"prompt token ids must be in [0, {model.vocab_size})")
    if len(prompt) >= window:
        raise ValueError(
            f"prompt has {len(prompt)} tokens but the context window is {window}: no room to generate"
        )
    if config.stop_strings and model.tokenizer is None:
        raise ValueError("stop_strings need a tokenizer on the target model")
    return prompt


def check_request(
    target: CausalLM, prompt_ids: Sequence[int], config: GenerationConfig, drafter: Drafter | None
) -> list[int]:
    """:func:`check_prompt` within the target's (and the drafter's) window, then :func:`check_drafter`."""
    prompt = check_prompt(target, prompt_ids, config, context_window(target, drafter))
    if drafter is not None:
        check_drafter(target, drafter)
    return prompt


def eos_ids(model: Any, config: GenerationConfig | None = None) -> tuple[int, ...]:
    """The token ids that end a generation: ``config.eos_token_ids`` when set, else the EOS of
    ``model``'s tokenizer, else (a torch model) of its Hugging Face config (one id or a list); ()
    when none names one. ``model``: anything with a ``tokenizer`` (None: token ids only), as a
    CausalLM, a Drafter and a LlamaBatch declare it."""
    if config is not None and config.eos_token_ids is not None:
        return tuple(config.eos_token_ids)
    tokenizer = model.tokenizer
    eos = tokenizer.eos_token_id if tokenizer is not None else None
    if eos is None and isinstance(model, TorchCausalLM):
        eos = getattr(model.config, "eos_token_id", None)  # a transformers config: not every one names it
    if eos is None:
        return ()
    return tuple(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]))


class StopStrings:
    """Detects a stop string in the generated text (decoding a short tail window)."""

    def __init__(self, tokenizer, stop_strings: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.stops = tuple(stop_strings)
        # A token decodes to at least one character here, so this many tokens cover any stop string.
        self.window = max((len(s) for s in self.stops), default=0) + 8

    def hit(self, generated: list[int]) -> bool:
        if not self.stops:
            return False
        tail = self.tokenizer.decode(generated[-self.window :])
        return any(s in tail for s in self.stops)


# -- the steps ----------------------------------------------------------------------------------


def prefill(target: CausalLM, cache: KVCache, prompt: list[int], observe: Observer | None = None) -> None:
    """Cache every prompt token but the last; the last is the first round's root.

    ``observe`` (a drafter's, see :func:`observer`) receives the target's features of those tokens.
    """
    if len(prompt) > 1:
        ids, positions = torch.tensor(prompt[:-1]), torch.arange(len(prompt) - 1)
        if observe is None:
            target.forward(ids, positions, None, cache, logits_rows=None)
        else:
            _, hidden = target.forward_features(ids, positions, None, cache, logits_rows=None)
            observe(0, hidden)


def draft_step(
    drafter: Drafter | None, context: list[int], spec: TreeSpec | None, sampler: Sampler
) -> TokenTree:
    """Ask the drafter for a tree under ``context[-1]`` (an empty tree for ``ar`` or no room)."""
    if drafter is None or spec is None or spec.depth == 0:
        return TokenTree.from_root(context[-1])
    return drafter.propose(context, spec, sampler)


def verify_step(
    target: CausalLM, cache: KVCache, tree: TokenTree, sampler: Sampler, observe: Observer | None = None,
    allowed: Callable[[list[int]], torch.Tensor] | None = None,
) -> Verification:
    """Non-autoregressive tree verification (LLMCad §3.2) in one target pass, then prune the cache.

    Rows are the root and the N drafted nodes at positions prefix_len + depth;
    the tree mask lets each row see the cached prefix and its ancestors only.
    Afterwards the cache keeps the prefix, the root and the accepted path, compacted,
    and ``observe`` receives the target's features of the root and the accepted path.
    ``allowed`` (constrained decoding): each row's logits keep only the tokens allowed after its
    path, so the verifier checks the draft against the constrained target.
    """
    prefix_len = cache.length
    mask = tree.attention_mask(prefix_len) if len(tree) else None
    ids, positions = torch.tensor(tree.tokens), tree.position_ids(prefix_len)
    hidden: torch.Tensor | None = None
    if observe is None:
        logits = target.forward(ids, positions, mask, cache)  # [N+1, V]
    else:
        logits, hidden = target.forward_features(ids, positions, mask, cache)
    assert logits is not None  # every row's logits asked for
    if allowed is not None:
        logits = constrain(logits, tree_allowed(tree, allowed))
    result = verify(tree, logits, sampler)
    kept = [0] + result.path
    rows = logits.reshape(-1, logits.shape[-1])[kept].float()
    result.probs = rows.softmax(-1).gather(-1, torch.tensor(result.new_tokens)[:, None])[:, 0].tolist()
    cache.keep(list(range(prefix_len)) + [prefix_len + node for node in kept])
    if observe is not None and hidden is not None:
        observe(prefix_len, hidden[kept])
    return result


def tree_allowed(tree: TokenTree, allowed: Callable[[list[int]], torch.Tensor]) -> torch.Tensor:
    """Bool [N+1, V]: the tokens ``allowed`` lets follow each row of ``tree`` (the root, then every
    node), after the tree path down to it."""
    return torch.stack([allowed([tree.tokens[n] for n in tree.path(node)]) for node in range(len(tree.tokens))])


def observer(drafter: Drafter | None) -> Observer | None:
    """The drafter's ``observe(start, features)`` if it drafts from the target's features (EAGLE
    style heads, ``needs_features``): features [T, E] of context tokens start..start+T-1, after
    prefill and after every verification. Such drafters cannot pre-draft during verification (the
    features of the guessed path do not exist yet)."""
    return drafter.observe if drafter is not None and drafter.needs_features else None


def update_alpha(alpha: float, tree: TokenTree, result: Verification) -> float:
    """LLMCad Eq. 3, the self-adaptive fallback threshold, updated after each verification.

        α_{i+1} = α_i * 0.5                                  if N_correct == N_all
        α_{i+1} = α_i / C̄ ** ((N_all - N_correct) / N_all)   if N_correct <  N_all
    N_all: length of the most matching branch (the most confident branch through the
    accepted path), N_correct: its accepted tokens, C̄: mean cumulative confidence of
    its tokens from the first wrong one on. (The paper's typeset Eq. 3 lost the α_i / C̄
    base; §3.3 text: "dividing α by the average cumulative confidence of all tokens
    subsequent to the incorrectly generated one", with an exponential form.)
    """
    end = result.path[-1] if result.path else 0
    leaf = max(tree.descendants(end), key=lambda n: (not tree.children[n], tree.logscores[n]))
    n_all, n_correct = tree.depths[leaf], len(result.path)
    if n_all == 0:
        return alpha
    if n_correct == n_all:
        return alpha * 0.5
    wrong = tree.path(leaf)[n_correct:]
    mean_conf = sum(tree.confidence(n) for n in wrong) / len(wrong)
    return min(1.0, alpha / max(mean_conf, 1e-12) ** ((n_all - n_correct) / n_all))


def predraft(
    drafter: Drafter, context: list[int], tree: TokenTree, spec: TreeSpec, sampler: Sampler
) -> tuple[list[int], TokenTree, float]:
    """LLMCad §3.4 speculative generation, run on a second thread while the target verifies.

    Assume the most confident branch will be accepted, guess the target's bonus token
    with the draft's own next token, and draft the next round's tree from there.
    Used only if the verified context turns out to be exactly that guess.
    """
    start = time.perf_counter()
    guess_ctx = context + [tree.tokens[n] for n in tree.path(tree.best_leaf())]
    guess = drafter.propose(guess_ctx, TreeSpec.chain(1), sampler)
    guess_ctx = guess_ctx + guess.tokens[1:2]
    return guess_ctx, drafter.propose(guess_ctx, spec, sampler), time.perf_counter() - start


def record_round(stats: GenerationStats, tree: TokenTree, result: Verification, draft_s: float, verify_s: float):
    stats.rounds += 1
    stats.draft_time_s += draft_s
    stats.verify_time_s += verify_s
    stats.drafted += len(tree)
    stats.accepted.append(result.accepted)
    stats.token_probs += result.probs


def finish_reason(generated: list[int], limit: int, eos: tuple[int, ...], stops: StopStrings) -> str:
    """Why generation ends after the last token ("" to go on). EOS and stop strings are emitted."""
    if generated[-1] in eos:
        return "eos"
    if stops.hit(generated):
        return "stop"
    return "length" if len(generated) >= limit else ""


# -- the orchestrator ---------------------------------------------------------------------------

_draft_worker: ThreadPoolExecutor | None = None


def draft_worker() -> ThreadPoolExecutor:
    """The one background thread that drafts during verification (started on first use, reused:
    a fresh thread per request would pay the thread-pool warm-up of torch every time)."""
    global _draft_worker
    if _draft_worker is None:
        _draft_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edge-llm-draft")
    return _draft_worker



def generate(
    target: CausalLM,
    prompt_ids: Sequence[int],
    config: GenerationConfig,
    drafter: Drafter | None = None,
    stats: GenerationStats | None = None,
    grammar: TokenGrammar | None = None,
) -> Generator[int, None, None]:
    """Validate the request, then stream the generated token ids.

    ``drafter`` defaults to prompt lookup for the speculative modes. ``stats`` (if
    given) is filled in live. ``grammar`` constrains the output (core/engine/constraint.py): target and
    draft are masked alike, so the output is the constrained target's. Raises ValueError for a
    bad request before streaming.
    """
    if config.mode != "ar" and drafter is None:
        drafter = PromptLookupDrafter()
    prompt = check_request(target, prompt_ids, config, drafter)
    if grammar is not None and grammar.vocab_size != target.vocab_size:
        raise ValueError(f"the grammar's vocabulary ({grammar.vocab_size}) is not the target's ({target.vocab_size})")
    return _stream(target, prompt, config, drafter if config.mode != "ar" else None, stats or GenerationStats(),
                   grammar)


def generate_all(
    target: CausalLM,
    prompt_ids: Sequence[int],
    config: GenerationConfig,
    drafter: Drafter | None = None,
    grammar: TokenGrammar | None = None,
) -> GenerationResult:
    """Blocking wrapper: every token, the decoded text (if the target has a tokenizer), stats."""
    stats = GenerationStats()
    tokens = list(generate(target, prompt_ids, config, drafter, stats, grammar))
    tok = target.tokenizer
    text = tok.decode(tokens, skip_special_tokens=True) if tok is not None else None
    return GenerationResult(tokens, text, stats)


def _stream(
    target: CausalLM, prompt: list[int], config: GenerationConfig, drafter: Drafter | None, stats: GenerationStats,
    grammar: TokenGrammar | None = None,
) -> Generator[int, None, None]:
    start = time.perf_counter()
    stats.mode, stats.prompt_tokens = config.mode, len(prompt)
    target_sampler = Sampler(config.temperature, config.top_k, config.top_p, make_generator(config.seed))
    draft_seed = None if config.seed is None else config.seed + 1
    draft_sampler = Sampler(config.temperature, config.top_k, config.top_p, make_generator(draft_seed))
    eos, stops = eos_ids(target, config), StopStrings(target.tokenizer, config.stop_strings)
    window = context_window(target, drafter)
    limit = min(config.max_new_tokens, window - len(prompt))
    spec_width = config.tree_width if config.mode in ("tree", "llmcad") else config.gamma
    cache = target.new_cache(len(prompt) + limit + spec_width + 2)
    observe = observer(drafter)
    # (A pre-draft guesses tokens past the generated ones, whose grammar state is not known yet.)
    overlap = (config.mode == "llmcad" and config.overlap_drafting and drafter is not None and observe is None
               and grammar is None)
    pool = draft_worker() if overlap else None
    context, alpha = list(prompt), config.alpha
    generated: list[int] = []
    ahead: tuple[list[int], TokenTree] | None = None  # the tree pre-drafted during the last verification
    future: Future | None = None
    try:
        with torch.inference_mode():
            prefill(target, cache, prompt, observe)
        while True:
            spec = config.tree_spec(alpha)
            room = min(limit - len(generated), window - len(context))
            allowed = grammar.bind(generated) if grammar is not None else None
            spec = spec.capped(room).constrained(allowed) if spec is not None else None

            t0 = time.perf_counter()
            if ahead is not None and ahead[0] == context and spec is not None and ahead[1].depth <= spec.depth:
                tree = ahead[1]
                stats.predraft_hits += 1
            else:
                tree = draft_step(drafter, context, spec, draft_sampler)
            t1 = time.perf_counter()
            future = None
            if pool is not None and drafter is not None and spec is not None and len(tree):
                future = pool.submit(predraft, drafter, context, tree, spec, draft_sampler)
            with torch.inference_mode():
                result = verify_step(target, cache, tree, target_sampler, observe, allowed)
            t2 = time.perf_counter()
            ahead = None
            if future is not None:
                guess_ctx, guess_tree, busy = future.result()
                future = None
                ahead = (guess_ctx, guess_tree)
                stats.overlapped_draft_time_s += busy
            if drafter is not None:
                drafter.update(tree, result)
            if config.mode == "llmcad":
                alpha = update_alpha(alpha, tree, result)
                stats.alphas.append(alpha)

            record_round(stats, tree, result, draft_s=t1 - t0, verify_s=t2 - t1)

            for token in result.new_tokens[: limit - len(generated)]:
                context.append(token)
                generated.append(token)
                stats.new_tokens = len(generated)
                stats.total_time_s = time.perf_counter() - start
                stats.ttft_s = stats.ttft_s or stats.total_time_s
                yield token
                stats.finish_reason = finish_reason(generated, limit, eos, stops)
                if stats.finish_reason:
                    return
    finally:
        if future is not None:  # never leave the drafter busy behind a closed stream
            future.result()
        stats.total_time_s = time.perf_counter() - start
