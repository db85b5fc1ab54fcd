"""`redis:` in the YAML as an operator writes it: checked at load, a Redis that cannot be
reached stops start-up with a message (no traceback), and a Redis lost while running makes
limited calls fail closed. The shipped scale-out example config stays valid."""
import os
import subprocess

import yaml

from tests.cluster import GATEWAY, ROOT
from tests.servers import free_port


def run(*args, cwd, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([*GATEWAY, *args], capture_output=True, text=True, timeout=60, cwd=cwd,
                          env={**os.environ, **(env or {})})


def config(tmp_path, redis) -> str:
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump({"storage": f"sqlite:///{tmp_path / 'gw.db'}", "redis": redis,
                                    "providers": {"demo": {"type": "demo"}}}))
    return str(path)


def test_a_redis_url_that_is_not_one_is_refused_at_load(tmp_path):
    out = run("check", "--config", config(tmp_path, "http://cache:6379"), cwd=tmp_path)
    assert out.returncode == 2 and "redis: expected redis://host:port/db" in out.stderr


def test_an_unreachable_redis_stops_start_up_with_a_message(tmp_path):
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    out = run("run", "--config", config(tmp_path, url), "--port", str(free_port()), cwd=tmp_path)
    assert out.returncode == 1 and "gateway: redis: cannot reach redis://:***@127.0.0.1" in out.stderr
    assert "Traceback" not in out.stderr and "hunter2" not in out.stderr


def test_the_scale_out_example_config_is_valid(tmp_path):
    out = run("check", "--config", str(ROOT / "docs/examples/scale-out.yaml"), cwd=tmp_path,
              env={"POSTGRES_PASSWORD": "example"})
    assert out.returncode == 0, out.stderr


async def test_limits_fail_closed_with_503_while_redis_is_down(start_gateway, tmp_path):
    from tests.servers import RedisServer
    from tests.test_moderation_limits import HI, post
    redis = RedisServer(tmp_path)
    try:
        gw = await start_gateway({"redis": redis.url, "limits": {"per_key": {"rpm": 100}}})
        key, account = await gw.key(1)
        assert (await post(gw, "/api/v1/chat/completions", HI, key))[0] == 200
    finally:
        redis.stop()
    status, err, headers = await post(gw, "/api/v1/chat/completions", HI, key)
    assert status == 503 and err["error"]["code"] == "rate_limit_store_unavailable" and headers["Retry-After"] == "1"
    assert await gw.balance(account) == await gw.ledger_sum(account)        # refused before any hold
