"""``edge-llm-ros generate "prompt"``: stream one generation to stdout.

    edge-llm-ros generate "Go to the kitchen" --mode tree --max-new-tokens 64
    edge-llm-ros generate "def fib(n):" --raw --mode sd --draft shallow:10 --stats
    edge-llm-ros generate "Tell a story" --temperature 0.8 --top-p 0.9 --seed 1

The chat template applies unless ``--raw``. Text is printed as tokens are accepted,
decoded incrementally so a multi-byte character split over tokens is printed whole.
``--stats`` prints τ, tokens/s and the draft/verify time split on stderr.
Exit codes: 0 success, 2 bad input (one ``error: ...`` line on stderr), 130 interrupted.

Function API: :func:`stream_text` (an already loaded target; what tests and nodes call)
and :func:`main` (argv in, exit status out).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TextIO

from edge_llm_ros.core import MODES, GenerationConfig, GenerationStats, chat_prompt, encode, generate, preset

from .loading import (
    Draft,
    ToolError,
    add_shape_arguments,
    build_drafter,
    check_draft_spec,
    load_target,
    set_threads,
    shape_overrides,
)

EXIT_OK, EXIT_USAGE, EXIT_INTERRUPTED = 0, 2, 130
REPLACEMENT = "\ufffd"
DEFAULT_MODE = GenerationConfig.mode  # core's default (every mode is lossless; pick one with --mode)


class IncrementalDecoder:
    """Token ids in, text out as soon as it is final.

    Decodes a short window ``tokens[prefix:]`` and emits what lies beyond the text of
    ``tokens[prefix:read]`` (the offsets scheme of vLLM's detokenizer): the window keeps
    the context a decoder needs for spacing, and text ending in U+FFFD (an incomplete
    UTF-8 sequence) is held back until the next token completes it. ``finish()`` flushes
    whatever is held. The pieces concatenate to ``tokenizer.decode(all tokens)``.
    """

    def __init__(self, tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.tokens: list[int] = []
        self.prefix = 0  # window start
        self.read = 0  # tokens up to here have been emitted

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids, skip_special_tokens=self.skip_special_tokens, clean_up_tokenization_spaces=False
        )

    def push(self, token: int) -> str:
        """Add one token; return the newly final text ('' while a character is incomplete)."""
        self.tokens.append(int(token))
        return self._advance(final=False)

    def finish(self) -> str:
        """Whatever is still held back (an incomplete character decodes as U+FFFD)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        done = self._decode(self.tokens[self.prefix : self.read])
        text = self._decode(self.tokens[self.prefix :])
        if len(text) <= len(done) or (text.endswith(REPLACEMENT) and not final):
            return ""
        self.prefix, self.read = self.read, len(self.tokens)
        return text[len(done) :]


def prompt_ids(target, prompt: str, raw: bool) -> list[int]:
    """The prompt as token ids: chat template applied unless ``raw``."""
    if not prompt.strip():
        raise ToolError("prompt is empty")
    if target.tokenizer is None:
        raise ToolError("the model has no tokenizer: cannot encode a text prompt")
    return encode(target.tokenizer, prompt) if raw else chat_prompt(target.tokenizer, prompt)


def stream_text(
    target,
    prompt: str,
    config: GenerationConfig,
    drafter=None,
    *,
    raw: bool = False,
    out: TextIO | None = None,
    stats: GenerationStats | None = None,
) -> tuple[str, list[int], GenerationStats]:
    """Generate from a text prompt, writing text to ``out`` (default stdout) as tokens arrive.

    Returns (text, token ids, stats). Raises ToolError for a bad request (empty prompt,
    prompt longer than the context window, incompatible drafter) before anything is written.
    """
    out = sys.stdout if out is None else out
    stats = GenerationStats() if stats is None else stats
    ids = prompt_ids(target, prompt, raw)
    try:
        tokens_iter = generate(target, ids, config, drafter if config.mode != "ar" else None, stats)
    except ValueError as exc:
        raise ToolError(str(exc)) from exc
    decoder = IncrementalDecoder(target.tokenizer)
    pieces, tokens = [], []
    for token in tokens_iter:
        tokens.append(token)
        piece = decoder.push(token)
        if piece:
            pieces.append(piece)
            out.write(piece)
            out.flush()
    tail = decoder.finish()
    if tail:
        pieces.append(tail)
        out.write(tail)
    text = "".join(pieces)
    if not text.endswith("\n"):
        out.write("\n")
    out.flush()
    return text, tokens, stats


def format_stats(stats: GenerationStats, draft: Draft | None, wall_s: float) -> str:
    """One line for ``--stats``: τ, tokens/s, TTFT and where the time went."""
    busy = stats.draft_time_s + stats.verify_time_s
    share = (lambda t: f"{100 * t / busy:.0f}%") if busy > 0 else (lambda t: "-")
    tok_s = stats.new_tokens / wall_s if wall_s > 0 else 0.0
    parts = [
        f"mode={stats.mode}",
        f"draft={draft.spec if draft is not None and stats.mode != 'ar' else '-'}",
        f"new_tokens={stats.new_tokens}",
        f"rounds={stats.rounds}",
        f"tau={stats.tau:.2f}",
        f"acceptance={stats.acceptance_rate:.2f}",
        f"tokens/s={tok_s:.1f}",
        f"ttft={stats.ttft_s * 1000:.0f}ms",
        f"draft_time={stats.draft_time_s:.2f}s({share(stats.draft_time_s)})",
        f"verify_time={stats.verify_time_s:.2f}s({share(stats.verify_time_s)})",
        f"finish={stats.finish_reason or '-'}",
    ]
    return "stats: " + " ".join(parts)


# -- command line -------------------------------------------------------------------------------


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class Parser(argparse.ArgumentParser):
    """argparse that reports bad usage as one ``error:`` line (ToolError) instead of usage + exit."""

    def error(self, message: str):
        raise ToolError(message)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="edge-llm-ros generate", description="Generate text from a prompt, streamed to stdout.")
    p.add_argument("prompt", help="the prompt text (a user message, unless --raw)")
    p.add_argument("--mode", default=DEFAULT_MODE, help=f"decoding mode: {', '.join(MODES)} (default: {DEFAULT_MODE})")
    p.add_argument("--max-new-tokens", type=int, default=128, help="at most this many new tokens (default: 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    p.add_argument("--top-k", type=int, default=0, help="sample from the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    p.add_argument("--seed", type=int, default=None, help="seed for sampling (default: random)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")
    p.add_argument("--raw", action="store_true", help="feed the prompt as is, without the chat template")
    p.add_argument("--model", default=None, metavar="PATH", help="HF model directory or .gguf (default: SmolLM2-135M-Instruct)")
    p.add_argument("--draft", default=None, metavar="SPEC", help="shallow[:K[:V]], exit:K[:PATH], lookup, or a draft model path")
    add_shape_arguments(p)
    p.add_argument("--stats", action="store_true", help="print tau, tokens/s and the draft/verify split on stderr")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: every core)")
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # tiny random model, for tests
    return p


def config_from_args(args: argparse.Namespace) -> GenerationConfig:
    try:
        return preset(
            args.mode,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            stop_strings=tuple(args.stop),
            **shape_overrides(args),
        )
    except ValueError as exc:
        raise ToolError(str(exc)) from exc


def main(argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    try:
        args = build_parser().parse_args(argv)
        config = config_from_args(args)  # bad mode / numbers fail here, before any model loads
        if not args.prompt.strip():
            raise ToolError("prompt is empty")
        check_draft_spec(args.draft)
        set_threads(args.threads)
        target = load_target(args.model, tiny=args.tiny)
        draft = build_drafter(args.draft, target) if config.mode != "ar" else None
        stats = GenerationStats()
        start = time.perf_counter()
        stream_text(target, args.prompt, config, draft.drafter if draft else None, raw=args.raw, out=out, stats=stats)
        if args.stats:
            print(format_stats(stats, draft, time.perf_counter() - start), file=err, flush=True)
        return EXIT_OK
    except ToolError as exc:
        print(f"error: {one_line(exc)}", file=err, flush=True)
        return EXIT_USAGE
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except KeyboardInterrupt:
        out.write("\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `| head`: the reader left; nothing more to say
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
