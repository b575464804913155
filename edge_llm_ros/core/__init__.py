"""edge_llm_ros.core: the decoding engine (Python + torch), token ids in, token ids out.

Nothing here imports ROS, rclpy, zenoh, or edge_llm_ros.runtime / edge_llm_ros.nodes;
nodes and the CLI build these objects from their parameters and call them.
"""

from .config import MODES, PRESETS, GenerationConfig, GenerationStats, mean_tau, preset
from .decoding import GenerationResult, generate, generate_all, update_alpha
from .draft_models import Draft, DraftMismatchError, build_draft, load_draft, load_drafter, save_draft
from .drafters import Drafter, ModelDrafter, PromptLookupDrafter, TreeSpec
from .edge_cloud import (
    EDGE_MODES,
    DraftError,
    DraftInbox,
    DraftRequest,
    EarlyExitDrafter,
    EarlyExitVerifier,
    OutcomeSendQueue,
    PreDraftCache,
    RequestLimitError,
    SpeculationMissed,
    VerifyOutcome,
    projected_speedup,
    robot_rounds,
    run_edge_cloud,
    stream_edge_cloud,
)
from .exits import (
    ExitAdapter,
    ExitDrafter,
    ExitSet,
    build_exits,
    default_exits_path,
    exit_confidence,
    load_exit_drafter,
    load_exits,
    save_exits,
)
from .heads import FeatureDrafter, build_heads
from .kv_cache import KVCache
from .models import (
    CausalLM,
    TorchCausalLM,
    causal_mask,
    chat_prompt,
    default_model_path,
    encode,
    load_model,
    load_tokenizer,
    tiny_llama,
)
from .sampling import Sampler, make_generator
from .tree import TokenTree, Verification
from .verifier import verify, verify_greedy, verify_sampled

__all__ = [
    "MODES",
    "PRESETS",
    "CausalLM",
    "Draft",
    "DraftMismatchError",
    "Drafter",
    "DraftError",
    "DraftInbox",
    "DraftRequest",
    "EDGE_MODES",
    "EarlyExitDrafter",
    "EarlyExitVerifier",
    "ExitAdapter",
    "ExitDrafter",
    "ExitSet",
    "FeatureDrafter",
    "GenerationConfig",
    "GenerationResult",
    "GenerationStats",
    "KVCache",
    "ModelDrafter",
    "OutcomeSendQueue",
    "PreDraftCache",
    "PromptLookupDrafter",
    "RequestLimitError",
    "Sampler",
    "TokenTree",
    "TorchCausalLM",
    "TreeSpec",
    "Verification",
    "SpeculationMissed",
    "VerifyOutcome",
    "causal_mask",
    "chat_prompt",
    "default_model_path",
    "encode",
    "build_draft",
    "build_exits",
    "build_heads",
    "default_exits_path",
    "exit_confidence",
    "generate",
    "generate_all",
    "load_draft",
    "load_drafter",
    "load_exit_drafter",
    "load_exits",
    "load_model",
    "load_tokenizer",
    "make_generator",
    "mean_tau",
    "preset",
    "projected_speedup",
    "robot_rounds", "run_edge_cloud",
    "save_draft",
    "save_exits",
    "stream_edge_cloud",
    "tiny_llama",
    "update_alpha",
    "verify",
    "verify_greedy",
    "verify_sampled",
]
