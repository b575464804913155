"""The fixed prompt set of ``edge-llm-ros bench``: robot instructions, chat and code.

Fixed so that numbers from different runs and machines compare; each prompt asks
for an answer longer than the default 128 new tokens, so runs rarely end at EOS.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BenchPrompt:
    name: str
    kind: str  # robot | chat | code
    text: str


BENCH_PROMPTS = (
    BenchPrompt(
        "robot_kitchen",
        "robot",
        "You control a four-legged robot in a house. Go to the kitchen, find the red cup on the table "
        "and bring it to the living room. List the steps you will take, one per line.",
    ),
    BenchPrompt(
        "robot_patrol",
        "robot",
        "Plan a patrol of a warehouse for a mobile robot: check the loading dock, aisles 1 to 4 and the "
        "office, then return to the charging station. Explain what the robot checks at each stop.",
    ),
    BenchPrompt(
        "chat_sleep",
        "chat",
        "Give me practical advice for sleeping better. Explain why each tip works.",
    ),
    BenchPrompt(
        "chat_photosynthesis",
        "chat",
        "Explain how photosynthesis works to a twelve-year-old, step by step.",
    ),
    BenchPrompt(
        "code_fibonacci",
        "code",
        "Write a Python function that returns the first n Fibonacci numbers as a list, with a docstring "
        "and a few tests.",
    ),
    BenchPrompt(
        "code_palindrome",
        "code",
        "Write a Python function is_palindrome(s) that ignores case and punctuation, and explain how it works.",
    ),
)

QUICK_PROMPTS = (
    BenchPrompt("robot_short", "robot", "Walk to the door and stop. What do you do first?"),
    BenchPrompt("code_short", "code", "Write a Python function that adds two numbers."),
)
