"""``flowstate bench mcp``: per-session MCP servers under ``--mcp-sessions``, through a real ``flowstate serve``.

N sessions, one after another, each make one request whose step calls the ``count`` tool of a per-session MCP
server (``--mcp-scope session``, the stateful counter of ``flowstate.bench.mcp_counter``); after each, the
server's live MCP connections (``/metrics``) and its child processes (``/proc``) are read. Then the first
``again`` sessions — released long ago to keep within the bound — call once more: every such call must work (a
fresh server, whose count starts again at 1: what a release loses).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flowstate.bench.server import output, rss_mb, serve, stop
from flowstate.bench.table import table

CALL = output(tool_calls=[{"name": "count", "arguments": {}}])


def answer(request: int) -> str:
    """The step after the call: a state citing the call's observation (so it is stored), and the answer."""
    state = {"operation": "add", "state_set": "knowledge", "state_id": f"count_{request}", "summary": "the count",
             "value": {}, "refs": [{"rel": "supports", "state_id": f"obs_r{request}_s1_1"}]}
    return output(state_delta=[state], assistant_message={"content": "counted"})


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _gauge(text: str, name: str) -> float:
    match = re.search(rf"^{name}\{{[^}}]*\}} ([0-9.e+]+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def _counted(http: Any, session: str) -> Any:
    """The ``count`` result of the session's latest request (its observation), or the error it got."""
    dump = http.get(f"/v1/sessions/{session}").json()
    observations = [n for n in dump["nodes"] if n["id"].startswith("obs_")]
    value = observations[-1]["value"] if observations else {}
    return value.get("result", {}).get("result") if isinstance(value.get("result"), dict) else value


def bench_mcp(sessions: int, bound: int, again: int, progress: Callable[[str], None]) -> dict[str, Any]:
    """One server, ``sessions`` sessions each calling one tool of its own MCP server, at most ``bound`` live."""
    import httpx
    from openai import OpenAI

    if not os.path.exists("/proc/self/status"):
        raise RuntimeError("flowstate bench mcp reads the server's child processes from /proc (Linux)")
    again = min(again, sessions)
    with tempfile.TemporaryDirectory() as tmp:
        script = [CALL, answer(1)] * sessions + [CALL, answer(2)] * again
        proc, url = serve(Path(tmp), script, str(Path(tmp) / "bench.db"),
                          ["--mcp", f"counter={sys.executable} -m flowstate.bench.mcp_counter", "--mcp-scope",
                           "session", "--mcp-sessions", str(bound), "--max-live-sessions", str(sessions + again)])
        try:
            client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
            http = httpx.Client(base_url=url, timeout=60)
            peak_live = peak_procs = 0
            peak_rss = 0.0
            first: list[Any] = []
            started = time.monotonic()
            for i in range(sessions):
                reply = client.chat.completions.create(model="flowstate", user=f"s{i}",
                                                       messages=[{"role": "user", "content": "Count once."}])
                if reply.choices[0].message.content != "counted":
                    raise RuntimeError(f"session s{i}'s request did not end as scripted: {reply}")
                first.append(_counted(http, f"s{i}"))
                metrics = http.get("/metrics").text
                peak_live = max(peak_live, int(_gauge(metrics, "flowstate_mcp_connections")))
                procs = children(proc.pid)
                if len(procs) >= peak_procs:
                    peak_procs = len(procs)
                    peak_rss = max(peak_rss, sum(_rss(p) for p in procs))
                if (i + 1) % 50 == 0:
                    progress(f"{i + 1}/{sessions} sessions: {len(procs)} MCP processes, peak live {peak_live}")
            elapsed = time.monotonic() - started
            later = []
            for i in range(again):
                client.chat.completions.create(model="flowstate", user=f"s{i}",
                                               messages=[{"role": "user", "content": "Count again."}])
                later.append(_counted(http, f"s{i}"))
            released = int(_gauge(http.get("/metrics").text, "flowstate_mcp_released"))
        finally:
            stop(proc)
    return {"sessions": sessions, "bound": bound, "peak_live": peak_live, "peak_processes": peak_procs,
            "peak_mcp_rss_mb": round(peak_rss), "mb_per_process": round(peak_rss / max(peak_procs, 1)),
            "released": released, "first_calls_ok": sum(c == 1 for c in first),
            "later_calls": again, "later_calls_ok": sum(isinstance(c, int) for c in later),
            "later_fresh": sum(c == 1 for c in later), "s_per_session": round(elapsed / sessions, 2)}


def _rss(pid: int) -> float:
    try:
        return rss_mb(pid)
    except (OSError, RuntimeError):
        return 0.0


HEAD = ["sessions", "bound", "peak_live", "peak_processes", "peak_mcp_rss_mb", "mb_per_process", "released",
        "first_calls_ok", "later_calls", "later_calls_ok", "later_fresh", "s_per_session"]


def render_table(rows: list[dict[str, Any]]) -> str:
    return table(HEAD, rows)
