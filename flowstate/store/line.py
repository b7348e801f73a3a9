"""A session's lineage as SQL, the one place it is written (it imports nothing: the schema's migrations read it
through search.py, below the backends)."""

# A session's lineage: the session itself (every request of it), then, for a fork, the session it was forked from up
# to the fork's point, and so on up (each ancestor only up to its child's point). Every read of a session's requests,
# nodes, relations and transcripts joins it, so a fork shares what came before its point without a copy of it.
LINE = ("WITH RECURSIVE line(sid, parent, fork_at, upto) AS ("
        "SELECT id, parent_id, fork_at, 2147483647 FROM sessions WHERE name = ?"
        " UNION ALL SELECT s.id, s.parent_id, s.fork_at, l.fork_at FROM sessions s JOIN line l ON s.id = l.parent) ")
IN_LINE = "JOIN line l ON n.session_id = l.sid AND n.request_idx <= l.upto"  # nodes n of the lineage
