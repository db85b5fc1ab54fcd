"""The one-file build as a user gets it: `scripts/build-pyz` makes dist/gateway.pyz, which is
copied into an empty folder (the "other machine") and run there by the bare interpreter
(`-I -S`: no virtualenv, no site-packages, no source tree) with an environment reduced to
PATH and HOME. Through it: the CLI, `run` on the embedded default and on a config file, chat
calls with the official SDK, and the bill."""
from __future__ import annotations

import configparser
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import openai
import pytest
import yaml

from tests.gateway_process import free_port
from tests.test_container import build_context

ROOT = Path(__file__).resolve().parent.parent
# The interpreter the virtualenv was made from: it has the standard library and nothing else
# of ours (and -S keeps any site-packages it has out of the way).
BARE_PYTHON = str(Path(getattr(sys, "_base_executable", sys.executable)).resolve())

pytestmark = pytest.mark.timeout(300)      # the build, then the first start unpacks the archive


@pytest.fixture(scope="module")
def pyz(tmp_path_factory) -> Path:
    """Built once per module by the script a user runs, in a copy of the image's build context
    (what the Dockerfile copies, less .dockerignore): so the image's build stage has all it
    needs, and the source tree is left as it was."""
    context = tmp_path_factory.mktemp("context")
    for name in build_context():
        (context / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, context / name)
    built = subprocess.run([str(context / "scripts" / "build-pyz")], cwd=context, capture_output=True, text=True,
                           timeout=600, env={**os.environ, "PYTHON": sys.executable})
    assert built.returncode == 0, built.stderr[-3000:]
    return context / "dist" / "gateway.pyz"


@pytest.fixture(scope="module")
def machine(pyz, tmp_path_factory) -> Path:
    """An empty home folder holding only a copy of the archive."""
    home = tmp_path_factory.mktemp("machine")
    shutil.copy(pyz, home / "gateway.pyz")
    return home


def bare_env(home: Path, **extra: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), **extra}


def gateway(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    done = subprocess.run([BARE_PYTHON, "-I", "-S", "gateway.pyz", *args], cwd=home, env=bare_env(home, **env),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@contextlib.contextmanager
def serving(home: Path, *args: str, **env: str):
    """`gateway.pyz run ARGS --port P` until it answers; SIGTERM at the end must exit 0."""
    port = free_port()
    log = home / f"run-{port}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([BARE_PYTHON, "-I", "-S", "gateway.pyz", "run", *args, "--port", str(port)],
                                cwd=home, env=bare_env(home, **env), stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url + "/api/v1/models", timeout=2).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.1)
        yield url, log
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=45) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()


def account(url: str, key: str) -> dict:
    request = urllib.request.Request(url + "/api/v1/account", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def charge_micro(billing: dict, usage, model: dict) -> int:
    """The settled price of a call: billed tokens at the model's service prices, rounded up once."""
    return math.ceil(billing["input_tokens_billed"] * model["input_usd_per_mtok"]
                     + usage.completion_tokens * model["output_usd_per_mtok"])


def chat_model(url: str, model_id: str) -> dict:
    with urllib.request.urlopen(url + "/api/v1/chat/models", timeout=10) as response:
        return next(m for m in json.load(response)["models"] if m["id"] == model_id)


def test_the_pyz_serves_the_embedded_default_as_the_container_runs_it(machine):
    """As in the image: GATEWAY_HOST=0.0.0.0, the data in GATEWAY_HOME, two workers."""
    data = machine / "data"
    env = {"GATEWAY_HOST": "0.0.0.0", "GATEWAY_HOME": str(data)}
    key = gateway(machine, "keys", "create", "--credits", "5", **env).stdout.split()[-1]
    assert key.startswith("chk_")
    checked = gateway(machine, "check", **env).stdout
    assert "/.shiv/" in checked and f"sqlite:///{data / 'gateway.db'}" in checked    # the archive's own config

    with serving(machine, "--workers", "2", **env) as (url, log):
        client = openai.OpenAI(base_url=url + "/api/v1", api_key=key, max_retries=0)
        assert "demo/echo" in [m.id for m in client.models.list()]
        reply = client.chat.completions.create(model="demo/echo",
                                               messages=[{"role": "user", "content": "Hello from one file"}])
        assert "Hello from one file" in reply.choices[0].message.content
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
            model="demo/echo", stream=True, messages=[{"role": "user", "content": "Stream from one file"}])
            if chunk.choices)
        assert "Stream from one file" in streamed

        # demo/echo is in the default's free list: the daily allowance pays, the credits stay.
        billing = reply.billing
        assert billing["usd"] == 0 and billing["note"] == "free: covered by the daily allowance"
        expected = charge_micro(billing, reply.usage, chat_model(url, "demo/echo"))
        assert expected > 0 and round(billing["usage_usd"] * 1_000_000) == expected
        mine = account(url, key)
        assert mine["balance_usd"] == 5
        assert mine["free_allowance_left_usd"] < 0.05 - billing["usage_usd"]   # the streamed call too
        deadline = time.monotonic() + 60       # the second worker may still be starting: the first one answers
        while log.read_text().count('"serving"') < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
    started = log.read_text()
    assert '"host":"0.0.0.0"' in started.replace(" ", "") and started.count('"starting"') >= 2
    assert (data / "gateway.db").exists()


def test_the_pyz_runs_a_config_file_and_bills_credits(machine):
    site = machine / "site"
    site.mkdir()
    (site / "gw.yaml").write_text(yaml.safe_dump({
        "storage": "sqlite:///gw.db",          # relative to the config file's folder
        "providers": {"demo": {"type": "demo"}},
        "models": {"chat": [{"id": "acme/echo", "provider": "demo", "upstream": "demo-echo",
                             "list_input_usd_per_mtok": 3, "list_output_usd_per_mtok": 15}]}}))
    assert "OK (1 providers, 1 chat models" in gateway(machine, "check", "--config", "site/gw.yaml").stdout
    key = gateway(machine, "keys", "create", "--config", "site/gw.yaml", "--credits", "1").stdout.split()[-1]

    with serving(machine, "--config", "site/gw.yaml") as (url, _):
        client = openai.OpenAI(base_url=url + "/api/v1", api_key=key, max_retries=0)
        reply = client.chat.completions.create(model="acme/echo",
                                               messages=[{"role": "user", "content": "Bill me exactly"}])
        assert "Bill me exactly" in reply.choices[0].message.content
        charged = charge_micro(reply.billing, reply.usage, chat_model(url, "acme/echo"))
        assert charged > 0 and round(reply.billing["usd"] * 1_000_000) == charged
        assert round(account(url, key)["balance_usd"] * 1_000_000) == 1_000_000 - charged
    assert (site / "gw.db").exists()


def test_the_pyz_holds_every_file_the_packages_ship(pyz):
    """Every data file in the source packages (config, assets, the router model) is inside."""
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    packages = {name.strip().split(".")[0] for name in setup["options.packages.find"]["include"].split(",")}
    shipped = [path.relative_to(ROOT).as_posix() for package in sorted(packages)
               for path in (ROOT / package).rglob("*")
               if path.is_file() and path.suffix not in (".py", ".pyc")]
    inside = set(zipfile.ZipFile(pyz).namelist())
    assert {"config/gateway.yaml", "plugins/router_model.bin"} <= set(shipped)
    assert [name for name in shipped if f"site-packages/{name}" not in inside] == []
