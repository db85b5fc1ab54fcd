"""`redis:` in the YAML as an operator writes it: checked at load, and a Redis that cannot
be reached stops start-up with a message (no traceback). The shipped scale-out example
config stays valid."""
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
