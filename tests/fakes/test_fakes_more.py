"""Self-test of the Responses and Gemini fakes (no gateway involved).

The Responses fake is driven by the official openai SDK; the Gemini fake with
raw HTTP, reading the bytes a client would see.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import openai
import pytest

from . import FakeGemini, FakeOpenAIResponses, Reply, ToolCallSpec

pytestmark = pytest.mark.asyncio

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Get weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": False,
}
WEATHER_DECLARATION = {
    "name": "get_weather",
    "description": "Get weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TWO_CALLS = [
    ToolCallSpec("get_weather", '{"city":"Paris"}'),
    ToolCallSpec("get_weather", '{"city":"Tokyo"}', id="call_fixed_2"),
]
GEMINI_PATH = "/v1beta/models/gemini-2.5-flash:generateContent"
GEMINI_STREAM = "/v1beta/models/gemini-2.5-flash:streamGenerateContent"
GEMINI_KEY = {"x-goog-api-key": "gemini-test-key"}
HELLO = {"contents": [{"role": "user", "parts": [{"text": "Hello"}]}]}


@pytest.fixture
async def responses_fake(aiohttp_server):
    fake = FakeOpenAIResponses()
    server = await aiohttp_server(fake.app)
    client = openai.AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key=fake.api_key, max_retries=0)
    yield fake, client, server
    await client.close()


@pytest.fixture
async def gemini_fake(aiohttp_server):
    fake = FakeGemini()
    server = await aiohttp_server(fake.app)
    return fake, server


async def post(server, path: str, body: Any, headers: dict[str, str]) -> tuple[int, Any, bytes]:
    """Raw request -> (status, parsed JSON or None, raw body)."""
    async with aiohttp.ClientSession() as session:
        async with session.post(server.make_url(path), json=body, headers=headers) as response:
            raw = await response.read()
            try:
                payload = json.loads(raw)
            except ValueError:
                payload = None
            return response.status, payload, raw


# ---------------------------------------------------------------- Responses


async def test_responses_plain(responses_fake):
    fake, client, _ = responses_fake
    fake.enqueue(Reply(text="Hi there", cache_read_tokens=5))
    result = await client.responses.create(
        model="gpt-5", input="Hello", instructions="Be terse.", max_output_tokens=64
    )
    assert result.status == "completed" and result.output_text == "Hi there"
    assert result.id.startswith("resp_") and result.model == "gpt-5"
    [message] = result.output
    assert message.type == "message" and message.id.startswith("msg_")
    assert result.usage.input_tokens == 17 and result.usage.input_tokens_details.cached_tokens == 5
    assert result.usage.output_tokens == 7 and result.usage.total_tokens == 24
    recorded = fake.requests[0]
    assert recorded.rejected is None
    assert recorded.headers["authorization"] == "Bearer sk-test-upstream"
    assert recorded.body["instructions"] == "Be terse."


async def test_responses_stream_and_function_call_round_trip(responses_fake):
    fake, client, _ = responses_fake
    fake.enqueue(Reply(text="Checking.", tool_calls=TWO_CALLS), Reply(text="Sunny in both."))
    ask = {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris and Tokyo?"}]}
    stream = await client.responses.create(model="gpt-5", input=[ask], tools=[WEATHER_TOOL], stream=True)
    events = [event async for event in stream]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:3]] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert events[-1].type == "response.completed"
    arguments: dict[str, str] = {}
    for event in events:
        if event.type == "response.function_call_arguments.delta":
            arguments[event.item_id] = arguments.get(event.item_id, "") + event.delta
    final = events[-1].response
    assert final.usage.total_tokens == 19
    message, *calls = final.output
    assert message.content[0].text == "Checking."
    assert [c.call_id for c in calls][1] == "call_fixed_2" and calls[0].call_id.startswith("call_")
    assert all(c.id.startswith("fc_") and arguments[c.id] == c.arguments for c in calls)
    history = [ask, *[c.model_dump(exclude_none=True) for c in final.output]]
    history += [{"type": "function_call_output", "call_id": c.call_id, "output": '{"sky":"sunny"}'} for c in calls]
    follow_up = await client.responses.create(model="gpt-5", input=history, tools=[WEATHER_TOOL], store=False)
    assert follow_up.output_text == "Sunny in both."
    assert fake.requests[-1].rejected is None


async def test_responses_reasoning_replay_without_store(responses_fake):
    """Summary and encrypted reasoning come only when asked; a replayed item must be verbatim."""
    fake, client, _ = responses_fake
    fake.enqueue(Reply(reasoning="Need the weather tool.", text="", tool_calls=TWO_CALLS[:1]), Reply())
    common: dict[str, Any] = {"model": "gpt-5", "tools": [WEATHER_TOOL], "store": False}
    ask = {"role": "user", "content": "Weather in Paris?"}
    async with client.responses.stream(
        input=[ask], reasoning={"effort": "low", "summary": "auto"}, include=["reasoning.encrypted_content"], **common
    ) as stream:
        final = await stream.get_final_response()
    reasoning, call = final.output
    assert reasoning.summary[0].text == "Need the weather tool." and reasoning.encrypted_content
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": "14C"}
    replay = [ask, reasoning.model_dump(exclude_none=True), call.model_dump(exclude_none=True), answer]
    await client.responses.create(input=replay, **common)
    tampered = dict(replay[1], encrypted_content="gAAAAAforged")
    with pytest.raises(openai.BadRequestError, match="could not be verified"):
        await client.responses.create(input=[ask, tampered, *replay[2:]], **common)
    without_blob = {k: v for k, v in replay[1].items() if k != "encrypted_content"}
    with pytest.raises(openai.BadRequestError, match="Items are not persisted when `store` is set to false"):
        await client.responses.create(input=[ask, without_blob, *replay[2:]], **common)


async def test_responses_incomplete_and_plain_reasoning(responses_fake):
    fake, client, _ = responses_fake
    fake.enqueue(Reply(text="cut sh", stop="max_tokens", reasoning="hmm"), Reply(stop="max_tokens"))
    result = await client.responses.create(model="gpt-5", input="Hi", max_output_tokens=16)
    assert result.status == "incomplete" and result.incomplete_details.reason == "max_output_tokens"
    assert result.output[0].type == "reasoning" and result.output[0].summary == []
    assert result.output[0].encrypted_content is None
    stream = await client.responses.create(model="gpt-5", input="Hi", stream=True)
    events = [event async for event in stream]
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.usage.output_tokens == 7


async def test_responses_mid_stream_failure(responses_fake):
    fake, client, _ = responses_fake
    fake.enqueue(Reply(text="abcdefgh", text_chunks=4, fail_after_events=2))
    stream = await client.responses.create(model="gpt-5", input="Hi", stream=True)
    events = [event async for event in stream]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert deltas == ["ab", "cd"]
    error, failed = events[-2:]
    assert error.type == "error" and error.code == "server_error" and error.message == "fake upstream error"
    assert failed.type == "response.failed" and failed.response.status == "failed"
    assert failed.response.error.code == "server_error"


async def test_responses_previous_response_id(responses_fake):
    fake, client, _ = responses_fake
    stored = await client.responses.create(model="gpt-5", input="Hi")
    await client.responses.create(model="gpt-5", input="And?", previous_response_id=stored.id)
    unstored = await client.responses.create(model="gpt-5", input="Hi", store=False)
    with pytest.raises(openai.BadRequestError, match="not found") as caught:
        await client.responses.create(model="gpt-5", input="And?", previous_response_id=unstored.id)
    assert caught.value.body["code"] == "previous_response_not_found"
    assert [r.body.get("previous_response_id") is not None for r in fake.requests] == [False, True, False, True]


@pytest.mark.parametrize(
    "extra, fragment",
    [
        ({"tools": [{"type": "function", "function": WEATHER_DECLARATION}]},
         "Missing required parameter: 'tools[0].name'."),
        ({"messages": [{"role": "user", "content": "Hi"}]}, "Unsupported parameter: 'messages'. In the Responses API"),
        ({"max_tokens": 100}, "Unknown parameter: 'max_tokens'."),
        ({"max_completion_tokens": 100}, "Unknown parameter: 'max_completion_tokens'."),
        ({"n": 1}, "Unknown parameter: 'n'."),
        ({"stop": ["END"]}, "Unknown parameter: 'stop'."),
        ({"stream": True, "stream_options": {"include_usage": True}},
         "Unknown parameter: 'stream_options.include_usage'."),
        ({"max_output_tokens": 8}, "Expected a value >= 16, but got 8 instead."),
        ({"input": [{"type": "function_call_output", "call_id": "call_zzz", "output": "1"}]},
         "No tool call found for function call output with call_id call_zzz."),
        ({"input": [{"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"}]},
         "No tool output found for function call call_1."),
        ({"input": [{"type": "function_call", "call_id": "call_1", "name": "f", "arguments": {}},
                    {"type": "function_call_output", "call_id": "call_1", "output": "1"}]},
         "Invalid type for 'input[0].arguments': expected a string"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": {"url": "https://x/y.png"}}]}]},
         "Invalid type for 'input[0].content[0].image_url': expected a string, but got an object instead."),
        ({"input": [{"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}]},
         "Supported values are: 'output_text' and 'refusal'."),
        ({"input": [{"role": "tool", "content": "x"}]}, "Invalid value: 'tool'."),
        ({"previous_response_id": "resp_unknown"}, "Previous response with id 'resp_unknown' not found."),
        ({"input": [{"type": "reasoning", "id": "rs_1", "summary": []}, {"role": "assistant", "content": "x"}]},
         "Item with id 'rs_1' not found."),
        ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "tools": [WEATHER_TOOL]},
         "Missing required parameter: 'tool_choice.name'."),
    ],
)  # fmt: skip
async def test_responses_rejections(responses_fake, extra, fragment):
    fake, _, server = responses_fake
    fake.enqueue(Reply(text="kept"))
    body = {"model": "gpt-5", "input": "Hi", **extra}
    status, payload, _ = await post(server, "/v1/responses", body, {"Authorization": "Bearer sk-test-upstream"})
    assert status == 400, payload
    assert set(payload["error"]) == {"message", "type", "param", "code"}
    assert payload["error"]["type"] == "invalid_request_error"
    assert fragment in payload["error"]["message"]
    assert fake.requests[-1].rejected == payload["error"]["message"]
    status, payload, _ = await post(
        server, "/v1/responses", {"model": "gpt-5", "input": "Hi"}, {"Authorization": "Bearer sk-test-upstream"}
    )
    assert payload["output"][0]["content"][0]["text"] == "kept"  # the refusal left the queue alone


async def test_responses_sdk_rejection_auth_and_scripted_errors(responses_fake):
    fake, client, server = responses_fake
    chat_tool = {"type": "function", "function": WEATHER_DECLARATION}
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model="gpt-5", input="Hi", tools=[chat_tool])
    assert caught.value.body["param"] == "tools[0].name"
    assert caught.value.body["code"] == "missing_required_parameter"
    status, payload, _ = await post(server, "/v1/responses", {"model": "gpt-5", "input": "Hi"}, {})
    assert status == 401 and payload["error"]["code"] == "invalid_api_key"
    fake.enqueue(Reply(error_status=429, error_message="slow down"))
    with pytest.raises(openai.RateLimitError, match="slow down"):
        await client.responses.create(model="gpt-5", input="Hi")


async def test_responses_stream_wire_framing(responses_fake):
    """`event:` line equal to data.type on every event; no [DONE]."""
    fake, _, server = responses_fake
    fake.enqueue(Reply(text="Hi", tool_calls=TWO_CALLS[:1], text_chunks=1))
    body = {"model": "gpt-5", "input": "Hi", "stream": True}
    _, _, raw = await post(server, "/v1/responses", body, {"Authorization": "Bearer sk-test-upstream"})
    events = [block.split("\n") for block in raw.decode().split("\n\n") if block]
    assert "[DONE]" not in raw.decode()
    names = [lines[0].removeprefix("event: ") for lines in events]
    for name, (_, data) in zip(names, events):
        assert json.loads(data.removeprefix("data: "))["type"] == name
    assert names == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed",
    ]  # fmt: skip


# ---------------------------------------------------------------- Gemini


async def test_gemini_generate_content(gemini_fake):
    fake, server = gemini_fake
    fake.enqueue(Reply(text="Bonjour", cache_read_tokens=4))
    body = {
        "systemInstruction": {"parts": [{"text": "Be terse."}]},
        **HELLO,
        "generationConfig": {"maxOutputTokens": 100, "temperature": 0.2, "stopSequences": ["END"]},
    }
    status, payload, _ = await post(server, GEMINI_PATH, body, GEMINI_KEY)
    assert status == 200, payload
    [candidate] = payload["candidates"]
    assert candidate["content"] == {"parts": [{"text": "Bonjour"}], "role": "model"}
    assert candidate["finishReason"] == "STOP"
    usage = payload["usageMetadata"]
    assert (usage["promptTokenCount"], usage["candidatesTokenCount"], usage["totalTokenCount"]) == (16, 7, 23)
    assert usage["cachedContentTokenCount"] == 4
    assert payload["modelVersion"] == "gemini-2.5-flash"
    assert fake.requests[0].rejected is None and fake.requests[0].headers["x-goog-api-key"] == "gemini-test-key"


async def test_gemini_sse_framing(gemini_fake):
    """data: lines only, CRLF, running usage, finishReason only on the last chunk, no terminator."""
    fake, server = gemini_fake
    fake.enqueue(Reply(text="Hello there, friend", text_chunks=3, stop="max_tokens"))
    path = f"{GEMINI_STREAM}?alt=sse&key=gemini-test-key"
    async with aiohttp.ClientSession() as session:
        async with session.post(server.make_url(path), json=HELLO) as response:
            assert response.headers["Content-Type"].startswith("text/event-stream")
            raw = (await response.read()).decode()
    assert raw.endswith("\r\n\r\n") and "\n" not in raw.replace("\r\n", "")
    events = raw.split("\r\n\r\n")[:-1]
    assert all(event.startswith("data: ") and "\r\n" not in event for event in events)
    chunks = [json.loads(event[6:]) for event in events]
    assert len(chunks) == 3
    assert "".join(c["candidates"][0]["content"]["parts"][0]["text"] for c in chunks) == "Hello there, friend"
    assert [c["candidates"][0].get("finishReason") for c in chunks] == [None, None, "MAX_TOKENS"]
    counts = [c["usageMetadata"]["candidatesTokenCount"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 7
    assert len({c["responseId"] for c in chunks}) == 1
    assert fake.requests[0].query == {"alt": "sse", "key": "gemini-test-key"}


async def test_gemini_stream_tool_calls_and_round_trip(gemini_fake):
    fake, server = gemini_fake
    fake.enqueue(Reply(reasoning="Use the tool.", text="", tool_calls=TWO_CALLS), Reply(text="Sunny."))
    body = {**HELLO, "tools": [{"functionDeclarations": [WEATHER_DECLARATION]}],
            "toolConfig": {"functionCallingConfig": {"mode": "AUTO"}},
            "generationConfig": {"thinkingConfig": {"thinkingBudget": 1024, "includeThoughts": True}}}  # fmt: skip
    _, _, raw = await post(server, f"{GEMINI_STREAM}?alt=sse", body, GEMINI_KEY)
    chunks = [json.loads(event[6:]) for event in raw.decode().split("\r\n\r\n") if event]
    parts = [part for c in chunks for part in c["candidates"][0]["content"]["parts"]]
    thoughts = [part for part in parts if part.get("thought")]
    assert "".join(part["text"] for part in thoughts) == "Use the tool." and parts[: len(thoughts)] == thoughts
    calls = [part for part in parts if "functionCall" in part]
    assert [c["functionCall"]["args"] for c in calls] == [{"city": "Paris"}, {"city": "Tokyo"}]
    assert "id" not in calls[0]["functionCall"] and calls[1]["functionCall"]["id"] == "call_fixed_2"
    assert calls[0]["thoughtSignature"] and "thoughtSignature" not in calls[1]
    assert chunks[-1]["candidates"][0]["finishReason"] == "STOP"
    answers = [{"functionResponse": {"name": "get_weather", "response": {"result": "sunny"}}} for _ in calls]
    follow_up = {
        "contents": [*HELLO["contents"], {"role": "model", "parts": calls}, {"role": "user", "parts": answers}],
        "tools": body["tools"],
    }
    status, payload, _ = await post(server, GEMINI_PATH, follow_up, GEMINI_KEY)
    assert status == 200, payload
    assert payload["candidates"][0]["content"]["parts"] == [{"text": "Sunny."}]


async def test_gemini_mid_stream_failure_just_ends(gemini_fake):
    fake, server = gemini_fake
    fake.enqueue(Reply(text="abcdefgh", text_chunks=4, fail_after_events=2))
    status, _, raw = await post(server, f"{GEMINI_STREAM}?alt=sse", HELLO, GEMINI_KEY)
    chunks = [json.loads(event[6:]) for event in raw.decode().split("\r\n\r\n") if event]
    assert status == 200
    assert [c["candidates"][0]["content"]["parts"][0]["text"] for c in chunks] == ["ab", "cd"]
    assert all("finishReason" not in c["candidates"][0] and "error" not in c for c in chunks)


async def test_gemini_stream_without_alt_sse_is_a_json_array(gemini_fake):
    fake, server = gemini_fake
    fake.enqueue(Reply(text="abcd", text_chunks=2))
    status, payload, _ = await post(server, GEMINI_STREAM, HELLO, GEMINI_KEY)
    assert status == 200 and isinstance(payload, list) and len(payload) == 2


async def test_gemini_auth(gemini_fake):
    fake, server = gemini_fake
    status, payload, _ = await post(server, GEMINI_PATH, HELLO, {})
    assert status == 403 and payload["error"]["status"] == "PERMISSION_DENIED"
    status, payload, _ = await post(server, GEMINI_PATH, HELLO, {"x-goog-api-key": "wrong"})
    assert status == 400 and payload["error"]["status"] == "INVALID_ARGUMENT"
    assert payload["error"]["message"] == "API key not valid. Please pass a valid API key."
    assert payload["error"]["details"][0]["reason"] == "API_KEY_INVALID"
    status, _, _ = await post(server, GEMINI_PATH, HELLO, {"Authorization": "Bearer gemini-test-key"})
    assert status == 403  # Gemini API keys do not travel as Bearer tokens
    assert all(r.rejected for r in fake.requests)


async def test_gemini_scripted_errors(gemini_fake):
    fake, server = gemini_fake
    fake.enqueue(Reply(error_status=429, error_message="quota"), Reply(error_status=503, error_message="busy"))
    status, payload, _ = await post(server, GEMINI_PATH, HELLO, GEMINI_KEY)
    assert status == 429 and payload["error"]["status"] == "RESOURCE_EXHAUSTED"
    assert payload["error"]["details"][0]["retryDelay"] == "1s"
    status, payload, _ = await post(server, GEMINI_PATH, HELLO, GEMINI_KEY)
    assert (status, payload["error"]) == (503, {"code": 503, "message": "busy", "status": "UNAVAILABLE"})


def model_turn(*calls: dict) -> dict:
    return {"role": "model", "parts": [{"functionCall": call} for call in calls]}


def answer_turn(*responses: dict) -> dict:
    return {"role": "user", "parts": [{"functionResponse": response} for response in responses]}


ASK = {"role": "user", "parts": [{"text": "Weather?"}]}
CALL = {"name": "get_weather", "args": {"city": "Paris"}}


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({"contents": [ASK, model_turn(CALL), answer_turn({"name": "get_weather", "response": "14C"})]},
         "Invalid value at 'contents[2].parts[0].function_response.response' "
         "(type.googleapis.com/google.protobuf.Struct), \"14C\""),
        ({"contents": [ASK, model_turn(CALL), answer_turn({"name": "get_weather", "response": ["14C"]})]},
         "Proto field is not repeating, cannot start list."),
        ({**HELLO, "generationConfig": {"max_output_tokens": 10}},
         'Invalid JSON payload received. Unknown name "max_output_tokens" at \'generation_config\': '
         "Cannot find field."),
        ({**HELLO, "system_instruction": {"parts": [{"text": "x"}]}}, 'Unknown name "system_instruction": Cannot find'),
        ({**HELLO, "tools": [{"function_declarations": [WEATHER_DECLARATION]}]},
         'Unknown name "function_declarations"'),
        ({"contents": []}, "contents is not specified"),
        ({"contents": [{"role": "assistant", "parts": [{"text": "x"}]}]}, "Please use a valid role: user, model."),
        ({"contents": [{"role": "user", "parts": []}]}, "contents.parts must not be empty."),
        ({"contents": [{"role": "user", "parts": [{"text": ""}]}]}, "required oneof field 'data'"),
        ({"contents": [{"role": "user", "parts": [{"text": "a",
                                                   "inlineData": {"mimeType": "image/png", "data": "AA=="}}]}]},
         "oneof field 'data' is already set. Cannot set 'inlineData'"),
        ({"contents": [{"role": "user", "parts": [{"inlineData": {"mimeType": "image/png",
                                                                  "data": "data:image/png;base64,AAAA"}}]}]},
         "(TYPE_BYTES), Base64 decoding failed"),
        ({"contents": [ASK, answer_turn({"name": "get_weather", "response": {"r": 1}})]},
         "function response turn comes immediately after a function call turn"),
        ({"contents": [ASK, model_turn(CALL), answer_turn({"name": "get_time", "response": {"r": 1}})]},
         "no call of 'get_time'"),
        ({"contents": [ASK, model_turn(CALL, CALL), answer_turn({"name": "get_weather", "response": {"r": 1}})]},
         "number of function response parts is equal to the number of function call parts"),
        ({"contents": [ASK, model_turn({"name": "get_weather", "args": '{"city":"Paris"}'})]},
         "function_call.args' (type.googleapis.com/google.protobuf.Struct)"),
        ({**HELLO, "tools": [{"functionDeclarations": [{**WEATHER_DECLARATION, "parameters": {
            "type": "object", "properties": {}, "additionalProperties": False}}]}]},
         "Unknown name \"additionalProperties\" at 'tools[0].function_declarations[0].parameters'"),
        ({**HELLO, "tools": [{"functionDeclarations": [{**WEATHER_DECLARATION, "parameters": {"type": "array"}}]}]},
         "parameters must be of type OBJECT"),
        ({**HELLO, "toolConfig": {"functionCallingConfig": {"mode": "auto"}}},
         "Invalid value at 'tool_config.function_calling_config.mode'"),
        ({**HELLO, "generationConfig": {"responseFormat": {}}}, 'Unknown name "responseFormat"'),
        ({**HELLO, "systemInstruction": "Be terse."}, "Invalid value at 'system_instruction'"),
        ({**HELLO, "messages": []}, 'Unknown name "messages"'),
    ],
)  # fmt: skip
async def test_gemini_rejections(gemini_fake, body, fragment):
    fake, server = gemini_fake
    fake.enqueue(Reply(text="kept"))
    status, payload, _ = await post(server, GEMINI_PATH, body, GEMINI_KEY)
    assert status == 400, payload
    assert payload["error"]["code"] == 400 and payload["error"]["status"] == "INVALID_ARGUMENT"
    assert fragment in payload["error"]["message"]
    assert fake.requests[-1].rejected == payload["error"]["message"]
    status, payload, _ = await post(server, GEMINI_PATH, HELLO, GEMINI_KEY)
    assert payload["candidates"][0]["content"]["parts"] == [{"text": "kept"}]  # the refusal left the queue alone


async def test_gemini_3_requires_thought_signatures(gemini_fake):
    """Gemini 3 signs every function call turn and wants the signature back;
    thought text stays hidden unless includeThoughts asks for it."""
    fake, server = gemini_fake
    fake.enqueue(Reply(reasoning="hidden", text="", tool_calls=TWO_CALLS[:1]))
    path = "/v1beta/models/gemini-3-pro-preview:generateContent"
    _, payload, _ = await post(server, path, {"contents": [ASK]}, GEMINI_KEY)
    [signed] = payload["candidates"][0]["content"]["parts"]
    assert signed["thoughtSignature"]
    answer = answer_turn({"name": "get_weather", "response": {"temp_c": 14}})
    signed_turn = {"role": "model", "parts": [signed]}
    status, _, _ = await post(server, path, {"contents": [ASK, signed_turn, answer]}, GEMINI_KEY)
    assert status == 200
    unsigned = {"role": "model", "parts": [{"functionCall": signed["functionCall"]}]}
    status, payload, _ = await post(server, path, {"contents": [ASK, unsigned, answer]}, GEMINI_KEY)
    assert status == 400 and "missing a thought_signature" in payload["error"]["message"]
