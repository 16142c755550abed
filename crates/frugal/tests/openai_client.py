"""The official OpenAI Python client against `frugal serve`: chat, streaming with the
usage chunk, completions, logprobs. Run by tests/serve.rs with the server's base URL."""

import sys

from openai import OpenAI

client = OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0, timeout=120)
model = client.models.list().data[0].id

chat = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "What is the capital of France? Answer in one word."}],
    max_tokens=24,
    temperature=0,
)
text = chat.choices[0].message.content
assert chat.object == "chat.completion", chat
assert "Paris" in text, text
assert chat.usage.prompt_tokens > 10 and 0 < chat.usage.completion_tokens <= 24, chat.usage
assert chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens

stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "What is the capital of France? Answer in one word."}],
    max_tokens=24,
    temperature=0,
    stream=True,
    stream_options={"include_usage": True},
)
pieces, usage, finish = [], None, None
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        if c.delta.content:
            pieces.append(c.delta.content)
        if c.finish_reason:
            finish = c.finish_reason
streamed = "".join(pieces)
assert streamed == text, (streamed, text)
assert usage is not None and usage.completion_tokens == chat.usage.completion_tokens, usage
assert finish in ("stop", "length"), finish

done = client.completions.create(model=model, prompt="1, 2, 3, 4,", max_tokens=6, temperature=0, logprobs=2)
assert done.choices[0].text.strip().startswith("5"), done.choices[0].text
assert len(done.choices[0].logprobs.token_logprobs) == done.usage.completion_tokens

lp = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Say hi"}],
    max_tokens=4,
    temperature=0,
    logprobs=True,
    top_logprobs=3,
)
content = lp.choices[0].logprobs.content
assert len(content) == lp.usage.completion_tokens and all(len(t.top_logprobs) == 3 for t in content), content
assert all(t.logprob <= 0 for t in content)
print("openai client: ok")
