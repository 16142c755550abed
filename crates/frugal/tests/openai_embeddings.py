"""The official OpenAI Python client's embeddings against `frugal serve`: the local embedder
(base64 on the wire, as the client asks by default, and floats), the exact cache, a refusal
in OpenAI's error shape, and an upstream (`mock`) passed through. Run by tests/upstream.rs
with the server's base URL; prints the vectors it got as JSON, for the test to compare with
the embedder's own."""

import json
import sys

import openai
from openai import OpenAI

LOCAL = "all-MiniLM-L6-v2"
client = OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0, timeout=120)
ids = [m.id for m in client.models.list().data]
assert LOCAL in ids, ids

texts = ["The cat sat on the mat.", "Where is the train station?"]
listed = client.embeddings.create(model=LOCAL, input=texts)
assert listed.object == "list" and listed.model == LOCAL, listed
assert [d.index for d in listed.data] == [0, 1], listed.data
assert all(d.object == "embedding" and len(d.embedding) == 384 for d in listed.data)
assert listed.usage.prompt_tokens == listed.usage.total_tokens > 4, listed.usage

first = client.embeddings.with_raw_response.create(model=LOCAL, input=texts[0], encoding_format="float")
assert first.headers["x-frugal-cache"] == "miss", first.headers
assert float(first.headers["x-frugal-cost-usd"]) > 0, first.headers
again = client.embeddings.with_raw_response.create(model=LOCAL, input=texts[0], encoding_format="float")
assert again.headers["x-frugal-cache"] == "hit-exact", again.headers
assert float(again.headers["x-frugal-saved-usd"]) > 0, again.headers
floats = first.parse().data[0].embedding
assert again.parse().data[0].embedding == floats

try:
    client.embeddings.create(model=LOCAL, input="x", dimensions=64)
    raise AssertionError("dimensions=64 was accepted")
except openai.BadRequestError as e:
    assert e.param == "dimensions" and "384 dimensions" in e.message, e.body

up = client.embeddings.create(model="mock", input=["hello", "hi"], encoding_format="float")
assert [d.embedding for d in up.data] == [[5.0, 0.5, -0.25], [2.0, 0.5, -0.25]], up.data
assert up.usage.prompt_tokens == 6, up.usage

print(json.dumps({"texts": texts, "listed": [d.embedding for d in listed.data], "float": floats}))
