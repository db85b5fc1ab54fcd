"""The conformance checker itself: it refuses what a strict client refuses, and each
provider-versus-schema difference we allow is shown by a recorded real response."""
import json
from pathlib import Path

import pytest

from tests.conformance.openapi import check, source
from tests.conformance.wire import RECORDED, allowed, check_body, check_stream, parse_sse

RECORDED_DIR = Path(__file__).parent / "conformance" / "recorded"
FIXTURES = Path(__file__).parent / "fixtures"

MESSAGE = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "stop_reason": "end_turn",
           "stop_sequence": None, "stop_details": None, "container": None,
           "content": [{"type": "text", "text": "Hi", "citations": None}],
           "usage": {"input_tokens": 3, "output_tokens": 1, "cache_creation_input_tokens": 0,
                     "cache_read_input_tokens": 0, "cache_creation": None, "service_tier": None,
                     "server_tool_use": None, "inference_geo": None}}


def test_pins_name_their_source():
    assert source("openai")["version"] == "2.3.0"
    assert source("openai")["repository"] == "https://github.com/openai/openai-openapi"
    assert len(source("anthropic")["commit"]) == len(source("openai")["commit"]) == 40


def test_a_complete_message_validates_and_each_missing_key_is_named():
    assert check("anthropic", "Message", MESSAGE) == []
    for key in ("container", "stop_details"):
        found = check("anthropic", "Message", {k: v for k, v in MESSAGE.items() if k != key})
        assert [(v.kind, v.path, v.message) for v in found] == [("schema", "$", f"'{key}' is a required property")]


def test_the_branch_the_type_picks_is_the_one_reported():
    block = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}      # no caller
    found = check("anthropic", "Message", {**MESSAGE, "content": [block]})
    assert [(v.path, v.message) for v in found] == [("$.content[0]", "'caller' is a required property")]


def test_undeclared_keys_are_reported_and_open_maps_are_not():
    found = check("anthropic", "Message", {**MESSAGE, "billing": {}, "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"anything": 1}, "caller": {"type": "direct"}}]})
    assert [(v.kind, v.path) for v in found] == [("undeclared", "$.billing")]


def test_openapi_nullable_admits_null_and_nothing_else():
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}], "usage": None}
    assert check("openai", "CreateChatCompletionStreamResponse", chunk) == []
    found = check("openai", "CreateChatCompletionStreamResponse", {**chunk, "usage": "none"})
    assert [v.path for v in found] == ["$.usage"]


def test_order_rules_catch_misordered_streams():
    def frames(*events):
        return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()
    start = {"type": "message_start", "message": {**MESSAGE, "content": [], "stop_reason": None}}
    block = {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": "", "citations": None}}
    found = check_stream("messages", parse_sse(frames(start, block)), {})
    assert {v.message for v in found if v.kind == "order"} >= {
        "block 1 starts while None is open or out of order",
        "message_delta then message_stop end the stream; got ['content_block_start']"}


def test_billing_is_allowed_on_chat_completions_only():
    body = {"id": "c", "object": "chat.completion", "created": 1, "model": "m", "billing": {"usd": "0"},
            "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                         "message": {"role": "assistant", "content": "x", "refusal": None}}]}
    [v] = check_body("chat_completions", 200, body, {})
    assert v.path == "$.billing" and allowed("chat_completions", v)
    [v] = check_body("messages", 200, {**MESSAGE, "billing": {}}, {})
    assert not allowed("messages", v)


def _recorded_violations(name: str) -> list:
    raw = (RECORDED_DIR / name).read_bytes()
    if name.endswith(".json"):
        return check_body("responses", 200, json.loads(raw), {})
    return check_stream("responses", parse_sse(raw), {})


@pytest.mark.parametrize("difference", RECORDED, ids=[d.why[:40] for d in RECORDED])
def test_each_allowed_difference_is_what_the_real_provider_sends(difference):
    """A difference stays allowed only while a real recording shows the provider doing it."""
    for recording in difference.recordings:
        assert any(difference.covers(difference.fmt, v) for v in _recorded_violations(recording)), recording
