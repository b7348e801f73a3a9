"""Chat Completions that remember: ``routes.py`` its route, ``wire.py`` the strict wire models of a request,
``service.py`` the service a turn runs through (over the turn driver both endpoints share, serving/turns.py),
``completions.py`` and ``messages.py`` what it answers (a completion, or its stream's chunks)."""
