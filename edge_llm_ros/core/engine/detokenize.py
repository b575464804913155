"""Token ids in, text out as tokens arrive: what a stream of accepted tokens reads as.

Knows nothing about ROS; the CLI prints the pieces, the nodes publish them as feedback.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"  # what a tokenizer decodes an incomplete UTF-8 sequence to


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
