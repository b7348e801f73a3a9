"""`import flowstate` (and the engine seam) pull in neither torch nor vllm."""

from __future__ import annotations

import subprocess
import sys


def test_import_is_light() -> None:
    code = ("import sys, flowstate, flowstate.cli, engine, grammars, serving; print(sorted(m for m in ('torch', "
            "'vllm', 'transformers') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            timeout=120)
    assert result.stdout.strip() == "[]"
