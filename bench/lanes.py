"""What the benchmark sends: the request bodies and the lanes (name, path, body, keyed,
streaming), shared by bench/run.py, bench/report.py and bench/instructions.py."""

MESSAGES = [{"role": "user", "content": "Say hello to the benchmark in one short sentence."}]
BODIES = {
    "chat": {"model": "bench/gpt", "max_tokens": 64, "messages": MESSAGES},
    "chat_stream": {"model": "bench/gpt", "max_tokens": 64, "messages": MESSAGES, "stream": True},
    "messages": {"model": "bench/gpt", "max_tokens": 64, "messages": MESSAGES},
    "responses_stream": {"model": "bench/gpt", "max_output_tokens": 64, "input": MESSAGES[0]["content"],
                         "stream": True},
}
LANES = [  # name, path, body, keyed, streaming
    ("1 chat JSON, key", "/api/v1/chat/completions", "chat", True, False),
    ("2 chat stream, key", "/api/v1/chat/completions", "chat_stream", True, True),
    ("3 messages -> OpenAI upstream", "/api/v1/messages", "messages", True, False),
    ("4 responses stream", "/api/v1/responses", "responses_stream", True, True),
    ("5 x402 402 challenge", "/api/v1/chat/completions", "chat", False, False),
]
TRANSLATED = {LANES[2][0]: LANES[0][0], LANES[3][0]: LANES[1][0]}   # lane -> its same-format lane
