"""``edge-llm-ros train heads``: an EAGLE-style feature head for the target (see core/drafts/heads.py).

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

DEFAULT_SUFFIX = "-heads"


def add_heads_parser(sub) -> None:
    import argparse

    from edge_llm_ros.tools.train_run import add_shared_options

    h = sub.add_parser("heads", help="an EAGLE-style head drafting from the target's features",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    h.add_argument("--init-layer", type=int, default=None,
                   help="target layer the head's decoder layer starts from (default: the last)")
    h.add_argument("--unroll", type=int, choices=(1, 2), default=2,
                   help="draft steps trained per row: 2 also trains drafting on from the head's own guess")
    h.add_argument("--batch-tokens", type=int, default=2048, help="padded tokens per optimizer step")
    add_shared_options(h, lr=1e-3, checkpoint_every=50, out=f"./drafts/NAME{DEFAULT_SUFFIX}")


def check_heads_args(args) -> None:
    """Bad values fail before anything heavy is loaded."""
    from edge_llm_ros.tools.train_run import check_shared_args

    check_shared_args(args, {"--batch-tokens": args.batch_tokens})
    if args.init_layer is not None and args.init_layer < 0:
        raise ValueError(f"--init-layer must be >= 0, got {args.init_layer}")


def train_heads_command(args) -> dict:
    """Data (cached), features (cached), train, save; returns the summary recorded in config.json."""
    from dataclasses import asdict

    from edge_llm_ros.core.drafts.draft_models import build_heads, save_draft
    from edge_llm_ros.core.training.distill import TrainConfig
    from edge_llm_ros.core.training.heads import cached_features, evaluate_heads, train_heads
    from edge_llm_ros.tools.train_run import heldout_speed, log, start_run, summary, training_data, vocab_subset

    run = start_run(args, "drafts", DEFAULT_SUFFIX)
    target = run.target
    layers = target.config.num_hidden_layers
    if args.init_layer is not None and args.init_layer >= layers:
        raise ValueError(f"--init-layer {args.init_layer} is outside the target's {layers} layers")
    data = training_data(run)
    train, heldout = data.train, data.heldout

    t0 = time.perf_counter()
    features = cached_features(target, train + heldout, run.work / "features.pt", progress=run.progress, log=log)
    train_feats, heldout_feats = features[: len(train)], features[len(train):]
    feat_s = time.perf_counter() - t0

    vocab_ids = vocab_subset(run, data, "head")
    head = build_heads(target, vocab_ids, args.init_layer, name=run.name + DEFAULT_SUFFIX)
    config = TrainConfig(epochs=args.epochs, lr=args.lr, batch_tokens=args.batch_tokens, seed=args.seed,
                         checkpoint_every=args.checkpoint_every)
    before = evaluate_heads(head, heldout, heldout_feats, config)
    log(f"head from target layer {head.init_layers[0]}; held-out agreement before training {before['agreement']:.3f}")

    t0 = time.perf_counter()
    tag = f"heads-l{head.init_layers[0]}-v{args.vocab_subset}-s{args.seed}"
    result = train_heads(head, train, train_feats, config, heldout, heldout_feats,
                         checkpoint=run.work / f"checkpoint-{tag}.pt", resume=args.resume, progress=run.progress,
                         log=log, unroll=args.unroll)
    train_s = time.perf_counter() - t0
    after = result.evals[-1]

    speed = heldout_speed(run, data, head.drafter)
    trained = {"config": asdict(config), "unroll": args.unroll, "steps": result.steps,
               "final_loss": result.losses[-1] if result.losses else None,
               "heldout_before": before, "heldout_after": after}
    head.training = summary(run, data, trained, speed, features_s=feat_s, train_s=train_s)
    save_draft(head, run.out, target)
    log(f"held-out agreement {before['agreement']:.3f} -> {after['agreement']:.3f}; wrote {run.out}")
    return head.training
