"""Format C (responses) end to end with the official openai SDK's `client.responses`,
translated to chat-completions, Anthropic and demo upstreams; real event streams."""
import asyncio
import json

import aiohttp
import openai
import pytest

from tests.conftest import DEMO_MODELS, MICRO, UPSTREAM_PRICES, anthropic_upstream, openai_upstream
from tests.conftest import upstream_cost as cost
from tests.fakes import Reply, ToolCallSpec

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather for a city", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                          "additionalProperties": False}}



@pytest.fixture
async def setup(start_gateway, fake_anthropic, fake_openai):
    providers = {**anthropic_upstream(fake_anthropic)["providers"], **openai_upstream(fake_openai)["providers"]}
    cfg = {"providers": providers, "models": {"chat": DEMO_MODELS + [
            {"id": "up/claude", "provider": "up-anthropic", "upstream": "claude-sonnet-4-5", **UPSTREAM_PRICES},
            {"id": "up/gpt", "provider": "up-openai", "upstream": "gpt-4o-mini", **UPSTREAM_PRICES}]}}
    gw = await start_gateway(cfg)
    key, account = await gw.key(1)
    return gw, fake_anthropic, fake_openai, gw.openai(key), account


async def collect(stream) -> list:
    return [event async for event in stream]


def check_sequence(events) -> None:
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[1].type == "response.in_progress"


@pytest.mark.parametrize("model", ["up/gpt", "up/claude"])
async def test_text_answer_with_instructions(setup, model):
    gw, fa, fo, client, account = setup
    (fo if model == "up/gpt" else fa).enqueue(Reply(text="Bonjour.", input_tokens=20, output_tokens=3))
    resp = await client.responses.create(model=model, instructions="French only.", input="Say hello",
                                         max_output_tokens=64)
    assert resp.status == "completed" and resp.output_text == "Bonjour." and resp.model == model
    assert (resp.usage.input_tokens, resp.usage.output_tokens, resp.usage.total_tokens) == (20, 3, 23)
    sent = (fo if model == "up/gpt" else fa).requests[-1]
    assert sent.rejected is None
    if model == "up/gpt":
        assert sent.body["messages"] == [{"role": "system", "content": "French only."},
                                         {"role": "user", "content": "Say hello"}]
        assert sent.body["max_tokens"] == 64
    else:
        assert sent.body["system"] == [{"type": "text", "text": "French only."}]
    # "French only." + "Say hello" = 21 characters -> 6 tokens estimated
    assert await gw.balance(account) == MICRO - cost(6, 3)


@pytest.mark.parametrize("model", ["up/gpt", "up/claude"])
async def test_streamed_parallel_function_calls(setup, model):
    gw, fa, fo, client, _ = setup
    (fo if model == "up/gpt" else fa).enqueue(Reply(text="Checking.", tool_calls=[
        ToolCallSpec("get_weather", '{"city":"Paris"}'), ToolCallSpec("get_weather", '{"city":"Oslo"}')]))
    events = await collect(await client.responses.create(model=model, input="Paris and Oslo?", tools=[WEATHER],
                                                         stream=True))
    check_sequence(events)
    types = [e.type for e in events]
    assert types[-1] == "response.completed"
    assert types.count("response.output_text.delta") >= 1 and types.count("response.function_call_arguments.done") == 2
    final = events[-1].response
    kinds = [item.type for item in final.output]
    assert kinds == ["message", "function_call", "function_call"]
    assert [json.loads(i.arguments) for i in final.output[1:]] == [{"city": "Paris"}, {"city": "Oslo"}]
    assert final.output[1].call_id != final.output[2].call_id
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert {e.output_index for e in deltas} == {1, 2}
    assert final.usage.output_tokens == 7


@pytest.mark.parametrize("model", ["up/gpt", "up/claude"])
async def test_function_call_round_trip(setup, model):
    gw, fa, fo, client, _ = setup
    fake = fo if model == "up/gpt" else fa
    fake.enqueue(Reply(text="", tool_calls=[ToolCallSpec("get_weather", '{"city":"Paris"}'),
                                            ToolCallSpec("get_weather", '{"city":"Oslo"}')]),
                 Reply(text="Paris 14C, Oslo 3C."))
    items = [{"role": "user", "content": "Paris and Oslo?"}]
    first = await client.responses.create(model=model, input=items, tools=[WEATHER], tool_choice="required")
    calls = [i for i in first.output if i.type == "function_call"]
    assert len(calls) == 2 and first.status == "completed"
    items += [c.model_dump(exclude_none=True) for c in calls]
    items += [{"type": "function_call_output", "call_id": c.call_id, "output": out} for c, out in zip(calls, ["14C", "3C"])]
    second = await client.responses.create(model=model, input=items, tools=[WEATHER])
    assert second.output_text == "Paris 14C, Oslo 3C."
    assert fake.requests[-1].rejected is None


async def test_custom_tools_through_anthropic(setup):
    gw, fa, _, client, _ = setup
    fa.enqueue(Reply(text="", tool_calls=[ToolCallSpec("run_sql", '{"input":"SELECT 1"}')]))
    tools = [{"type": "custom", "name": "run_sql", "description": "Run SQL"}]
    events = await collect(await client.responses.create(model="up/claude", input="count", tools=tools, stream=True))
    final = events[-1].response
    assert final.output[0].type == "custom_tool_call" and final.output[0].input == "SELECT 1"
    assert fa.requests[-1].body["tools"][0]["input_schema"]["properties"] == {"input": {"type": "string"}}
    fa.enqueue(Reply(text="1 row"))
    follow = await client.responses.create(model="up/claude", tools=tools, input=[
        {"role": "user", "content": "count"}, final.output[0].model_dump(exclude_none=True),
        {"type": "custom_tool_call_output", "call_id": final.output[0].call_id, "output": "1"}])
    assert follow.output_text == "1 row" and fa.requests[-1].rejected is None


async def test_hit_the_cap_is_incomplete(setup):
    gw, _, fo, client, _ = setup
    fo.enqueue(Reply(text="cut", stop="max_tokens"), Reply(text="cut", stop="max_tokens"))
    resp = await client.responses.create(model="up/gpt", input="long", max_output_tokens=16)
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    events = await collect(await client.responses.create(model="up/gpt", input="long", max_output_tokens=16,
                                                         stream=True))
    assert events[-1].type == "response.incomplete"


async def test_skipped_items_and_ignored_hosted_tools(setup):
    gw, _, fo, client, _ = setup
    await client.responses.create(model="up/gpt", tools=[{"type": "web_search"}, WEATHER], input=[
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "input_text", "text": "hi"},
                                     {"type": "input_image", "image_url": "https://example.com/a.png"}]}])
    body = fo.requests[-1].body
    assert [t["function"]["name"] for t in body["tools"]] == ["get_weather"]
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert body["messages"][1]["content"][1] == {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}


async def test_stored_state_is_refused(setup):
    gw, _, fo, client, account = setup
    for extra in ({"previous_response_id": "resp_1"}, {"conversation": "conv_1"}):
        with pytest.raises(openai.BadRequestError) as info:
            await client.responses.create(model="up/gpt", input="hi", **extra)
        assert "send the whole conversation in input" in info.value.message
    assert fo.requests == [] and await gw.balance(account) == MICRO


async def test_failure_mid_stream_is_error_then_failed(setup):
    """As the real API does: a typed `error` event, then `response.failed`; never a silent stop."""
    gw, _, fo, client, account = setup
    fo.enqueue(Reply(text="a b c d e", text_chunks=5, fail_after_events=2))
    events = await collect(await client.responses.create(model="up/gpt", input="hi", stream=True))
    check_sequence(events)
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    assert "failed mid-stream" in events[-2].message
    assert events[-1].response.status == "failed" and "failed mid-stream" in events[-1].response.error.message
    assert "response.completed" not in [e.type for e in events]
    assert await gw.balance(account) == MICRO


async def test_demo_and_the_stream_helper(setup):
    gw, _, _, client, _ = setup
    async with client.responses.stream(model="demo/echo", input="stream me") as stream:
        final = await stream.get_final_response()
    assert "You said: stream me" in final.output_text and final.status == "completed"


async def raw_post(gw, headers, body):
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{gw.url}/api/v1/responses", headers=headers, json=body) as r:
            return r.status, await r.json()


async def test_key_required_402_413(setup):
    gw, _, _, _, _ = setup
    status, err = await raw_post(gw, {}, {"model": "demo/echo", "input": "hi"})
    assert status == 401 and err["error"]["code"] == "missing_api_key"
    key, _ = await gw.key(0)
    status, err = await raw_post(gw, {"x-api-key": key}, {"model": "demo/echo", "input": "hi"})
    assert status == 402 and "max_tokens 32768" in err["error"]["message"]
    status, err = await raw_post(gw, {"x-api-key": key}, {"model": "demo/echo", "input": "x" * 800_001})
    assert status == 413


async def test_dropped_stream_charges_what_was_relayed(setup):
    gw, _, fo, _, _ = setup
    key, account = await gw.key(1)
    fo.enqueue(Reply(text="word " * 100, text_chunks=100, chunk_delay=0.02, output_tokens=100))
    async with aiohttp.ClientSession() as s:
        resp = await s.post(f"{gw.url}/api/v1/responses", headers={"Authorization": f"Bearer {key}"},
                            json={"model": "up/gpt", "input": "hi", "stream": True, "max_output_tokens": 500})
        for _ in range(20):
            await resp.content.readline()
        resp.close()
    for _ in range(200):
        row = await gw.store.fetchone("SELECT outcome, output_tokens, usd_micro FROM usage WHERE account_id = ?",
                                      (account,))
        if row:
            break
        await asyncio.sleep(0.02)
    assert row["outcome"] == "client_gone" and 0 < row["output_tokens"] < 100
    assert row["usd_micro"] == cost(1, row["output_tokens"])
    assert await gw.balance(account) == MICRO - row["usd_micro"] == await gw.ledger_sum(account)
