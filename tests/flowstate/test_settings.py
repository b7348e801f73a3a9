"""``flowstate serve --config FILE`` and ``--print-config``: every option a key of the file, a flag beats it, an
unknown key or a bad value refused by name, secrets never printed, and the shipped example valid."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from flowstate.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["serve", *args])
    return result.exit_code, result.output


def test_the_file_gives_the_options_a_flag_beats_it_and_secrets_stay_masked(tmp_path: Path) -> None:
    file = tmp_path / "serve.toml"
    file.write_text('port = 9001\napi-key = ["k-one-secret", "k-two-secret"]\nretention = "idle=30d"\n'
                    'max-live-sessions = 100\nengine = "scripted"\n'
                    'chat-template-kwargs = { enable_thinking = false }\n')
    code, out = _run("--config", str(file), "--port", "9002", "--print-config")
    assert code == 0, out
    lines = dict(line.split(" = ", 1) for line in out.splitlines() if " = " in line and not line.startswith("#"))
    assert lines["port"] == "9002  # flag" and lines["max-live-sessions"] == f"100  # file {file}"
    assert lines["retention"] == f'"idle=30d"  # file {file}' and lines["host"] == '"127.0.0.1"  # default'
    assert lines["api-key"] == f'["***", "***"]  # file {file}' and "k-one-secret" not in out and "k-two" not in out
    assert lines["chat-template-kwargs"].startswith('"{\\"enable_thinking\\": false}"')
    assert "# vault-key =  (default: none)" in out


def test_an_unknown_key_or_a_bad_value_is_refused_by_name(tmp_path: Path) -> None:
    file = tmp_path / "serve.toml"
    file.write_text("prot = 9001\n")
    code, out = _run("--config", str(file), "--print-config")
    assert code == 2 and "'prot' is no option of flowstate serve" in out and "did you mean 'port'?" in out
    file.write_text('port = "eighty"\n')
    code, out = _run("--config", str(file), "--print-config")
    assert code == 2 and "--port" in out and "eighty" in out
    file.write_text("port = \n")
    code, out = _run("--config", str(file), "--print-config")
    assert code == 2 and "is not TOML" in out
    code, out = _run("--config", str(tmp_path / "none.toml"), "--print-config")
    assert code == 2 and "cannot read" in out


def test_the_shipped_example_is_valid() -> None:
    example = ROOT / "docs" / "serve.toml"
    code, out = _run("--config", str(example), "--print-config")
    assert code == 0, out
    from_file = [line.split(" = ")[0] for line in out.splitlines() if f"# file {example}" in line]
    keys = [line.split(" = ")[0] for line in example.read_text().splitlines()
            if " = " in line and not line.startswith("#")]
    assert sorted(from_file) == sorted(keys) and len(keys) >= 10


def test_what_the_environment_gives_is_shown_as_the_environments(tmp_path: Path, monkeypatch: object) -> None:
    import pytest

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    monkeypatch.setenv("FLOWSTATE_DB", str(tmp_path / "env.db"))
    monkeypatch.setenv("FLOWSTATE_API_KEYS", "k-env-one-secret,k-env-two-secret")
    monkeypatch.setenv("FLOWSTATE_RETENTION", "idle=7d")
    monkeypatch.setenv("FLOWSTATE_VAULT_KEY", "v-env-secret")
    code, out = _run("--print-config")
    assert code == 0, out
    lines = dict(line.split(" = ", 1) for line in out.splitlines() if " = " in line and not line.startswith("#"))
    assert lines["db"] == f'"{tmp_path / "env.db"}"  # environment $FLOWSTATE_DB'
    assert lines["api-key"] == '["***", "***"]  # environment $FLOWSTATE_API_KEYS' and "k-env" not in out
    assert lines["retention"] == '"idle=7d"  # environment $FLOWSTATE_RETENTION'
    assert lines["vault-key"] == '"***"  # environment $FLOWSTATE_VAULT_KEY' and "v-env-secret" not in out
    code, out = _run("--db", str(tmp_path / "flag.db"), "--print-config")  # a flag beats the environment
    assert f'db = "{tmp_path / "flag.db"}"  # flag' in out
