"""The reference the engine is checked against: transformers' own greedy generate (test/references.py)."""

from references import hf_greedy

__all__ = ["hf_greedy"]
