"""The benchmark's own pieces work: the fake upstream answers JSON and SSE, the null proxy
relays both, and the stream client measures first byte and chunk gaps."""
import json
import sys
from pathlib import Path

import aiohttp
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import fake_upstream  # noqa: E402
import null_proxy  # noqa: E402
import stream_client  # noqa: E402


async def test_null_proxy_relays_the_fake_upstream(aiohttp_server):
    upstream = await aiohttp_server(fake_upstream.make_app(chunks=5, delay=0.01))
    proxy = await aiohttp_server(null_proxy.make_app(str(upstream.make_url("/v1/chat/completions"))))
    url = str(proxy.make_url("/api/v1/chat/completions"))
    async with aiohttp.ClientSession() as s:
        async with s.post(url, json={"model": "m", "messages": []}) as r:
            body = await r.json()
            assert body["usage"]["completion_tokens"] == 8
    stats = await stream_client.run(url, json.dumps({"model": "m", "stream": True}), "", 2, 0.3)
    assert stats["requests"] >= 2 and stats["errors"] == 0
    assert 8 <= stats["gap_p50_ms"] <= 30           # 10 ms between chunks: relayed as they come
    assert stats["ttfb_p50_ms"] < stats["total_p50_ms"]


def test_instruction_counts_repeat(tmp_path):
    """bench/instructions.py's measure is only useful if it repeats: two counts of the null
    proxy, over different numbers of calls, agree per call to within a few percent."""
    import shutil

    from tests.servers import unavailable

    if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
        unavailable("valgrind", "valgrind")
    import subprocess

    import instructions

    up = instructions.free_port()
    upstream = subprocess.Popen([sys.executable, str(instructions.HERE / "fake_upstream.py"), "--port", str(up)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        instructions.wait_ready(f"http://127.0.0.1:{up}/v1/chat/completions", b"{}")
        counts = []
        for calls in (40, 80):
            port = instructions.free_port()
            counts.append(instructions.counted(
                [sys.executable, str(instructions.HERE / "null_proxy.py"), "--port", str(port), "--upstream",
                 f"http://127.0.0.1:{up}/v1/chat/completions"], f"http://127.0.0.1:{port}/api/v1/chat/completions",
                f"http://127.0.0.1:{port}/api/v1/chat/completions", instructions.BODIES["chat"], "", calls, 4,
                tmp_path))
    finally:
        upstream.terminate()
    assert counts[0] > 100_000                      # a relayed call is hundreds of thousands of instructions
    assert abs(counts[0] - counts[1]) / counts[1] < 0.05, counts


def test_instruction_counts_pass_the_log_level_to_the_gateway(tmp_path):
    """`bench/instructions.py --log-level warning` counts the gateway without its per-call
    line: the level reaches `gateway run` as its own option (the default stays info)."""
    import gateway
    import instructions
    from plugins import get_plugin_manager

    parser = gateway.build_parser(get_plugin_manager())
    for argv, level in (([], "info"), (["--log-level", "warning"], "warning")):
        cmd = instructions.gateway_command(tmp_path / "gw.yaml", 8123, instructions.parse_args(argv).log_level)
        assert cmd[:2] == [instructions.PY, str(instructions.ROOT / "gateway.py")]
        run = parser.parse_args(cmd[2:])
        assert (run.command, run.config, run.port, run.log_level) == ("run", str(tmp_path / "gw.yaml"), 8123, level)


def test_the_runner_reports_the_median_of_ratios_taken_round_by_round():
    """The machine slows between rounds (both sides alike): each round's ratio is steady though the
    absolute figures move, and the median round of each side is reported as it was measured."""
    import run

    def result(cpu_ms: float, rps: float, p50_us: int) -> dict:
        return {"cpu_ms": cpu_ms, "rps": rps, "p50_us": p50_us}

    pairs = [(result(0.30, 3000, 900), result(0.20, 5000, 500)),     # subject, reference: 1.5x
             (result(0.60, 1500, 1900), result(0.40, 2500, 1000)),   # both twice as slow: 1.5x again
             (result(0.44, 2000, 1200), result(0.20, 5000, 600))]    # a bad round for the subject: 2.2x
    out = run.summarise(pairs)
    assert out["cpu_ratio"] == pytest.approx(1.5)
    assert out["cpu_range"] == pytest.approx((1.5, 2.2))
    assert out["rps_ratio"] == pytest.approx(0.6)
    assert out["p50_added_us"] == 600
    assert out["subject"]["cpu_ms"] == 0.44 and out["reference"]["cpu_ms"] == 0.20
