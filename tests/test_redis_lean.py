"""The lean Redis client the rate-limit script runs through (plugins/redis_lean.py), against a
real redis-server: replies of every kind read as redis-py reads them, hundreds of concurrent
calls pipelined over one connection each get their own answer, a script Redis forgot is sent
whole, and the client connects again after the connection drops, times out on a Redis that
stopped answering, and signs in and selects the database the URL names."""
import asyncio
import os
import signal
from urllib.parse import quote

import pytest
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection as RedisPyConnection
from redis.exceptions import AuthenticationError, NoScriptError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from plugins.errors import GatewayError
from plugins.limitstores import Bucket, RedisLimits
from plugins.ratelimit import LIMITS
from plugins.redis_lean import Incomplete, LeanRedis, Script, command, parse
from tests import servers
from tests.test_moderation_limits import HI, post


@pytest.fixture
async def lean(redis_url):
    client = LeanRedis(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def plain(redis_url):
    """redis-py, to compare with and to look at the server."""
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def connections_made(plain) -> int:
    """How many connections Redis has accepted so far."""
    return (await plain.info("stats"))["total_connections_received"]


async def our_connection(lean, plain) -> dict:
    """The lean client's connection as Redis lists it."""
    host, port = lean._conn.transport.get_extra_info("sockname")[:2]
    return next(c for c in await plain.client_list() if c["addr"] == f"{host}:{port}")


# ---- replies -----------------------------------------------------------------------------

BINARY = bytes(range(256)) + b"\r\n$3\r\n*1\r\n"
REPLIES = {
    "integer": "return 42",
    "negative integer": "return -7",
    "bulk string": "return 'twelve'",
    "empty string": "return ''",
    "binary string": "return ARGV[1]",
    "large string": "return string.rep('x', 300000)",      # arrives over many reads
    "nil": "return nil",
    "false is nil": "return false",
    "true is 1": "return true",
    "status": "return redis.status_reply('FINE')",
    "array": "return {'0', '199.000000', '0.000000'}",
    "empty array": "return {}",
    "nested arrays": "return {1, {2, {'three', {}}}, 'four'}",
    "float truncated": "return 3.99",
    "a redis call's reply": "return redis.call('TIME')",
    "an error inside an array": "return {1, redis.error_reply('inner trouble'), 3}",
}


@pytest.mark.parametrize("name", REPLIES)
async def test_every_kind_of_reply_reads_as_redis_py_reads_it(name, lean, plain):
    source = REPLIES[name]
    ours = await lean.register_script(source)(keys=["k"], args=[BINARY])
    theirs = await plain.register_script(source)(keys=["k"], args=[BINARY])
    if name == "a redis call's reply":                  # the time moved on between the two
        assert [type(v) for v in ours] == [type(v) for v in theirs] == [bytes, bytes]
    elif name == "an error inside an array":            # returned in place, not raised, as redis-py does
        assert ours[0] == 1 and ours[2] == 3 and isinstance(ours[1], ResponseError)
        assert str(ours[1]) == str(theirs[1]) == "inner trouble"
    else:
        assert ours == theirs
        assert type(ours) is type(theirs)


async def test_an_error_reply_is_raised_as_redis_py_raises_it(lean, plain):
    await plain.set("not-a-number", "abc")
    for source in ["return redis.error_reply('ERR told to fail')", "return redis.call('INCR', KEYS[1])",
                   "return redis.error_reply('CUSTOM code of its own')"]:
        with pytest.raises(ResponseError) as ours:
            await lean.register_script(source)(keys=["not-a-number"], args=[])
        with pytest.raises(ResponseError) as theirs:
            await plain.register_script(source)(keys=["not-a-number"], args=[])
        assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)
    assert await lean.execute("PING") == b"PONG"       # the connection carries on


def test_replies_split_anywhere_are_read_whole():
    reply = b"*3\r\n$1\r\n0\r\n:-12\r\n*2\r\n$-1\r\n+OK\r\n"
    assert parse(reply, 0) == ([b"0", -12, [None, b"OK"]], len(reply))
    for cut in range(1, len(reply)):
        with pytest.raises(Incomplete):
            parse(reply[:cut], 0)


def test_arguments_go_out_as_redis_py_sends_them():
    args = ("EVALSHA", b"\x00\r\n", 2, 0.5, 1000.0, "\u00e9t\u00e9", 10 ** 20, -3, "")
    assert command(*args) == b"".join(RedisPyConnection().pack_command(*args))
    assert command("ECHO", 1.5) == b"*2\r\n$4\r\nECHO\r\n$3\r\n1.5\r\n"
    with pytest.raises(Exception, match="bool"):
        command("SET", "k", True)


async def test_the_take_script_answers_the_same_through_either_client(lean, plain):
    ours, theirs = RedisLimits(lean), RedisLimits(plain)
    assert isinstance(ours._script, Script)
    for store, key in [(ours, "gw:rl:{key:a}:"), (theirs, "gw:rl:{key:b}:")]:
        got = await store.take([Bucket(key + "rpm", 1, 2, window=True), Bucket(key + "tpm", 700, 1000)])
        assert got.refused is None and got.left[0] == 1 and 299 <= got.left[1] <= 301
        got = await store.take([Bucket(key + "rpm", 1, 2, window=True), Bucket(key + "tpm", 700, 1000)])
        assert got.refused == 1 and got.left[0] == 1 and 299 <= got.left[1] <= 301 and 23 < got.wait < 25
        await store.close()


# ---- pipelining --------------------------------------------------------------------------

async def test_hundreds_of_concurrent_calls_share_one_connection_and_each_gets_its_own_answer(lean, plain):
    echo = lean.register_script("redis.call('INCR', KEYS[1]); return {ARGV[1], #ARGV[2]}")
    calls, before = 800, await connections_made(plain)
    answers = await asyncio.gather(*[echo(keys=["count"], args=[f"caller {i}", "y" * (i * 37 % 5000)])
                                     for i in range(calls)])
    assert answers == [[f"caller {i}".encode(), i * 37 % 5000] for i in range(calls)]
    assert int(await plain.get("count")) == calls
    assert await connections_made(plain) - before == 1


async def test_a_cancelled_caller_leaves_the_others_answers_in_place(lean):
    slow = lean.register_script("local t = redis.call('TIME'); local stop = t[1] * 1e6 + t[2] + 200000 "
                                "repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] >= stop return 'slow'")
    first = asyncio.ensure_future(slow())
    await asyncio.sleep(0.05)
    echoes = [asyncio.ensure_future(lean.execute("ECHO", i)) for i in range(5)]
    await asyncio.sleep(0)
    echoes[2].cancel()
    assert await first == b"slow"
    assert [await e for i, e in enumerate(echoes) if i != 2] == [b"0", b"1", b"3", b"4"]
    assert await lean.execute("ECHO", "after") == b"after"


# ---- scripts Redis forgot ----------------------------------------------------------------

async def test_a_script_redis_forgot_is_sent_whole_and_runs_once(lean, plain):
    await plain.script_flush()
    await plain.config_resetstat()
    count = lean.register_script("return redis.call('INCR', KEYS[1])")
    assert await count(keys=["n"]) == 1                 # Redis never saw it: NOSCRIPT, then EVAL
    assert await count(keys=["n"]) == 2                 # EVAL cached it
    await plain.script_flush()
    assert await asyncio.gather(*[count(keys=["n"]) for _ in range(50)]) == list(range(3, 53))
    stats = await plain.info("commandstats")
    assert stats["cmdstat_eval"]["calls"] == 1 + 50      # every caller of the flushed script, once each
    assert stats["cmdstat_evalsha"]["calls"] == 1 + 1 + 50
    assert int(await plain.get("n")) == 52


async def test_noscript_reaches_a_caller_only_through_eval_failing_too(lean):
    with pytest.raises(ResponseError, match="compiling"):          # the EVAL's error, not NoScriptError
        await lean.register_script("return (")()
    with pytest.raises(NoScriptError):
        await lean.execute("EVALSHA", "0" * 40, 0)


# ---- dropped connections, restarts, timeouts ---------------------------------------------

async def test_it_connects_again_after_its_connection_is_killed(lean, plain):
    before = await connections_made(plain)
    assert await lean.execute("PING") == b"PONG"
    for _ in range(2):
        assert await plain.client_kill((await our_connection(lean, plain))["addr"])
        await asyncio.sleep(0.1)                           # the close reaches the client
        assert await lean.execute("ECHO", "again") == b"again"
    assert await connections_made(plain) - before == 3


@pytest.fixture
def private_redis(tmp_path, monkeypatch):
    """A Redis of this test's own, to stop, freeze and restart: -> start(), which starts one
    on the same port each time."""
    started = []

    def start() -> servers.RedisServer:
        if started:
            monkeypatch.setattr(servers, "free_port", lambda: started[0].port)
        folder = tmp_path / str(len(started))
        folder.mkdir()
        started.append(servers.RedisServer(folder))
        return started[-1]

    yield start
    for server in started:
        if server.proc.poll() is None:
            os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()


async def test_calls_fail_while_redis_is_down_and_work_once_it_is_back(private_redis):
    server = private_redis()
    lean = LeanRedis(server.url)
    count = lean.register_script("return redis.call('INCR', KEYS[1])")
    assert await count(keys=["n"]) == 1
    server.stop()
    for _ in range(2):
        with pytest.raises(RedisConnectionError):
            await count(keys=["n"])
    private_redis()                                        # empty again: the script is unknown
    assert await count(keys=["n"]) == 1
    await lean.aclose()


async def test_the_store_answers_503_while_redis_is_down(private_redis):
    """The store fails as it did with redis-py: 503, and the credits it carried stay owed."""
    server = private_redis()
    lean = LeanRedis(server.url)
    store = RedisLimits(lean)
    key = "gw:rl:{key:down}:tpm"
    assert (await store.take([Bucket(key, 800, 1000)])).refused is None
    await store.give_back(Bucket(key, 500, 1000))
    server.stop()
    with pytest.raises(GatewayError) as refused:
        await store.take([Bucket(key, 100, 1000)])
    assert refused.value.status == 503 and refused.value.code == "rate_limit_store_unavailable"
    assert store._owed[key].sent == 500
    private_redis()
    got = await store.take([Bucket(key, 100, 1000)])       # a fresh Redis: full, plus nothing above capacity
    assert got.refused is None and 899 <= got.left[0] <= 901 and not store._owed
    await store.close()
    await lean.aclose()


async def test_a_redis_that_stops_answering_times_out_every_waiting_call_then_recovers(private_redis):
    server = private_redis()
    lean = LeanRedis(server.url, timeout=0.5)
    assert await lean.execute("PING") == b"PONG"
    os.kill(server.proc.pid, signal.SIGSTOP)
    started = asyncio.get_running_loop().time()
    waiting = await asyncio.gather(*[lean.execute("ECHO", i) for i in range(10)], return_exceptions=True)
    assert all(isinstance(e, RedisTimeoutError) for e in waiting)
    assert 0.4 < asyncio.get_running_loop().time() - started < 2
    os.kill(server.proc.pid, signal.SIGCONT)
    assert await lean.execute("ECHO", "awake") == b"awake"      # on a new connection
    await lean.aclose()


async def test_a_connection_dropped_with_calls_under_way_fails_them_all(private_redis):
    server = private_redis()
    lean = LeanRedis(server.url)
    assert await lean.execute("PING") == b"PONG"
    os.kill(server.proc.pid, signal.SIGSTOP)
    waiting = [asyncio.ensure_future(lean.execute("ECHO", i)) for i in range(10)]
    await asyncio.sleep(0.1)
    server.proc.kill()
    server.proc.wait()
    got = await asyncio.gather(*waiting, return_exceptions=True)
    assert all(isinstance(e, RedisConnectionError) for e in got)
    private_redis()
    assert await lean.execute("ECHO", "back") == b"back"
    await lean.aclose()


async def test_an_unreachable_redis_is_a_connection_error():
    lean = LeanRedis(f"redis://127.0.0.1:{servers.free_port()}/0")
    with pytest.raises(RedisConnectionError, match="Error connecting to 127.0.0.1"):
        await lean.execute("PING")
    await lean.aclose()


# ---- the URL -----------------------------------------------------------------------------

@pytest.fixture
async def user(plain):
    """An ACL user whose password needs quoting in a URL."""
    password = "p@ss:w/rd %"
    await plain.acl_setuser("lean", enabled=True, passwords=["+" + password], keys=["*"], commands=["+@all"])
    yield "lean", password
    await plain.acl_deluser("lean")


async def test_it_signs_in_and_selects_the_database_the_url_names(redis_server, user, plain):
    name, password = user
    url = f"redis://{name}:{quote(password, safe='')}@127.0.0.1:{redis_server.port}/3"
    lean = LeanRedis(url)
    assert await lean.execute("SET", "where", "db 3") == b"OK"
    listed = await our_connection(lean, plain)
    assert (listed["user"], listed["db"]) == ("lean", "3")
    assert await plain.get("where") is None
    await lean.aclose()
    other = aioredis.Redis.from_url(url)
    assert await other.get("where") == b"db 3"
    await other.aclose()


async def test_a_wrong_password_is_an_authentication_error(redis_server, user):
    lean = LeanRedis(f"redis://lean:wrong@127.0.0.1:{redis_server.port}/0")
    for _ in range(2):                        # and it does not keep the connection it could not sign in on
        with pytest.raises(AuthenticationError):
            await lean.execute("PING")
    await lean.aclose()


def test_tls_and_url_options_are_left_to_redis_py():
    assert LeanRedis.serves("redis://h:6379/0") and LeanRedis.serves("redis://u:p@h")
    assert not LeanRedis.serves("rediss://h:6379/0")
    assert not LeanRedis.serves("redis://h:6379/0?socket_timeout=3")
    assert not LeanRedis.serves("redis://h:6379/zero")


# ---- in the gateway ----------------------------------------------------------------------

async def test_the_gateway_takes_its_rate_limits_through_the_lean_client(start_gateway, redis_url, plain):
    gw = await start_gateway({"redis": redis_url, "limits": {"per_key": {"rpm": 100}}})
    store = gw.app[LIMITS].store
    assert isinstance(store._script, Script)
    key, _ = await gw.key(1)
    assert (await post(gw, "/api/v1/chat/completions", HI, key))[0] == 200
    assert len(await plain.keys("gw:rl:*:rpm")) == 1


async def test_a_url_with_options_runs_the_script_through_redis_py(start_gateway, redis_url):
    gw = await start_gateway({"redis": redis_url + "?socket_timeout=5", "limits": {"per_key": {"rpm": 100}}})
    assert not isinstance(gw.app[LIMITS].store._script, Script)
    key, _ = await gw.key(1)
    assert (await post(gw, "/api/v1/chat/completions", HI, key))[0] == 200
