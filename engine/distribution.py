"""What FlowState is as an installed distribution: its name, its version, and how to add one of its extras — the
facts every missing-extra message and every session file's header give (storage reads them too)."""

from __future__ import annotations

from importlib import metadata

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
