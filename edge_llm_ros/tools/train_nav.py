"""``edge-llm-ros train nav``: the navigation adapter (nav/vlm.py), taught by the simulator.

    edge-llm-ros train nav                                   # -> edge_llm_ros/data/nav/smollm2-nav
    edge-llm-ros train nav --worlds 40 --max-steps 50 --out /tmp/nav   # a quick run
    edge-llm-ros train nav --resume                          # continue an interrupted LM phase
    edge-llm-ros train nav --init shipped --dagger-worlds 60 --pretrain-steps 0 --lr 2e-4 \\
        --warmup-steps 20 --out /tmp/nav                     # fine-tune an adapter on its own states
    edge-llm-ros train nav --evaluate-only                   # the shipped adapter's closed loop only

Frames and the camera expert's answers come from ``--worlds`` seeded clear-path training worlds
(seeds from 10000; the evaluation worlds 100-109 and the check worlds 200-209 are never among
them), cached in the work directory. The teacher stops ``--stop-margin`` inside the 0.5 m reach.
Two phases: the encoder alone learns what frames show (``--pretrain-steps``, seconds per hundred
steps); then the projectors and LoRA updates of SmolLM2 and the shipped draft learn to write the
answers, the encoder at a tenth of the rate (``--max-steps``, checkpointed every
``--checkpoint-every`` steps; ``--resume`` continues). The LMs' own weights never change.
``--init`` starts from an adapter's weights instead of fresh ones; with ``--dagger-worlds`` that
adapter also drives in that many further training worlds, and every state its own decisions reach
is labelled by the teacher and added to the samples (DAgger, vlm_training.learner_samples).
``--decoy-worlds`` adds the teacher's frames from worlds after those where another training target
is seen before the instructed one while searching (it is not the target: search on). Then,
on held-out frames (another 8 worlds), the share of constrained greedy actions equal to the
teacher's, and on the evaluation and check worlds the closed-loop success as navigator_node runs
it (nav/evaluation.py: the episode policy in simulated time; "reached within 0.5 m, nothing
touched"); all go into the adapter's config.json and the summary lines.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def add_nav_parser(sub) -> None:
    p = sub.add_parser("nav", help="the navigator's vision adapter, trained on simulator frames",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--worlds", type=int, default=600, help="training worlds (seeds 10000..)")
    p.add_argument("--perturb", type=int, default=2, help="poses pushed off the expert's path per pose")
    p.add_argument("--pretrain-steps", type=int, default=2000, help="encoder-only steps before the LMs join")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--max-steps", type=int, default=500, help="stop the LM phase after this many steps (0: none)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup-steps", type=int, default=0, help="the rate rises linearly over these first LM steps")
    p.add_argument("--draft-weight", type=float, default=0.5, help="weight of the draft projector's loss")
    p.add_argument("--checkpoint-every", type=int, default=25)
    p.add_argument("--heldout-frames", type=int, default=120, help="held-out frames for the action accuracy")
    p.add_argument("--stop-margin", type=float, default=0.1,
                   help="the teacher stops this far inside the 0.5 m reach (m, below 0.2)")
    p.add_argument("--init", default=None, metavar="ADAPTER",
                   help="start from this adapter folder ('shipped': the shipped one) instead of fresh weights")
    p.add_argument("--dagger-worlds", type=int, default=0,
                   help="with --init: worlds the adapter drives itself in, its states labelled by the teacher")
    p.add_argument("--decoy-worlds", type=int, default=0,
                   help="further training worlds where the other training targets are seen before the "
                        "instructed one while searching (the teacher's frames)")
    p.add_argument("--eval-worlds", default="100-109", help="closed-loop evaluation worlds (a seed range)")
    p.add_argument("--check-worlds", default="200-209", help="a second held-out closed-loop range")
    p.add_argument("--decoys", action="store_true",
                   help="draw the evaluation and check worlds with the other training targets where the "
                        "search sees one of them before the red chair")
    p.add_argument("--evaluate-only", action="store_true",
                   help="train nothing: the closed loop of --init (default: the shipped adapter)")
    p.add_argument("--out", type=Path, default=None, help="adapter folder (default: the shipped one's)")
    p.add_argument("--work", type=Path, default=None,
                   help="sample cache and checkpoint (default: ~/.cache/edge_llm_ros/train/smollm2-nav)")
    p.add_argument("--resume", action="store_true", help="continue from the work directory's checkpoint")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def add_nav_exits_parser(sub) -> None:
    p = sub.add_parser("nav-exits", help="early exits for the navigation task (what verifier_node's nav task "
                                          "pre-drafts from)", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--adapter", type=Path, default=None, help="adapter folder (default: the shipped one)")
    p.add_argument("--worlds", type=int, default=120, help="training worlds (seeds 10000..)")
    p.add_argument("--perturb", type=int, default=1, help="poses pushed off the expert's path per pose")
    p.add_argument("--layers", default=",".join(map(str, (4, 8, 16, 24))), help="exit layers (0-based)")
    p.add_argument("--bottleneck", type=int, default=256)
    p.add_argument("--epochs", type=float, default=6.0)
    p.add_argument("--heldout-frames", type=int, default=200, help="held-out frames (8 other worlds)")
    p.add_argument("--out", type=Path, default=None, help="exits folder (default: ADAPTER/exits)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def check_nav_exits_args(args) -> None:
    for flag in ("worlds", "bottleneck", "epochs", "heldout_frames"):
        if getattr(args, flag) <= 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be > 0, got {getattr(args, flag)}")
    if args.perturb < 0:
        raise ValueError(f"--perturb must be >= 0, got {args.perturb}")
    try:
        args.layer_list = sorted({int(x) for x in args.layers.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"--layers: expected comma-separated layer indices, got {args.layers!r}") from None
    if not args.layer_list:
        raise ValueError("--layers: give at least one layer")


def train_nav_exits_command(args) -> dict:
    from tqdm import tqdm

    from edge_llm_ros.core.drafts.exits import save_exits
    from edge_llm_ros.core.drafts.loading import set_threads
    from edge_llm_ros.core.engine.models import load_model
    from edge_llm_ros.core.training.exits import ExitTrainConfig
    from edge_llm_ros.nav import vlm_training as vt
    from edge_llm_ros.nav.camera import Camera
    from edge_llm_ros.nav.vlm import ADAPTERS_DIR, DEFAULT_ADAPTER, NavAdapter
    from edge_llm_ros.tools.train_run import log

    set_threads(args.threads or 0)
    folder = args.adapter or ADAPTERS_DIR / DEFAULT_ADAPTER
    out = args.out or folder / vt.NAV_EXITS_DIR
    target = load_model()
    adapter = NavAdapter.load(folder, target)
    camera = Camera()
    bar = tqdm(total=args.worlds, desc="worlds", unit="world", disable=args.quiet)
    samples = vt.collect_samples(range(vt.TRAIN_SEED_BASE, vt.TRAIN_SEED_BASE + args.worlds), camera, args.perturb,
                                 progress=lambda n: bar.update(1))
    bar.close()
    heldout = vt.collect_samples(vt.HELDOUT_SEEDS, camera, perturb=1)[: args.heldout_frames]
    exits, result = vt.train_nav_exits(adapter, target, samples, heldout, args.layer_list, args.bottleneck,
                                       ExitTrainConfig(epochs=args.epochs, batch_positions=512),
                                       progress=not args.quiet, log=log)
    exits.training["command"] = "edge-llm-ros train nav-exits " + " ".join(getattr(args, "argv", [])[1:])
    for layer, stats in exits.training["heldout"].items():
        log(f"exit {layer}: held-out agreement with the constrained target {stats['agreement']:.3f}")
    save_exits(exits, out, target)
    log(f"wrote {out}")
    return exits.training


def seed_range(text: str, flag: str = "--eval-worlds") -> range:
    first, _, last = text.partition("-")
    try:
        lo, hi = int(first), int(last or first)
    except ValueError:
        raise ValueError(f"{flag}: expected FIRST-LAST seeds, got {text!r}") from None
    if hi < lo:
        raise ValueError(f"{flag}: {hi} < {lo}")
    return range(lo, hi + 1)


def check_nav_args(args) -> None:
    from edge_llm_ros.nav.expert import ExpertConfig
    from edge_llm_ros.nav.vlm_training import HELDOUT_SEEDS, TRAIN_SEED_BASE
    from edge_llm_ros.nav.world import REACH_M

    for flag in ("worlds", "epochs", "batch_size", "lr", "checkpoint_every", "heldout_frames"):
        if getattr(args, flag) <= 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be > 0, got {getattr(args, flag)}")
    if (args.perturb < 0 or args.draft_weight < 0 or args.pretrain_steps < 0 or args.max_steps < 0
            or args.dagger_worlds < 0 or args.decoy_worlds < 0 or args.warmup_steps < 0):
        raise ValueError("--perturb, --draft-weight, --pretrain-steps, --max-steps, --dagger-worlds, "
                         "--decoy-worlds and --warmup-steps must be >= 0")
    if args.dagger_worlds and not args.init:
        raise ValueError("--dagger-worlds needs --init: the adapter whose own states are labelled")
    try:
        args.teacher = ExpertConfig(stop_m=round(REACH_M - args.stop_margin, 6))
    except ValueError:
        raise ValueError(f"--stop-margin must be in [0, 0.2), got {args.stop_margin}") from None
    args.eval_range = seed_range(args.eval_worlds)
    args.check_range = seed_range(args.check_worlds, "--check-worlds")
    used = range(HELDOUT_SEEDS.start, TRAIN_SEED_BASE + args.worlds + args.dagger_worlds + args.decoy_worlds)
    for flag, seeds in (("--eval-worlds", args.eval_range), ("--check-worlds", args.check_range)):
        if seeds.start < used.stop and seeds.stop > used.start:
            raise ValueError(f"{flag} {seeds.start}-{seeds.stop - 1} overlaps the training and held-out worlds "
                             f"({used.start}-{used.stop - 1})")


def closed_loop(navigator, seeds: range, label: str, decoys: bool = False) -> tuple[int, dict]:
    """The navigator over ``seeds`` as navigator_node runs it (nav/evaluation.py; ``decoys``: the
    other training targets seen first), logged world by world: (reached, {seed: outcome line})."""
    from edge_llm_ros.nav.evaluation import TARGET, evaluate, report
    from edge_llm_ros.nav.vlm_training import decoys_for
    from edge_llm_ros.tools.train_run import log

    started = time.perf_counter()
    outcomes = evaluate(navigator, seeds, progress=lambda o: log(f"  {o.line()}"),
                        decoys=decoys_for(TARGET) if decoys else ())
    reached = sum(o.success for o in outcomes)
    log(f"closed loop, {label}: {report(outcomes).splitlines()[0]} in {time.perf_counter() - started:.0f} s")
    return reached, {str(o.seed): o.line() for o in outcomes}


def cached_samples(path: Path, seeds: range, desc: str, what: str, quiet: bool, collect) -> list:
    """The samples saved in ``path``; else ``collect(progress)`` over ``seeds``' worlds, a progress bar
    moving a world at a time, saved there."""
    from tqdm import tqdm

    from edge_llm_ros.nav import vlm_training as vt
    from edge_llm_ros.tools.train_run import log

    if path.is_file():
        samples = vt.load_samples(path)
        log(f"{len(samples)} cached {what} from {path}")
        return samples
    started = time.perf_counter()
    bar = tqdm(total=len(seeds), desc=desc, unit="world", disable=quiet)
    samples = collect(lambda n: bar.update(1))
    bar.close()
    vt.save_samples(samples, path)
    log(f"{len(samples)} {what}, in {time.perf_counter() - started:.0f} s -> {path}")
    return samples


def train_nav_command(args) -> dict:
    import torch
    from tqdm import tqdm

    from edge_llm_ros.core.drafts.draft_models import load_draft
    from edge_llm_ros.core.drafts.loading import set_threads
    from edge_llm_ros.core.engine.config import GenerationConfig
    from edge_llm_ros.core.engine.models import load_model, target_identity
    from edge_llm_ros.nav import vlm_training as vt
    from edge_llm_ros.nav.camera import Camera
    from edge_llm_ros.nav.navigator import MAX_ANSWER_TOKENS, Navigator
    from edge_llm_ros.nav.vlm import ADAPTERS_DIR, DEFAULT_ADAPTER, AdapterConfig, NavAdapter, lora_shapes
    from edge_llm_ros.tools.train_run import default_work_dir, log

    set_threads(args.threads or 0)
    target = load_model()
    draft = load_draft(target).model
    init = None if args.init in (None, "shipped") else Path(args.init)

    def navigator(adapter: NavAdapter) -> Navigator:  # sd: the constrained greedy answer, sooner
        return Navigator(adapter, target, draft, GenerationConfig(mode="sd", max_new_tokens=MAX_ANSWER_TOKENS, gamma=4))

    if args.evaluate_only:
        adapter = NavAdapter.load(init, target)
        reached, outcomes = closed_loop(navigator(adapter), args.eval_range, "evaluation worlds", args.decoys)
        checked, check_outcomes = closed_loop(navigator(adapter), args.check_range, "check worlds", args.decoys)
        return {"eval_reached": reached, "eval_outcomes": outcomes, "check_reached": checked,
                "check_outcomes": check_outcomes, "decoy_eval": args.decoys}

    work = args.work or default_work_dir("smollm2-nav")
    out = args.out or ADAPTERS_DIR / DEFAULT_ADAPTER
    work.mkdir(parents=True, exist_ok=True)
    camera, teacher = Camera(), args.teacher
    seeds = range(vt.TRAIN_SEED_BASE, vt.TRAIN_SEED_BASE + args.worlds)
    samples = cached_samples(
        work / f"samples-camera-w{args.worlds}-p{args.perturb}-stop{teacher.stop_m:g}.npz", seeds, "worlds",
        f"samples from {args.worlds} worlds", args.quiet,
        lambda progress: vt.collect_samples(seeds, camera, args.perturb, progress=progress, teacher=teacher))
    heldout = vt.collect_samples(vt.HELDOUT_SEEDS, camera, perturb=1, teacher=teacher)[: args.heldout_frames]

    if args.init:
        adapter = NavAdapter.load(init, target)
        log(f"from the adapter in {adapter.folder}")
    else:
        lora = {"target": lora_shapes(target), "draft": lora_shapes(draft)}
        adapter = NavAdapter(AdapterConfig(lora=lora), identity=target_identity(target))
    learned = 0
    if args.dagger_worlds:
        seeds = range(vt.TRAIN_SEED_BASE + args.worlds, vt.TRAIN_SEED_BASE + args.worlds + args.dagger_worlds)
        own = cached_samples(
            work / f"samples-dagger-{seeds.start}-{seeds.stop - 1}-stop{teacher.stop_m:g}.npz", seeds, "dagger",
            f"learner samples: the adapter's own states in worlds {seeds.start}-{seeds.stop - 1}, labelled by the "
            "teacher", args.quiet,
            lambda progress: vt.learner_samples(navigator(adapter), seeds, camera, teacher, progress=progress))
        samples, learned = samples + own, len(own)
    decoyed = 0
    if args.decoy_worlds:
        start = vt.TRAIN_SEED_BASE + args.worlds + args.dagger_worlds
        seeds = range(start, start + args.decoy_worlds)
        seen_first = cached_samples(
            work / f"samples-decoy-{seeds.start}-{seeds.stop - 1}-p{args.perturb}-stop{teacher.stop_m:g}.npz", seeds,
            "decoy worlds", f"samples from decoy worlds {seeds.start}-{seeds.stop - 1} (the other targets seen first)",
            args.quiet, lambda progress: vt.collect_samples(seeds, camera, args.perturb, rng_seed=1, progress=progress,
                                                            teacher=teacher, decoys=True))
        samples, decoyed = samples + seen_first, len(seen_first)
    checkpoint = work / "checkpoint.pt"
    if not args.resume and checkpoint.exists():
        checkpoint.unlink()
    torch.manual_seed(0)
    pretrained: dict = {}
    if args.pretrain_steps and not checkpoint.exists():
        bar = tqdm(total=args.pretrain_steps, desc="encoder", unit="step", disable=args.quiet)
        pretrained = vt.pretrain_encoder(adapter, samples, args.pretrain_steps, heldout=heldout,
                                         progress=lambda step, total, loss: bar.update(1))
        bar.close()
        log(f"encoder: {args.pretrain_steps} steps in {pretrained['train_s']:.0f} s, loss "
            f"{pretrained['final_loss']:.3f}; held-out action from the frame alone "
            f"{pretrained['heldout_action_accuracy']:.3f}")
    bar = tqdm(total=None, desc="training", unit="step", disable=args.quiet)

    def progress(step: int, total: int, loss: float) -> None:
        bar.total = total
        bar.n = step
        bar.set_postfix(loss=f"{loss:.3f}")
        bar.refresh()
        if args.quiet and (step % args.checkpoint_every == 0 or step == total):
            log(f"step {step}/{total}, loss {loss:.3f}")

    config = vt.NavTrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                               draft_weight=args.draft_weight, max_steps=args.max_steps,
                               warmup_steps=args.warmup_steps, checkpoint_every=args.checkpoint_every)
    trained = vt.train_adapter(adapter, target, draft, target.tokenizer, samples, config, checkpoint, progress)
    bar.close()
    log(f"trained {trained['steps']} steps in {trained['train_s']:.0f} s, final loss {trained['final_loss']:.3f}")

    accuracy = vt.action_accuracy(navigator(adapter), heldout)
    log(f"held-out action accuracy {accuracy:.3f} over {len(heldout)} frames")
    reached, outcomes = closed_loop(navigator(adapter), args.eval_range, "evaluation worlds", args.decoys)
    checked, check_outcomes = closed_loop(navigator(adapter), args.check_range, "check worlds", args.decoys)
    adapter.training_info = {**trained, "encoder_pretraining": pretrained, "samples": len(samples),
                             "worlds": args.worlds, "perturb": args.perturb, "teacher_stop_m": teacher.stop_m,
                             "init": str(adapter.folder) if args.init else None,
                             "dagger_worlds": args.dagger_worlds, "learner_samples": learned,
                             "decoy_worlds": args.decoy_worlds, "decoy_samples": decoyed,
                             "action_accuracy": accuracy, "heldout_frames": len(heldout),
                             "eval_worlds": f"{args.eval_range.start}-{args.eval_range.stop - 1}",
                             "eval_reached": reached, "eval_outcomes": outcomes,
                             "check_worlds": f"{args.check_range.start}-{args.check_range.stop - 1}",
                             "check_reached": checked, "check_outcomes": check_outcomes, "decoy_eval": args.decoys,
                             "command": "edge-llm-ros train nav " + " ".join(getattr(args, "argv", [])[1:])}
    adapter.save(out)
    log(f"wrote {out}")
    return adapter.training_info
