"""Tiny targets with a character tokenizer and toy prompts, shared by the drafter-training tests
(a module of its own, not conftest, so that `from toy import ...` is unambiguous)."""

from edge_llm_ros.core.engine.models import tiny_llama
from edge_llm_ros.core.training.distill import Prompt

VOCAB = 64


class CharTokenizer:
    """Characters -> ids (code point mod the vocabulary); enough of a tokenizer for raw prompts."""

    def __init__(self, vocab_size: int = VOCAB, salt: str = "") -> None:
        self.vocab_size, self.salt = vocab_size, salt
        self.eos_token_id = vocab_size - 1

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % (self.vocab_size - 1) for c in text]}

    def get_vocab(self):
        return {f"{self.salt}<{i}>": i for i in range(self.vocab_size)}

    def decode(self, ids, **_):
        return "".join(chr(65 + i % 26) for i in ids)


def tiny_target(vocab_size: int = VOCAB, salt: str = "", num_layers: int = 4, hidden_size: int = 32):
    target = tiny_llama(vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers, max_context=128,
                        seed=0)
    target.tokenizer = CharTokenizer(vocab_size, salt)
    return target


PROMPTS = [Prompt(text, "toy", chat=False) for text in
           ("move to the door", "stop", "turn left now", "pick up the cup", "where is the dock?", "sit",
            "follow me", "go back home", "look around slowly", "open the drawer", "count the boxes", "charge",
            "walk two meters", "say hello", "find the ball", "wait here")]
