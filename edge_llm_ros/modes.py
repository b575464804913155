"""The decoding modes and who serves them: one registry for the engine, the front door's backends
and the navigator's deployments.

Each mode names its source, whether it is lossless (greedy output token for token the target's,
sampled output distributed as the target's) and where it runs:

    local       the engine on this device (serve_node; the navigator's `robot` deployment)
    edge_cloud  the robot drafts, a verifier_node verifies (draft_node; the navigator over a verifier)
    pipeline    D0 in front of stage_nodes (draft_node with backend pipeline; the navigator over stages)
    remote      an OpenAI-compatible server generates (plain serving only)

`outline` is the one mode that is not lossless by design (Jupiter §V-B: the answer's points are
expanded independently); it says so wherever it is offered. Knows nothing about ROS.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_llm_ros.errors import Invalid

BACKENDS = ("local", "edge_cloud", "pipeline", "remote")


@dataclass(frozen=True)
class Mode:
    name: str
    source: str
    idea: str
    backends: tuple[str, ...]
    lossless: bool = True
    navigator: bool = True  # a navigator deployment on these backends runs it (constrained decoding)


MODES = {m.name: m for m in (
    Mode("ar", "baseline", "target only, token by token", BACKENDS),
    Mode("sd", "Leviathan/Chen", "a chain of gamma drafted tokens, one verification pass", ("local", "edge_cloud")),
    Mode("tree", "LLMCad, EAGLE-2, Ghidorah", "a draft tree by cumulative confidence", ("local", "edge_cloud")),
    Mode("llmcad", "LLMCad", "tree + self-adaptive fallback + drafting during verification", ("local",),
         navigator=False),
    Mode("fsd", "EE", "edge-cloud sd, pre-drafting from the verifier's early exits", ("edge_cloud",)),
    Mode("ee", "EE", "fsd, finished pre-drafts sent before the final outcome", ("edge_cloud",)),
    Mode("chunk_pp", "FlowSpec (its baseline)", "a draft tree through the stages in chunks", ("pipeline",)),
    Mode("flowspec", "FlowSpec", "continuous pipelined speculative decoding", ("pipeline",)),
    Mode("outline", "Jupiter", "an outline, then its points expanded concurrently", ("pipeline",),
         lossless=False, navigator=False),
)}


def served_by(backend: str, navigator: bool = False) -> tuple[str, ...]:
    """The modes ``backend`` serves (``navigator``: those a navigator deployment on it runs)."""
    return tuple(m.name for m in MODES.values() if backend in m.backends and (m.navigator or not navigator))


def check_mode(backend: str, mode: str, what: str = "mode", navigator: bool = False) -> str:
    """``mode`` if ``backend`` serves it; else Invalid naming ``what`` (a parameter or a goal field),
    the modes ``backend`` serves, and where ``mode`` runs."""
    modes = served_by(backend, navigator)
    if mode in modes:
        return mode
    served = f"the {backend} backend serves {' | '.join(modes)}"
    if mode not in MODES:
        raise Invalid(f"{what}: unknown mode {mode!r}; {served}")
    others = [b for b in BACKENDS if mode in served_by(b, navigator)]
    raise Invalid(f"{what}: {mode} runs on {' | '.join(others) or 'no backend here'}, not {backend}; {served}")


def describe(name: str) -> str:
    """A mode as a line for help texts: its idea and source, and NOT lossless where that holds."""
    mode = MODES[name]
    return f"{name}: {mode.idea} ({mode.source}){'' if mode.lossless else '; NOT lossless'}"
