"""What a device plan holds for: the model's content and this machine, not where a file lies.

A device plan says how fast a model runs here, so the same model bytes anywhere on this machine
(the same GGUF in another virtual environment) share it, and another model or another machine
does not:

    model_identity(path)  {"name": "SmolLM2-135M-Instruct.Q4_1.gguf", "size": 98362432, "sha256": "b179..."}
                          (None where ``path`` is no file or folder: a name, such as the tests' tiny model)
    this_machine()        {"cpu": "AMD EPYC ...", "cpu_count": 2, "arch": "x86_64"}

A folder (an HF model) is hashed over its files: each one's path inside it, size and content. A
hash is computed once per version of the file: it is cached under the model cache
(``$EDGE_LLM_ROS_MODEL_CACHE``, default ``~/.cache/edge_llm_ros/models``; "0": no cache) keyed by
the resolved path, size, mtime and inode, so an edited or replaced file is hashed again. SmolLM2's
98 MB GGUF hashes in 0.07 s here; a 4 GB model takes seconds, the first time only.
Knows nothing about ROS.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

from ..engine.models import model_cache_root

CHUNK = 1 << 20
MACHINE_KEYS = ("cpu", "cpu_count", "arch")  # what a plan's machine must match (a plan keeps more, for people)


def model_identity(model: str | os.PathLike) -> dict | None:
    """The model's name, size in bytes and content hash; None if ``model`` is no file or folder."""
    path = Path(model).expanduser()
    if not path.exists():
        return None
    files = _files(path)
    return {"name": path.name, "size": sum(f.stat().st_size for f in files), "sha256": _sha256(path, files)}


def same_content(a: dict | None, b: dict | None) -> bool:
    """Two identities of the same bytes (the names may differ)."""
    return a is not None and b is not None and (a["size"], a["sha256"]) == (b["size"], b["sha256"])


def describe(identity: dict) -> str:
    """``SmolLM2-135M-Instruct.Q4_1.gguf (98362432 bytes, sha256 b179c9523d0e)``."""
    return f"{identity['name']} ({identity['size']} bytes, sha256 {identity['sha256'][:12]})"


def this_machine() -> dict:
    """This machine as a plan records it (MACHINE_KEYS, compared; the platform beside them)."""
    return {"cpu": cpu_name(), "cpu_count": os.cpu_count(), "arch": platform.machine(),
            "platform": platform.platform()}


def machine_differences(recorded: dict) -> list[str]:
    """How a plan's recorded machine differs from this one ("cpu X, here Y"); [] for none. Keys
    the record lacks (a plan written before they were kept) are not compared."""
    here = this_machine()
    return [f"{key} {recorded[key]}, here {here[key]}" for key in MACHINE_KEYS
            if key in recorded and recorded[key] != here[key]]


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# -- the content hash, cached ---------------------------------------------------------------------


def _files(path: Path) -> list[Path]:
    """The file, or a folder's files (sorted, hidden ones left out)."""
    if path.is_file():
        return [path]
    return sorted(f for f in path.rglob("*") if f.is_file()
                  and not any(part.startswith(".") for part in f.relative_to(path).parts))


def _sha256(path: Path, files: list[Path]) -> str:
    """The content hash (for a folder: over each file's relative path, size and hash), cached."""
    entry = _cache_entry(path, files)
    if entry is not None:
        try:
            return json.loads(entry.read_text())["sha256"]
        except (OSError, ValueError, KeyError, TypeError):
            pass
    if path.is_file():
        digest = _file_sha256(path)
    else:
        outer = hashlib.sha256()
        for f in files:
            outer.update(f"{f.relative_to(path).as_posix()}\0{f.stat().st_size}\0{_file_sha256(f)}\n".encode())
        digest = outer.hexdigest()
    if entry is not None:
        _write(entry, {"path": str(path.resolve()), "sha256": digest})
    return digest


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _cache_entry(path: Path, files: list[Path]) -> Path | None:
    """Where the hash of this version of ``path`` is kept; None without a model cache."""
    root = model_cache_root()
    if root is None:
        return None
    stats = [(f.resolve(), f.stat()) for f in files]
    version = "|".join(f"{p}:{s.st_size}:{s.st_mtime_ns}:{s.st_ino}" for p, s in stats)
    return root / "identities" / f"{hashlib.sha256(version.encode()).hexdigest()[:24]}.json"


def _write(entry: Path, record: dict) -> None:
    """Write a cache entry in one step; a cache that cannot be written is only not kept."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        partial = entry.with_name(f"{entry.name}.{os.getpid()}.partial")
        partial.write_text(json.dumps(record))
        partial.replace(entry)
    except OSError:
        pass
