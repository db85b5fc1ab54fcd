"""Operators' mistakes are caught before start: each broken config below makes `gateway run`
print exactly these problems (file, key path, what is wrong) and exit 2 without serving."""
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import gateway
from tests.conftest import deep_merge

ROOT = Path(__file__).resolve().parent.parent

BASE = {
    "providers": {"p": {"type": "demo"}, "o": {"type": "openai", "api_key": "k"}},
    "models": {
        "chat": [{"id": "p/m", "provider": "p", "list_input_usd_per_mtok": 1, "list_output_usd_per_mtok": 2}],
        "image": [{"id": "p/img", "provider": "p", "upstream": {"generate": "x"}, "list_usd_per_image": 0.02,
                   "options": {"quality": {"values": ["low", "high"], "default": "low"}}}],
        "video": [{"id": "p/vid", "provider": "p", "upstream": {"text_to_video": "x"}, "list_usd_per_second": 0.1,
                   "options": {"duration_seconds": {"min": 2, "max": 8, "step": 2, "default": 4}}}],
    },
}
TIERS = {"easy": "p/m", "medium": "p/m", "hard": "p/m", "frontier": "p/m"}


def chat(**fields):
    return {"models": {"chat": [{**BASE["models"]["chat"][0], **fields}]}}


def image(**fields):
    return {"models": {"image": [{**BASE["models"]["image"][0], **fields}]}}


def video(**fields):
    return {"models": {"video": [{**BASE["models"]["video"][0], **fields}]}}


CASES = [
    ({"limits": {"per_key": {"rpm": "many"}}}, "limits.per_key.rpm: expected a whole number, got 'many'"),
    ({"limits": {"per_key": {"rpm": -5}}}, "limits.per_key.rpm: must be more than 0, got -5"),
    ({"limits": {"per_address": {"tpm": 0}}}, "limits.per_address.tpm: must be more than 0, got 0"),
    ({"limits": 5}, "limits: expected a mapping, got a whole number"),
    ({"limits": {"per_key": {"rpm": 1.5}}}, "limits.per_key.rpm: expected a whole number, got 1.5"),
    ({"free": {"daily_allowance_usd": "lots"}},
     "free.daily_allowance_usd: expected an amount in USD such as 0.05, got 'lots'"),
    ({"free": {"daily_allowance_usd": -1}}, "free.daily_allowance_usd: must be at least 0 USD, got -1"),
    ({"sever": {"port": 1}}, "sever: unknown section (did you mean 'server'?)"),
    ({"server": {"prot": 80}}, "server.prot: unknown key (did you mean 'port'?)"),
    (chat(tool=True), "models.chat[0].tool: unknown key (did you mean 'tools'?)"),
    ({"server": {"port": "8080"}}, "server.port: expected a whole number, got '8080'"),
    ({"server": {"port": 70000}}, "server.port: must be at most 65535, got 70000"),
    ({"free": {"featured": ["nope/model"]}}, "free.featured[0]: 'nope/model' is not a chat model under models.chat"),
    ({"free": {"models": ["p/mm"]}}, "free.models[0]: 'p/mm' is not a chat model under models.chat "
                                     "(did you mean 'p/m'?)"),
    ({"free": {"frontier": {"models": ["x/y"], "output_cap": 10}}},
     "free.frontier.models[0]: 'x/y' is not a chat model under models.chat"),
    ({"free": {"frontier": {"output_cap": -1}}}, "free.frontier.output_cap: must be at least 0, got -1"),
    ({"router": {"tiers": {**TIERS, "hard": "p/x"}}},
     "router.tiers.hard: 'p/x' is not a chat model under models.chat"),
    ({"router": {"tiers": {"easy": "p/m"}}}, "router.tiers: give a model for each of easy, medium, hard, frontier"),
    ({"router": {"tiers": {**TIERS, "extreme": "p/m"}}},
     "router.tiers.extreme: expected 'easy', 'medium', 'hard' or 'frontier', got 'extreme'"),
    ({"router": {"classifier": {"model": "p/img"}}},
     "router.classifier.model: 'p/img' is not a chat model under models.chat"),
    ({"router": {"media": {"image": {"generate": {"low": "p/vid"}}}}},
     "router.media.image.generate.low: 'p/vid' is not an image model under models.image"),
    ({"router": {"media": {"video": {"image_to_video": {"medium": "p/vid"}}}}},
     "router.media.video.image_to_video.medium: 'p/vid' does not offer image_to_video (it offers text_to_video)"),
    (video(upstream={"text_to_video": "x", "reference_to_video": "y"}, max_references=1),
     "models.video[0].max_references: reference_to_video needs room for at least two references (got 1)"),
    (image(options={"quality": {"values": ["low", "high"]}}), "models.image[0].options.quality.default: required"),
    (image(options={"quality": {"values": ["low", "high"], "default": "low", "price_multiplier": {"ultra": 2}}}),
     "models.image[0].options.quality.price_multiplier.ultra: 'ultra' is not offered (values: low, high)"),
    (image(free_tier={"max_n": 0}), "models.image[0].free_tier.max_n: must be more than 0, got 0"),
    (image(options={"qualty": {"values": ["low"], "default": "low"}}),
     "models.image[0].options.qualty: unknown key (did you mean 'quality'?)"),
    (image(upstream={"generat": "x"}), "models.image[0].upstream: unknown operation 'generat' (known: generate, edit)"),
    (chat(list_input_usd_per_mtok="cheap"),
     "models.chat[0].list_input_usd_per_mtok: expected an amount in USD such as 0.05, got 'cheap'"),
    (chat(list_output_usd_per_mtok=0.0000001),
     "models.chat[0].list_output_usd_per_mtok: more precision than one micro-USD (at most 6 decimals), got 1e-07"),
    (chat(pricing="per_request"), "models.chat[0].usd_per_request: required"),
    (chat(provider="q"), "models.chat[0].provider: no provider named 'q' under providers (known: o, p)"),
    ({"providers": {"o": {"timout_seconds": 5}}},
     "providers.o.timout_seconds: unknown key (did you mean 'timeout_seconds'?)"),
    ({"providers": {"o": {"max_tokens_field": "max_token"}}},
     "providers.o.max_tokens_field: expected 'max_tokens' or 'max_completion_tokens', got 'max_token'"),
    ({"providers": {"o": {"type": "opnai"}}}, "providers.o.type: no provider type 'opnai' (did you mean 'openai'?)"),
    ({"pricing": {"discount": 2}}, "pricing.discount: expected a number in (0, 1], got 2"),
    ({"pricing": {"discount": "half"}}, "pricing.discount: expected a decimal number such as 1.5, got 'half'"),
    ({"moderation": {"rules": [{"category": "x", "patterns": ["("]}]}},
     "moderation.rules[0].patterns[0]: not a regular expression (missing ), unterminated subpattern at position 0)"),
    ({"moderation": {"provider": {"provider": "nope"}}}, "moderation.provider.provider: no provider named 'nope' "
                                                         "under providers"),
    ({"credits": {"purchase": {"max_usd": 5000}}}, "credits.purchase.max_usd: at most 1000 (the service's limit)"),
    ({"payments": {"x402": {"chains": [{"type": "evm", "network": "base"}]}}},
     "payments.x402.chains[0].network: expected a CAIP-2 network id such as eip155:8453, got 'base'"),
    ({"payments": {"x402": {"chains": [{"type": "evm", "network": "eip155:8453", "fee_payer": "x"}]}}},
     "payments.x402.chains[0].fee_payer: unknown key"),
    ({"media": {"artifacts": {"dri": "x"}}}, "media.artifacts.dri: unknown key (did you mean 'dir'?)"),
    ({"media": {"artifacts": {"ttl_seconds": 0}}}, "media.artifacts.ttl_seconds: must be more than 0, got 0"),
    (video(options={"duration_seconds": {"min": 2, "max": 8, "step": 2, "default": 3}}),
     "models.video[0].options.duration_seconds.default: 3 is not an allowed duration"),
    ({"plugins": ["missing_plugin.py"]}, "plugins[0]: no file {dir}/missing_plugin.py (a .py path is relative to "
                                         "the config file)"),
    ({"include": 5}, "include: expected a list of file names"),
    ({"providers": {"z": {"base_url": "x"}}}, "providers.z.type: required (the provider plugin, e.g. openai)"),
    ({"models": {"chat": [{"provider": "p", "list_input_usd_per_mtok": 1, "list_output_usd_per_mtok": 1}]}},
     "models.chat[0].id: required"),
    ({"models": {"chat": [BASE["models"]["chat"][0]] * 2}}, "models.chat[1].id: duplicate model id 'p/m'"),
    ({"models": {"chat": "p/m"}}, "models.chat: expected a list, got text"),
    (image(options={"aspect_ratio": [969]}), "models.image[0].options.aspect_ratio[0]: expected text, got 969 "
                                             "(quote values such as \"16:9\": YAML reads 16:9 as a number)"),
]


@pytest.mark.parametrize("extra,expected", CASES, ids=[c[1].split(":")[0] for c in CASES])
def test_a_broken_config_is_refused_before_start(tmp_path, monkeypatch, capsys, extra, expected):
    path = tmp_path / "gw.yaml"
    data = deep_merge(deep_merge(BASE, {"storage": f"sqlite:///{tmp_path / 'g.db'}"}), extra)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    started = []
    monkeypatch.setattr(gateway, "serve", lambda *a, **k: started.append(True))
    monkeypatch.setattr(gateway, "configure_logging", lambda *a, **k: None)
    assert gateway.main(["run", "--config", str(path), "--port", "0"]) == 2
    assert not started
    lines = [line.strip() for line in capsys.readouterr().err.splitlines()[1:]]
    assert lines == [f"{path}: {expected.format(dir=tmp_path)}"]


def test_the_base_of_the_table_is_valid(tmp_path, capsys):
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump({**BASE, "storage": f"sqlite:///{tmp_path / 'g.db'}"}))
    assert gateway.main(["check", "--config", str(path)]) == 0


def test_duplicate_keys_are_refused_with_their_lines(tmp_path, capsys):
    path = tmp_path / "gw.yaml"
    path.write_text("server:\n  port: 8080\n  port: 9090\nlimits: {}\nlimits: {per_key: {rpm: 5}}\n")
    assert gateway.main(["check", "--config", str(path)]) == 2
    assert capsys.readouterr().err.splitlines()[1:] == [
        f"  {path}: server.port: duplicate key (line 3; first at line 2): the later value would silently "
        "replace the first",
        f"  {path}: limits: duplicate key (line 5; first at line 4): the later value would silently replace the first"]


@pytest.mark.parametrize("command", ["run", "check"])
def test_the_real_command_exits_2_without_a_traceback(tmp_path, command):
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(deep_merge(BASE, {"limits": {"per_key": {"rpm": "many"}}, "sever": {}})))
    out = subprocess.run([sys.executable, str(ROOT / "gateway.py"), command, "--config", str(path), "--port", "0"]
                         if command == "run" else [sys.executable, str(ROOT / "gateway.py"), command, "--config",
                                                   str(path)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.splitlines()[1:] == [f"  {path}: sever: unknown section (did you mean 'server'?)",
                                           f"  {path}: limits.per_key.rpm: expected a whole number, got 'many'"]
