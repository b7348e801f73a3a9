"""What FlowState is as an installed distribution: its name, its version, and how to add one of its extras — the
facts every missing-extra message and every session file's header give (storage reads them too)."""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "flowstate-agent"  # pyproject's [project] name (PyPI's "flowstate" is an unrelated project)


def version() -> str:
    """The installed version ("unknown" in a source tree that was never installed)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def install_hint(extra: str) -> str:
    """How to add one of FlowState's extras (FlowState installs from a checkout or its built wheel; the name
    ``flowstate`` on PyPI is another project)."""
    return f"install the {extra!r} extra (in a checkout: pip install -e '.[{extra}]')"


def commit() -> str:
    """The code's commit where it runs from a git checkout (``+`` when it has changes not committed), else the
    installed version: what a report names so that its figures can be traced to the code that made them."""
    here = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            raise OSError(head.stderr)
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"{DISTRIBUTION} {version()}"
    return head.stdout.strip() + ("+" if dirty else "")
