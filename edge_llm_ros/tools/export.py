"""``edge-llm-ros export draft``: write a trained draft as a GGUF file that llama.cpp runs.

    edge-llm-ros export draft                              # the shipped draft, into the model cache
    edge-llm-ros export draft --out draft.gguf --type f16 --vocab full
    edge-llm-ros export draft --draft drafts/k4 --model SmolLM2.Q8_0.gguf --out k4.gguf

The draft's layers and norm, with the target GGUF's token embedding (tied head) and tokenizer
(core's :func:`~edge_llm_ros.core.drafts.gguf.export_draft_gguf`). ``--vocab subset`` (the default)
writes a head over the draft's vocabulary subset only (cheaper per token); that file reads its
input embeddings from the target GGUF it was exported for, at that path. ``--vocab full`` writes a
self-contained file scoring the whole vocabulary. Without ``--out`` the export
goes where ``--draft llama.cpp`` looks for it (the model cache), and is reused if it is there.
Exit codes: 0 success, 2 bad input (one ``error: ...`` line on stderr).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TextIO

from edge_llm_ros.core.drafts.gguf import (
    DEFAULT_LAYER_TYPE,
    DEFAULT_VOCAB,
    LAYER_TYPES,
    VOCABS,
    default_draft_gguf,
    export_draft_gguf,
)
from edge_llm_ros.core.engine.models import MODEL_CACHE_ENV, model_cache_root
from edge_llm_ros.tools.generate import Parser, one_line
from edge_llm_ros.tools.loading import ToolError


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="edge-llm-ros export", description="Export a trained draft for llama.cpp.")
    sub = p.add_subparsers(dest="what", required=True, metavar="draft")
    d = sub.add_parser("draft", help="a trained draft as a llama GGUF (its target's embedding and tokenizer)")
    d.add_argument("--draft", default=None, metavar="DIR", help="trained draft directory (default: the shipped one)")
    d.add_argument("--model", default=None, metavar="TARGET.gguf", help="target GGUF (default: SmolLM2-135M-Instruct)")
    d.add_argument("--out", default=None, metavar="FILE", help="where to write (default: the model cache)")
    d.add_argument("--type", default=DEFAULT_LAYER_TYPE, choices=LAYER_TYPES,
                   help=f"layer weight type (default: {DEFAULT_LAYER_TYPE})")
    d.add_argument("--vocab", default=DEFAULT_VOCAB, choices=VOCABS,
                   help=f"head over the draft's vocabulary subset (reads the target GGUF's embedding) or the whole "
                        f"vocabulary (self-contained) (default: {DEFAULT_VOCAB})")
    return p


def export_draft(args: argparse.Namespace) -> tuple[Path, float]:
    """Check the paths, export; the file written (or found in the cache) and when the export began."""
    if args.draft is not None and not Path(args.draft).is_dir():
        raise ToolError(f"draft directory not found: {args.draft}")
    if args.model is not None and not Path(args.model).is_file():
        raise ToolError(f"model not found: {args.model}")
    if args.out is None and model_cache_root() is None:
        raise ToolError(f"the model cache is off ({MODEL_CACHE_ENV}=0): give --out FILE")
    start = time.time()
    try:
        if args.out is None:
            path = default_draft_gguf(args.model, args.draft, args.type, args.vocab)
        else:
            path = export_draft_gguf(args.draft, args.model, args.out, args.type, args.vocab)
    except (OSError, ValueError) as exc:
        raise ToolError(f"cannot export the draft: {one_line(exc)}") from exc
    return path, start


def main(argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    try:
        args = build_parser().parse_args(argv)
        path, start = export_draft(args)
    except ToolError as exc:
        print(f"error: {one_line(exc)}", file=err, flush=True)
        return 2
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    stat = path.stat()
    done = f"wrote {path}" if stat.st_mtime >= start - 1 else f"already exported: {path}"
    print(f"{done} ({stat.st_size / 1e6:.1f} MB)", file=out, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
