"""The reference the engine is checked against: transformers' own greedy generate."""

import torch


def hf_greedy(model, prompt, max_new_tokens):
    """Reference: transformers' own greedy generate on the same weights."""
    with torch.inference_mode():
        out = model.hf.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()
