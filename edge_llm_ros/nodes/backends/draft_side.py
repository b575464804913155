"""What the two drafting backends share (edge_cloud and pipeline): their draft's parameters, loading
the drafters, and the prompt's token ids."""

from __future__ import annotations

import dataclasses

from edge_llm_ros.nodes.parameters import param


@dataclasses.dataclass(frozen=True)
class DraftSideParams:
    draft: str = param("", "the draft: '' = the shipped trained draft; shallow:K, exit:K[:PATH], lookup or a "
                           "folder on torch; llama.cpp:PATH or a .gguf file on llama.cpp")
    draft_backend: str = param("auto", "where the draft runs; auto = the draft spec's, else the device plan's, "
                                       "else llama.cpp when llama-cpp-python is installed, else torch",
                               choices=("auto", "torch", "llama.cpp"))
    model: str = param("", "the target's tokenizer (and on torch the weights the draft shares); '' = SmolLM2")
    timeout_s: float = param(10.0, "seconds to wait for the next answer of a peer before the request ends",
                             low=0.001)
    threads: int = param(0, "torch threads, or each llama.cpp drafter's (0 = the default)", low=0, high=1024)


def load_drafters(node, p: DraftSideParams, count: int):
    """(``count`` drafters, the target's tokenizer, the draft engine, why it was chosen); ValueError
    naming the parameter at fault."""
    import torch

    from edge_llm_ros.core.drafts.loading import LoadError, build_drafters, check_draft_spec, resolve_draft_backend
    from edge_llm_ros.core.planning.device_plan import PlanError, planned_draft_backend

    if p.threads:
        torch.set_num_threads(p.threads)
    try:
        planned = (planned_draft_backend(p.model or None, warn=node.get_logger().warning)
                   if p.draft_backend == "auto" and not p.draft else None)
        backend, spec, why = resolve_draft_backend(p.draft_backend, p.draft or None, planned)
    except (LoadError, PlanError) as exc:
        raise ValueError(f"parameter 'draft_backend': {exc}") from exc
    try:
        check_draft_spec(spec)
        drafts, tokenizer = build_drafters(backend, spec, p.model or None, count, p.threads or None)
    except LoadError as exc:
        raise ValueError(f"parameter 'draft': {exc}") from exc
    return drafts, tokenizer, backend, why


def prompt_ids(node, tokenizer, text: str) -> list[int]:
    from edge_llm_ros.core.engine.models import chat_prompt, encode

    return chat_prompt(tokenizer, text) if node.door.chat_template else encode(tokenizer, text)


def eos_of(tokenizer, config) -> tuple[int, ...]:
    """The token ids that end a request: the config's, else the tokenizer's EOS."""
    if config.eos_token_ids is not None:
        return tuple(config.eos_token_ids)
    return () if tokenizer.eos_token_id is None else (int(tokenizer.eos_token_id),)
