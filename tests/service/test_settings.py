"""Settings: every field an env variable and a flag (generated, so they cannot drift), flags win
over the environment; `python -m service` serves and stops cleanly on SIGTERM."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import uvicorn
from pydantic import ValidationError

from service.__main__ import build_parser, parse_settings
from service.app import create_app
from service.server import DrainingServer
from service.settings import EngineSettings, Settings

REPO = Path(__file__).resolve().parents[2]


def test_every_field_has_a_flag_an_env_variable_and_a_description() -> None:
    help_text = " ".join(build_parser().format_help().split())
    for name, field in Settings.model_fields.items():
        assert field.description, f"{name} needs a one-line trade-off"
        assert "--" + name.replace("_", "-") in help_text
        assert f"BERT_HEADS_{name.upper()}" in help_text


def test_defaults() -> None:
    s = Settings()
    assert (s.host, s.port, s.max_batch_size, s.max_wait_ms) == ("127.0.0.1", 8080, 64, 0)
    assert s.payload_limit == 2_000_000 and s.api_key is None and s.cors_origins == []
    assert (s.variant, s.device) == ("auto", "auto")


def test_env_is_read_and_flags_override_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BERT_HEADS_MAX_BATCH_TOKENS", "4096")
    monkeypatch.setenv("BERT_HEADS_PORT", "9000")
    monkeypatch.setenv("BERT_HEADS_CORS_ORIGINS", "https://a.example, https://b.example")
    monkeypatch.setenv("BERT_HEADS_ALLOW_PARTIAL", "true")
    s = parse_settings(
        ["--port", "9100", "--variant", "int8", "--no-allow-partial", "--api-key", "k"]
    )
    assert s.max_batch_tokens == 4096  # from the environment
    assert s.port == 9100 and s.variant == "int8" and s.allow_partial is False  # flags win
    assert s.cors_origins == ["https://a.example", "https://b.example"]
    assert s.api_key is not None and s.api_key.get_secret_value() == "k"


def test_bad_values_are_refused_with_the_flag_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_settings(["--max-batch-size", "0"])
    assert "--max-batch-size" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_settings(["--device", "tpu"])


def test_the_factory_reads_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BERT_HEADS_MODEL_DIR", str(tmp_path))
    assert create_app().state.settings.model_dir == tmp_path


def test_sigterm_turns_ready_to_503_at_once() -> None:
    app = create_app(Settings())
    server = DrainingServer(uvicorn.Config(app), app.state.registry, drain_timeout=1.0)
    server.handle_exit(signal.SIGTERM, None)
    assert app.state.registry.readiness() == (False, "draining")
    assert server.should_exit and not server.force_exit
    server.handle_exit(signal.SIGINT, None)  # a second Ctrl-C skips the drain
    assert server.force_exit


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_api_key_means_no_key(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """docker compose passes `BERT_HEADS_API_KEY: ${BERT_HEADS_API_KEY:-}` as "" when unset."""
    monkeypatch.setenv("BERT_HEADS_API_KEY", value)
    assert Settings().api_key is None
    monkeypatch.setenv("BERT_HEADS_API_KEY", "s3cret")
    assert Settings().api_key is not None


def test_help_shows_the_common_options_first_and_every_setting_once():
    from service.__main__ import GROUPS

    grouped = [name for names in GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(Settings.model_fields)  # each exactly once
    lines = build_parser().format_help().splitlines()
    first_screen = "\n".join(lines[:45])
    for name in GROUPS["common"]:
        assert f"--{name.replace('_', '-')}" in first_screen, name
    assert lines[0] == "usage: python -m service [--model-dir DIR] [--port PORT] [options]"
    assert "examples:" in lines[-4]


def test_the_engine_reads_engine_settings_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The engine's part: every engine knob as the server's settings have it, no HTTP knob;
    EngineSettings reads no environment and refuses a field it does not have."""
    monkeypatch.setenv("BERT_HEADS_MAX_BATCH_SIZE", "3")
    server = Settings(model_dir=tmp_path, port=9, api_key="k", request_timeout=7.0)
    engine = server.engine()
    assert type(engine) is EngineSettings
    assert engine.max_batch_size == 3 and engine.request_timeout == 7.0
    assert engine.model_dump() == server.model_dump(include=set(EngineSettings.model_fields))
    assert not hasattr(engine, "port") and not hasattr(engine, "api_key")
    assert EngineSettings().max_batch_size == 64  # the environment is the server's to read
    with pytest.raises(ValidationError, match="port"):
        EngineSettings(port=9)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="model_control poll needs verify_sha256"):
        EngineSettings(model_control="poll", verify_sha256=False)
    assert type(create_app(server).state.engine.settings) is EngineSettings
