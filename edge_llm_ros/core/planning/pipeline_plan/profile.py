"""This machine's costs for a pipeline plan: one decoder layer and the head timed here (a
core/sim/pipeline LayerProfile, a few seconds), saved as JSON for the next plan.

Contract: :func:`saved_profile` returns the profile saved for this model file, machine and thread
count, else measures one (:func:`measure_here`, a line per row count) and saves it. Knows nothing
about ROS.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path

from ..costs import LayerProfile

PROFILE_ROWS, PROFILE_CACHED = (1, 2, 4, 8, 16, 32, 64, 128), (0, 512)
PROFILE_FORMAT = "edge_llm_ros.layer_profile/1"


def measure_here(folder: str | Path, threads: int, say: Callable[[str], None] = lambda line: None) -> LayerProfile:
    """One decoder layer and the head of the model in ``folder`` timed on this machine with
    ``threads`` torch threads, a line per row count through ``say``; a few seconds."""
    import torch

    from ...engine.partial import load_stage_model

    start, before = time.monotonic(), torch.get_num_threads()
    say(f"measuring one decoder layer and the head here ({threads} thread{'s' * (threads != 1)}), "
        f"rows {', '.join(map(str, PROFILE_ROWS))} over {' and '.join(map(str, PROFILE_CACHED))} cached")
    model = load_stage_model(folder, range(0, 1), first=False, last=True)
    torch.set_num_threads(threads)
    try:
        parts = []
        for rows in PROFILE_ROWS:
            parts.append(LayerProfile.measure(model, rows=(rows,), cached=PROFILE_CACHED, repeats=2))
            say(f"  [{time.monotonic() - start:5.1f} s] {rows:>3} rows: {parts[-1].layer_s[0][0] * 1e3:.2f} ms "
                f"a layer, {parts[-1].head_s[0] * 1e3:.2f} ms the head")
    finally:
        torch.set_num_threads(before)
    return LayerProfile(list(PROFILE_ROWS), list(PROFILE_CACHED), [p.layer_s[0] for p in parts],
                        [p.head_s[0] for p in parts], threads,
                        f"measured here: a decoder layer and the head, {threads} thread{'s' * (threads != 1)}")


def profile_key(folder: str | Path, threads: int) -> dict:
    """What a saved profile must have been measured for: this model file, this machine, these threads."""
    return {"model": str(folder), "machine": platform.node(), "threads": threads}


def save_profile(path: str | Path, profile: LayerProfile, folder: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": PROFILE_FORMAT, **profile_key(folder, profile.threads),
                                "profile": dataclasses.asdict(profile)}))


def load_profile(path: str | Path, folder: str | Path, threads: int) -> LayerProfile | None:
    """The profile saved at ``path`` if it was measured for ``folder`` here with ``threads``, else None."""
    try:
        record = json.loads(Path(path).read_text())
        if record.get("format") == PROFILE_FORMAT and all(record.get(k) == v
                                                          for k, v in profile_key(folder, threads).items()):
            return LayerProfile(**record["profile"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        pass
    return None


def saved_profile(path: str | Path, folder: str | Path, threads: int,
                  say: Callable[[str], None] = lambda line: None) -> LayerProfile:
    """The profile saved at ``path`` (:func:`load_profile`), else measured now (:func:`measure_here`)
    and saved there (a write that fails is only said)."""
    profile = load_profile(path, folder, threads)
    if profile is None:
        profile = measure_here(folder, threads, say)
        try:
            save_profile(path, profile, folder)
            say(f"saved the layer profile to {path}")
        except OSError as exc:
            say(f"cannot save the layer profile to {path}: {exc}")
    return profile
