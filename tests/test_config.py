"""Config: every kind of mistake names the file, the key path and the problem, and the
gateway refuses to start; variables expand; secrets never reach the logs."""
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import config
from config import ConfigError
from gateway import create_app

ROOT = Path(__file__).resolve().parent.parent
VALID = {"providers": {"p": {"type": "demo"}},
         "models": {"chat": [{"id": "p/m", "provider": "p", "list_input_usd_per_mtok": 1.5,
                              "list_output_usd_per_mtok": 2}]}}


def write(tmp_path, data, name="gw.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def problems(tmp_path, data, env=None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, data), env=env or {})
    return info.value.problems


def test_valid_config_prices_become_integers(tmp_path):
    cfg = config.load(write(tmp_path, VALID), env={})
    m = cfg.chat_models["p/m"]
    assert (m.list_input_micro, m.list_output_micro, m.input_micro, m.output_micro) == (1_500_000, 2_000_000,
                                                                                         750_000, 1_000_000)
    assert m.upstream == "m"


@pytest.mark.parametrize("data,expected", [
    ("a: [1, 2", "not valid YAML (line 1"),
    ("- just\n- a list\n", "top level must be a mapping"),
    ({**VALID, "server": {"port": "eighty"}}, "server.port: expected a port number"),
    ({**VALID, "storage": "mysql://x"}, "storage: expected sqlite:///PATH"),
    ({**VALID, "pricing": {"discount": 2}}, "pricing.discount: expected a number in (0, 1]"),
    ({**VALID, "providers": {"p": {"base_url": "x"}}}, "providers.p.type: required"),
    ({**VALID, "models": {"chat": [{"id": "a", "provider": "zzz", "list_input_usd_per_mtok": 1,
                                    "list_output_usd_per_mtok": 1}]}}, "models.chat[0].provider: no provider named 'zzz'"),
    ({**VALID, "models": {"chat": [{"id": "a", "provider": "p", "list_input_usd_per_mtok": "cheap",
                                    "list_output_usd_per_mtok": 1}]}}, "models.chat[0].list_input_usd_per_mtok: expected a number"),
    ({**VALID, "models": {"chat": [{"id": "a", "provider": "p", "list_input_usd_per_mtok": 0.0000001,
                                    "list_output_usd_per_mtok": 1}]}}, "at most 6 decimals"),
    ({**VALID, "models": {"chat": [{"id": "a", "provider": "p", "list_output_usd_per_mtok": 1}]}},
     "models.chat[0].list_input_usd_per_mtok: required"),
    ({**VALID, "models": {"chat": [{"provider": "p", "list_input_usd_per_mtok": 1, "list_output_usd_per_mtok": 1}]}},
     "models.chat[0].id: required"),
    ({**VALID, "models": {"chat": [VALID["models"]["chat"][0]] * 2}}, "models.chat[1].id: duplicate model id"),
    ({**VALID, "models": {"chat": "p/m"}}, "models.chat: expected a list"),
    ({**VALID, "include": ["missing.yaml"]}, "missing.yaml: cannot read"),
])
def test_each_kind_of_mistake_names_file_and_path(tmp_path, data, expected):
    found = problems(tmp_path, data)
    assert any(expected in p for p in found), found
    assert all(str(tmp_path) in p for p in found)


def test_missing_variable_names_it_and_its_path(tmp_path):
    found = problems(tmp_path, {**VALID, "providers": {"p": {"type": "demo", "api_key": "${NOPE_KEY}"}}})
    assert found == [f"{tmp_path / 'gw.yaml'}: providers.p.api_key: environment variable NOPE_KEY is not set "
                     "(write ${NOPE_KEY:-default} to make it optional)"]


def test_variables_expand_with_defaults(tmp_path):
    data = {**VALID, "server": {"port": 9000, "public_url": "${PUB:-http://fallback}"},
            "providers": {"p": {"type": "demo", "api_key": "${KEY}", "other": "${UNSET:-}"}}}
    cfg = config.load(write(tmp_path, data), env={"KEY": "secret-1"})
    assert cfg.server.public_url == "http://fallback"
    assert cfg.providers["p"].settings["api_key"] == "secret-1"
    assert cfg.providers["p"].unset_env == {"other": "UNSET"}


def test_includes_merge_models_by_id(tmp_path):
    write(tmp_path, VALID, "base.yaml")
    cfg = config.load(write(tmp_path, {"include": ["base.yaml"], "models": {"chat": [
        {"id": "p/m", "list_input_usd_per_mtok": 4}, {"id": "p/n", "provider": "p", "list_input_usd_per_mtok": 1,
                                                      "list_output_usd_per_mtok": 1}]}}), env={})
    assert cfg.chat_models["p/m"].list_input_micro == 4_000_000 and "p/n" in cfg.chat_models


def test_include_loop_is_refused(tmp_path):
    write(tmp_path, {"include": ["b.yaml"]}, "a.yaml")
    write(tmp_path, {"include": ["a.yaml"]}, "b.yaml")
    with pytest.raises(ConfigError) as info:
        config.load(tmp_path / "a.yaml", env={})
    assert "include loop" in info.value.problems[0]


def test_unknown_provider_type_refuses_to_start(tmp_path):
    cfg = config.load(write(tmp_path, {**VALID, "providers": {"p": {"type": "warp-drive"}}}), env={})
    with pytest.raises(ConfigError) as info:
        create_app(cfg)
    assert "providers.p.type: no provider type 'warp-drive'" in info.value.problems[0]


def test_redaction_hides_secrets():
    shown = config.redact({"providers": {"p": {"api_key": "sk-123", "base_url": "u"}}, "x": [{"token": "t"}]})
    assert shown == {"providers": {"p": {"api_key": "***", "base_url": "u"}}, "x": [{"token": "***"}]}


def test_embedded_default_loads_and_serves_the_demo():
    cfg = config.load(env={})
    assert "demo/echo" in cfg.chat_models and len(cfg.chat_models) >= 30
    assert cfg.providers["openai"].unset_env == {"api_key": "OPENAI_API_KEY"}
    create_app(cfg)


def test_gateway_check_and_run_refuse_a_bad_config(tmp_path):
    bad = write(tmp_path, {**VALID, "server": {"port": -1}})
    for command in (["check"], ["run"]):
        out = subprocess.run([sys.executable, str(ROOT / "gateway.py"), *command, "--config", str(bad)],
                             capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert out.returncode == 2
        assert "server.port: expected a port number 0-65535, got -1" in out.stderr
        assert "Traceback" not in out.stderr
    good = subprocess.run([sys.executable, str(ROOT / "gateway.py"), "check", "--config", str(write(tmp_path, VALID))],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert good.returncode == 0 and "OK (1 providers, 1 chat models)" in good.stdout
