"""``python -m flowstate.cli``."""

from flowstate.cli import main

main()
