"""The per-call records are built positionally on the hot path (a class called with keywords
builds a dict per call). Those call sites rely on the field order below: reordering or
inserting a field here must go with the call sites named in each case, so this test says so."""
from dataclasses import fields

import pytest

from plugins.context import CallContext, Hold
from plugins.limitstores import Bucket
from plugins.storage.records import HoldRequest, UsageRow
from providers.types import ChatRequest, ChatResponse, Usage

POSITIONAL = [
    (CallContext, ("request", "format", "call_id"), "plugins/pipeline.py run_call"),
    (Hold, ("kind", "amount_micro", "call_id", "input_tokens", "output_cap", "settled", "data"),
     "plugins/billing.py gateway_reserve"),
    (HoldRequest, ("call_id", "account_id", "amount_micro", "free", "key_id", "agent_id", "endpoint",
                   "requested_model", "model", "key_limit"), "plugins/billing.py gateway_reserve (labels from usage.LABELS)"),
    (UsageRow, ("call_id", "account_id", "key_id", "agent_id", "endpoint", "requested_model", "model",
                "input_tokens", "output_tokens", "usd_micro", "status", "outcome", "latency_ms", "billing",
                "created_at"), "plugins/usage.py row"),
    (Bucket, ("key", "cost", "capacity", "window"), "plugins/ratelimit.py gateway_admit"),
    (ChatRequest, ("model", "messages", "max_tokens", "stream", "tools", "tool_choice", "stop", "temperature",
                   "top_p", "extra", "extra_format", "reasoning"), "plugins/formats/chat_completions.py parse"),
    (Usage, ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens"),
     "providers/openai.py usage_from_openai"),
    (ChatResponse, ("id", "model", "content", "stop_reason", "stop_sequence", "usage", "raw", "raw_format"),
     "providers/openai.py parse_response"),
]


@pytest.mark.parametrize("cls,leading,built_at", POSITIONAL, ids=[c.__name__ for c, _, _ in POSITIONAL])
def test_positionally_built_records_keep_their_field_order(cls, leading, built_at):
    names = tuple(f.name for f in fields(cls))[:len(leading)]
    assert names == leading, f"{cls.__name__}'s fields moved: update the positional construction in {built_at}"


def test_the_hold_labels_sit_where_usage_label_values_puts_them():
    from plugins import usage
    names = [f.name for f in fields(HoldRequest)]
    at = names.index("endpoint")
    assert tuple(names[at:at + len(usage.LABELS)]) == usage.LABELS
