"""An operator's everyday mistakes get one line and exit 2 (never a traceback), and the CLI
commands and the server always meet the same database, wherever they are run from."""
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import openai
import pytest
import yaml

from tests.test_cli import GATEWAY, free_port


def run(*args, cwd, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([*GATEWAY, *args], capture_output=True, text=True, timeout=60, cwd=cwd,
                          env={**os.environ, **(env or {})})


class Server:
    """`gateway run` as a subprocess on a free port, until stopped with SIGTERM."""

    def __init__(self, *args, cwd, env=None):
        self.port = free_port()
        self.proc = subprocess.Popen([*GATEWAY, "run", "--port", str(self.port), *args], cwd=cwd, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env={**os.environ, **(env or {})})
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            self.log += line
            if '"starting"' in line or "starting" in line.split():
                break
        with socket.socket() as probe:       # ready when the port accepts
            for _ in range(300):
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    break
                time.sleep(0.05)

    def client(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/api/v1", api_key=key, max_retries=0)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)


def one_line_exit_2(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    return out.stderr


def test_port_in_use_is_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = run("run", "--port", str(port), cwd=tmp_path, env={"GATEWAY_HOME": str(tmp_path)})
    err = one_line_exit_2(out)
    assert f"gateway: cannot listen on 127.0.0.1:{port}: " in err and "choose another port with --port" in err


def test_a_missing_plugin_file_is_one_line(tmp_path):
    (tmp_path / "gw.yaml").write_text("plugins: [plugins/mine.py]\n")
    err = one_line_exit_2(run("run", "--config", "gw.yaml", cwd=tmp_path))
    assert f"plugins[0]: no file {tmp_path / 'plugins' / 'mine.py'} (a .py path is relative to the config file)" in err


def test_a_misspelled_hook_is_one_line_with_the_right_name(tmp_path):
    (tmp_path / "mine.py").write_text("from plugins import hookimpl\n\n\n@hookimpl\ndef gateway_athenticate(ctx):\n"
                                      "    return None\n")
    (tmp_path / "gw.yaml").write_text("plugins: [mine.py]\n")
    for command in ("run", "check"):
        err = one_line_exit_2(run(command, "--config", "gw.yaml", cwd=tmp_path))
        assert "gateway_athenticate is not a hook (did you mean 'gateway_authenticate'?)" in err


def test_an_unknown_log_level_is_refused(tmp_path):
    err = one_line_exit_2(run("run", "--log-level", "loud", cwd=tmp_path))
    assert "invalid choice: 'loud'" in err


def test_cli_and_server_meet_the_database_next_to_the_config(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "elsewhere").mkdir()
    config = tmp_path / "site" / "gw.yaml"
    config.write_text(yaml.safe_dump({"storage": "sqlite:///gateway.db", "providers": {"demo": {"type": "demo"}},
                                      "models": {"chat": [{"id": "demo/echo", "provider": "demo",
                                                           "list_input_usd_per_mtok": 1,
                                                           "list_output_usd_per_mtok": 2}]}}))
    made = run("keys", "create", "--config", str(config), "--credits", "1", cwd=tmp_path / "elsewhere")
    key = made.stdout.split()[-1]
    assert (tmp_path / "site" / "gateway.db").exists() and not (tmp_path / "elsewhere" / "gateway.db").exists()
    server = Server("--config", "site/gw.yaml", cwd=tmp_path)
    try:
        account = server.client(key).get("/account", cast_to=dict)
        assert account["balance_usd"] == 1
        assert str(tmp_path / "site" / "gateway.db") in server.log
    finally:
        server.stop()


def test_the_embedded_default_keeps_one_database_per_user(tmp_path):
    home, a, b = tmp_path / "home", tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    env = {"GATEWAY_HOME": str(home), "GATEWAY_DB": "", "GATEWAY_ARTIFACTS": "", "GATEWAY_PUBLIC_URL": ""}
    key = run("keys", "create", "--credits", "1", cwd=a, env=env).stdout.split()[-1]
    server = Server(cwd=b, env=env)
    try:
        assert server.client(key).get("/account", cast_to=dict)["balance_usd"] == 1
        assert str(home / "gateway.db") in server.log
        assert not list(a.iterdir()) and not list(b.iterdir())      # nothing written where it was run
    finally:
        server.stop()


@pytest.mark.parametrize("public_url,expected", [(None, "http://127.0.0.1:{port}/"),
                                                 ("https://gw.example", "https://gw.example/")])
def test_links_follow_the_port_unless_public_url_is_set(tmp_path, public_url, expected):
    env = {"GATEWAY_HOME": str(tmp_path), "GATEWAY_PUBLIC_URL": public_url or ""}
    key = run("keys", "create", "--credits", "1", cwd=tmp_path, env=env).stdout.split()[-1]
    server = Server(cwd=tmp_path, env=env)
    try:
        image = server.client(key).images.generate(model="demo/image", prompt="a red circle", response_format="url")
        assert image.data[0].url.startswith(expected.format(port=server.port))
        assert Path(tmp_path / "artifacts").is_dir()               # files live next to the database
    finally:
        server.stop()
