"""``edge-llm-ros train draft|heads|exits|nav|nav-exits``: self-distil a drafter for the target;
``nav`` trains the navigator's vision adapter on the simulator, ``nav-exits`` the verifier's early
exits for its task (tools/train_nav.py).

    edge-llm-ros train draft                                  # SmolLM2 -> ./drafts/smollm2-135m-instruct
    edge-llm-ros train draft --layers 4 --init spread --epochs 2 --out drafts/k4
    edge-llm-ros train draft --resume                         # continue an interrupted run
    edge-llm-ros train draft --prompts 40 --max-new-tokens 32 --epochs 1   # a quick smoke run
    edge-llm-ros train exits --layers 4,8,16,24 --sampled 1                 # early exits on the target
    edge-llm-ros train heads --sampled 1 --epochs 6                         # an EAGLE-style feature head

``draft``: the target answers the built-in prompt set + HumanEval (greedy, batched, cached
in the work directory so a re-run only generates what is missing), then a shallow draft
(K layers initialised from target layers, the target's embeddings/head shared) is trained
by knowledge distillation on those responses, checkpointing as it goes (``--resume``
continues from the last checkpoint). It is written to ``--out`` as ``config.json`` +
``model.safetensors``; the held-out top-1 agreement and, with ``--speed-prompts N``, τ and
tokens/s of mode ``sd`` against ``ar`` on N held-out prompts are printed and recorded in
the draft's config.

``exits``: the same data (and the same cache), then early-exit adapters after the decoder
layers listed in ``--layers`` (0-based: the exit at layer l reads the output of the first
l + 1 layers). The frozen target runs once over the data to record the hidden states at
those layers (cached in the work directory); then only the adapters train, by knowledge
distillation from the target's recorded top-k, checkpointing as they go. The held-out
top-1 agreement of every exit before (the logit lens) and after training is printed and
recorded in ``--out``'s config.json; with ``--speed-prompts N``, τ and tokens/s of mode
``sd`` with the self-drafter at the lowest exit (``--draft exit:K``, K = layer + 1) against
``ar``.

``heads``: the same data, the target's last-layer features of it (computed once, cached),
then an EAGLE-style head (see core/training/heads.py and tools/train_heads.py), written like a draft
with ``"kind": "heads"``; use it with ``--draft PATH``.

Exit codes: 0 success, 2 bad input (one ``error: ...`` line on stderr), 130 interrupted.
Function API: :func:`train_draft_command`, :func:`train_exits_command`,
:func:`~.train_heads.train_heads_command` (parsed options in,
summary dict out), :func:`main`.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict

from edge_llm_ros.tools.train_heads import add_heads_parser, check_heads_args, train_heads_command
from edge_llm_ros.tools.train_nav import (
    add_nav_exits_parser,
    add_nav_parser,
    check_nav_args,
    check_nav_exits_args,
    train_nav_command,
    train_nav_exits_command,
)
from edge_llm_ros.tools.train_run import (
    add_shared_options,
    check_shared_args,
    heldout_speed,
    log,
    start_run,
    summary,
    training_data,
    vocab_subset,
)

EXIT_OK, EXIT_USAGE, EXIT_INTERRUPTED = 0, 2, 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edge-llm-ros train",
        description="Train drafters for the target by self-distillation.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    sub = parser.add_subparsers(dest="what", required=True, metavar="draft|heads|exits|nav|nav-exits")
    d = sub.add_parser("draft", help="a shallow draft model initialised from target layers",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d.add_argument("--layers", type=int, default=2, help="decoder layers K of the draft")
    d.add_argument("--init", choices=("first", "spread"), default="first",
                   help="initialise from the target's first K layers, or K layers spread first..last")
    d.add_argument("--batch-tokens", type=int, default=4096, help="padded tokens per optimizer step")
    d.add_argument("--teacher", choices=("recorded", "online"), default="recorded",
                   help="target top-k recorded while generating the data, or recomputed per batch")
    add_shared_options(d, lr=5e-4, checkpoint_every=50, out="./drafts/NAME")
    add_exits_parser(sub)
    add_heads_parser(sub)
    add_nav_parser(sub)
    add_nav_exits_parser(sub)
    return parser


def check_draft_args(args) -> None:
    check_shared_args(args, {"--layers": args.layers, "--batch-tokens": args.batch_tokens})


# -- the steps every command shares ------------------------------------------------------------------


# -- draft ------------------------------------------------------------------------------------------


def train_draft_command(args) -> dict:
    """Generate (or resume) the data, distil, save; returns the summary recorded in config.json."""
    from edge_llm_ros.core.drafts.draft_models import build_draft, save_draft
    from edge_llm_ros.core.training.distill import TrainConfig, evaluate_agreement, train_draft

    run = start_run(args, "drafts")
    target = run.target
    if args.layers > target.config.num_hidden_layers:
        raise ValueError(f"--layers {args.layers} exceeds the target's {target.config.num_hidden_layers} layers")
    data = training_data(run)
    vocab_ids = vocab_subset(run, data, "draft")
    draft = build_draft(target, args.layers, args.init, vocab_ids=vocab_ids, name=run.name)
    config = TrainConfig(epochs=args.epochs, lr=args.lr, batch_tokens=args.batch_tokens, seed=args.seed,
                         teacher=args.teacher, checkpoint_every=args.checkpoint_every)
    before = evaluate_agreement(draft.model, data.heldout, vocab_ids, target, config)
    log(f"draft: K={args.layers} from target layers {draft.init_layers}; held-out agreement before training "
        f"{before['agreement']:.3f}")

    t0 = time.perf_counter()
    tag = f"k{args.layers}-{args.init}-v{args.vocab_subset}-s{args.seed}"
    result = train_draft(draft.model, data.train, config, vocab_ids, target, heldout=data.heldout,
                         checkpoint=run.work / f"checkpoint-{tag}.pt", resume=args.resume, progress=run.progress,
                         log=log)
    train_s = time.perf_counter() - t0
    after = result.evals[-1]

    speed = heldout_speed(run, data, draft.drafter)
    trained = {"init": args.init, "settings": asdict(config), "steps": result.steps, "heldout_before": before,
               "heldout_after": after}
    draft.training = summary(run, data, trained, speed, train_s=train_s)
    save_draft(draft, run.out, target)
    log(f"held-out agreement {before['agreement']:.3f} -> {after['agreement']:.3f}; wrote {run.out}")
    return draft.training


# -- exits ------------------------------------------------------------------------------------------


def add_exits_parser(sub) -> None:
    e = sub.add_parser("exits", help="early-exit adapters on the target (self-drafting, early verification)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    e.add_argument("--layers", default="4,8,16,24",
                   help="comma-separated 0-based decoder layers whose output feeds an exit")
    e.add_argument("--bottleneck", type=int, default=512, help="adapter bottleneck width")
    e.add_argument("--batch-positions", type=int, default=512, help="response positions per optimizer step")
    e.add_argument("--feature-batch-tokens", type=int, default=4096,
                   help="padded tokens per batch of the target pass that records the exits' inputs")
    add_shared_options(e, lr=1e-2, checkpoint_every=100, out="./exits/NAME")


def parse_layers(text: str) -> list[int]:
    try:
        layers = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise ValueError(f"--layers must be comma-separated integers, got {text!r}") from None
    if not layers or layers[0] < 0:
        raise ValueError(f"--layers must list decoder layers >= 0, got {text!r}")
    return layers


def check_exits_args(args) -> None:
    args.exit_layers = parse_layers(args.layers)
    check_shared_args(args, {"--bottleneck": args.bottleneck, "--batch-positions": args.batch_positions,
                             "--feature-batch-tokens": args.feature_batch_tokens})


def _exit_table(stats: dict) -> dict:
    """{layer: stats} -> JSON-friendly {"<layer>": stats}."""
    return {str(layer): {k: round(v, 4) if isinstance(v, float) else v for k, v in s.items()}
            for layer, s in stats.items()}


def train_exits_command(args) -> dict:
    """Generate (or reuse) the data, record the exits' inputs once, distil the adapters, save;
    returns the summary recorded in config.json."""
    from edge_llm_ros.core.drafts.exits import build_exits, save_exits
    from edge_llm_ros.core.training.exits import ExitTrainConfig, evaluate_exits, exit_features, train_exits

    layers = getattr(args, "exit_layers", None) or parse_layers(args.layers)
    run = start_run(args, "exits")
    target, work = run.target, run.work
    total = target.config.num_hidden_layers
    if layers[-1] >= total - 1:
        raise ValueError(f"--layers: exits go after layers 0..{total - 2} of this {total}-layer target, "
                         f"got {layers[-1]}")
    data = training_data(run)
    vocab_ids = vocab_subset(run, data, "exit")

    t0 = time.perf_counter()
    tag = "l" + "-".join(map(str, layers))
    log(f"recording the target's hidden states after layers {layers} (cached in {work})")
    features = exit_features(target, data.train, layers, args.feature_batch_tokens,
                             work / f"exit-features-{tag}-train.pt", run.progress, log)
    held = exit_features(target, data.heldout, layers, args.feature_batch_tokens,
                         work / f"exit-features-{tag}-heldout.pt", run.progress, log)
    features_s = time.perf_counter() - t0
    log(f"features: {len(features)} train / {len(held)} held-out positions ({features_s:.0f} s)")

    exits = build_exits(target, layers, args.bottleneck, vocab_ids, run.name, seed=args.seed)
    config = ExitTrainConfig(epochs=args.epochs, lr=args.lr, batch_positions=args.batch_positions, seed=args.seed,
                             checkpoint_every=args.checkpoint_every)
    before = evaluate_exits(target, exits, held)
    ckpt = work / f"checkpoint-exits-{tag}-b{args.bottleneck}-v{args.vocab_subset}-s{args.seed}.pt"
    result = train_exits(target, exits, features, config, held, ckpt, args.resume, run.progress, log)
    after = result.evals[-1]["exits"]
    for layer in layers:
        b, a = before[layer], after[layer]
        log(f"exit at layer {layer}: held-out agreement {b['agreement']:.3f} -> {a['agreement']:.3f} "
            f"(full vocabulary {b['agreement_full']:.3f} -> {a['agreement_full']:.3f}), "
            f"KL {b['loss']:.2f} -> {a['loss']:.2f}")

    k = layers[0] + 1
    speed = heldout_speed(run, data, lambda: exits.drafter(target, k), draft=f"exit:{k}")
    trained = {"settings": asdict(config), "steps": result.steps, "train_positions": len(features),
               "heldout_before": _exit_table(before), "heldout_after": _exit_table(after)}
    exits.training = summary(run, data, trained, speed, features_s=features_s, train_s=result.train_s)
    save_exits(exits, run.out, target)
    log(f"wrote {run.out} ({exits.training['wall_s']:.0f} s)")
    return exits.training


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    try:
        if args.what == "exits":
            check_exits_args(args)
            train_exits_command(args)
        elif args.what == "heads":
            check_heads_args(args)
            train_heads_command(args)
        elif args.what == "nav":
            check_nav_args(args)
            train_nav_command(args)
        elif args.what == "nav-exits":
            check_nav_exits_args(args)
            train_nav_exits_command(args)
        else:
            check_draft_args(args)
            train_draft_command(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted; continue with --resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
