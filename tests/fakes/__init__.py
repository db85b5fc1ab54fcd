"""Strict fake LLM upstreams for gateway tests.

Start one with pytest-aiohttp, point the gateway at it, script its answers:

    fake = FakeOpenAIChat()
    server = await aiohttp_server(fake.app)
    base_url = str(server.make_url("/v1"))        # Anthropic and Gemini: server.make_url("")
    fake.enqueue(Reply(text="Hi"), Reply(error_status=429))
    ...
    assert fake.requests[0].rejected is None      # the real API would have accepted it

Media fakes (FakeFal, FakeReplicate, FakeOpenAIImages, FakeGeminiMedia) take `MediaReply` scripts
and serve their result files themselves, at URLs on the same server.
"""

from .anthropic_messages import FakeAnthropic
from .fal import FakeFal
from .gemini import FakeGemini
from .gemini_media import FakeGeminiMedia
from .media_script import MediaReply
from .openai_chat import FakeOpenAIChat
from .openai_images import FakeOpenAIImages
from .openai_responses import FakeOpenAIResponses
from .replicate import FakeReplicate
from .script import RecordedRequest, Reply, ToolCallSpec

__all__ = [
    "FakeAnthropic",
    "FakeFal",
    "FakeGemini",
    "FakeGeminiMedia",
    "FakeOpenAIChat",
    "FakeOpenAIImages",
    "FakeOpenAIResponses",
    "FakeReplicate",
    "MediaReply",
    "RecordedRequest",
    "Reply",
    "ToolCallSpec",
]
