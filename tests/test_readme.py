"""The README runs as written: its shell and Python examples run, in order, against a live
demo gateway (a real `gateway run` on the embedded default), so they cannot drift.

The only change made to them is the port (a free one instead of 8080). A block that cannot
run here says so on the line before it: `<!-- readme-test: skip (why) -->`."""
import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_operator_cli import Server, run

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^(<!-- readme-test: skip \((?P<why>[^)]+)\) -->\n)?```(?P<lang>\w*)\n(?P<code>.*?)^```$",
                   re.M | re.S)
SKIPPED_ON_PURPOSE = {"the set-up commands: this suite is what they run",
                      "needs network access to GitHub",
                      "needs a funded wallet and an x402 facilitator",
                      "installs a system package and runs for minutes",
                      "needs a container engine",
                      "builds the one-file binary: tests/test_pyz.py builds and runs it",
                      "runs for minutes under valgrind: tests/test_bench.py runs a short count"}


def blocks() -> list[tuple[str, str, str | None]]:
    return [(m["lang"], m["code"], m["why"]) for m in FENCE.finditer((ROOT / "README.md").read_text())]


def test_only_the_known_blocks_are_skipped():
    skipped = {why for _, _, why in blocks() if why}
    assert skipped <= SKIPPED_ON_PURPOSE, skipped
    assert len([1 for lang, _, why in blocks() if lang in ("sh", "python") and not why]) >= 9


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    work = tmp_path_factory.mktemp("work")
    (work / ".venv").symlink_to(sys.prefix)            # the README's commands say .venv/bin/gateway
    env = {"GATEWAY_HOME": str(home), "GATEWAY_DB": "", "GATEWAY_ARTIFACTS": "", "GATEWAY_PUBLIC_URL": ""}
    server = Server(cwd=work, env=env)
    yield server, work, env
    server.stop()


def local(code: str, port: int) -> str:
    return code.replace("127.0.0.1:8080", f"127.0.0.1:{port}")


def test_readme_shell_then_python_examples_work_verbatim(demo):
    server, work, env = demo
    shell = [code for lang, code, why in blocks() if lang == "sh" and not why]
    script = ["set -euo pipefail", 'curl() { command curl --fail-with-body -sS "$@"; }']
    for i, code in enumerate(shell):
        script += [f"echo '--- README shell block {i}' >&2", local(code, server.port)]
    script.append('echo "KEY_FOR_PYTHON=$KEY"')
    out = subprocess.run(["bash", "-c", "\n".join(script)], cwd=work, capture_output=True, text=True,
                         timeout=120, env={**os.environ, **env})
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-2000:]
    key = out.stdout.rsplit("KEY_FOR_PYTHON=", 1)[1].strip()
    assert key.startswith("chk_")

    namespace: dict = {}
    old = os.environ.get("KEY")
    os.environ["KEY"] = key
    try:
        for i, (lang, code, why) in enumerate(blocks()):
            if lang != "python" or why:
                continue
            with contextlib.redirect_stdout(io.StringIO()):
                try:
                    exec(compile(local(code, server.port), f"README python block {i}", "exec"), namespace)
                except Exception as exc:
                    pytest.fail(f"README python block {i} failed: {exc!r}\n{code}")
    finally:
        if old is None:
            os.environ.pop("KEY", None)
        else:
            os.environ["KEY"] = old
    assert run("check", cwd=work, env=env).returncode == 0
