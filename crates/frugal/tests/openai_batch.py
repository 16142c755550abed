"""The official OpenAI Python client's Batch API flow against `frugal serve`: upload, create,
poll, read the output, list, cancel. Run by tests/openai_batch.rs with the server's base URL;
prints the two batches' ids for it to find in the ledger."""

import json
import sys
import time

from openai import OpenAI

FINAL = ("completed", "failed", "expired", "cancelled")

client = OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0, timeout=120)
model = client.models.list().data[0].id


def line(custom_id, question, max_tokens):
    body = {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def jsonl(lines):
    return "".join(json.dumps(l) + "\n" for l in lines).encode()


def wait(batch, seconds=600):
    deadline = time.time() + seconds
    while batch.status not in FINAL:
        assert time.time() < deadline, batch
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    return batch


# Greedy answers the small model gets right, and two it need only answer.
questions = {
    "capital": ("What is the capital of France? Answer in one word.", "Paris"),
    "sum": ("What is 2 plus 2?", "4"),
    "hello": ("Say hello.", ""),
    "color": ("What color is the sky on a clear day?", ""),
}
data = jsonl(line(cid, q, 24) for cid, (q, _) in questions.items())
uploaded = client.files.create(file=("questions.jsonl", data), purpose="batch")
assert uploaded.purpose == "batch" and uploaded.status == "processed", uploaded
assert uploaded.bytes == len(data) and uploaded.filename == "questions.jsonl", uploaded

batch = client.batches.create(
    input_file_id=uploaded.id,
    endpoint="/v1/chat/completions",
    completion_window="24h",
    metadata={"suite": "e2e"},
)
assert batch.status == "validating" and batch.metadata == {"suite": "e2e"}, batch
batch = wait(batch)
assert batch.status == "completed", batch
counts = batch.request_counts
assert (counts.total, counts.completed, counts.failed) == (len(questions), len(questions), 0), counts
assert batch.error_file_id is None and batch.errors is None, batch
assert batch.in_progress_at and batch.finalizing_at and batch.completed_at, batch

output = client.files.content(batch.output_file_id).text
results = [json.loads(l) for l in output.splitlines()]
ids = [r["custom_id"] for r in results]
assert sorted(ids) == sorted(questions), ids
by_id = {r["custom_id"]: r for r in results}
for cid, (_, want) in questions.items():
    response = by_id[cid]["response"]
    assert response["status_code"] == 200 and by_id[cid]["error"] is None, by_id[cid]
    text = response["body"]["choices"][0]["message"]["content"]
    assert text.strip() and want in text, (cid, text)
assert client.files.retrieve(batch.output_file_id).purpose == "batch_output"

listed = client.batches.list(limit=10)
assert listed.data[0].id == batch.id, listed

# A long batch, cancelled once lines are answering: the lines in flight finish, the rest
# never run, and what was done is its output.
long = [line(f"n{i}", f"Count from 1 to {i + 20}.", 8) for i in range(200)]
uploaded = client.files.create(file=("long.jsonl", jsonl(long)), purpose="batch")
cancelled = client.batches.create(
    input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
)
deadline = time.time() + 600
while cancelled.request_counts.completed == 0:
    assert time.time() < deadline, cancelled
    assert cancelled.status in ("validating", "in_progress"), cancelled
    time.sleep(0.05)
    cancelled = client.batches.retrieve(cancelled.id)
cancelled = client.batches.cancel(cancelled.id)
assert cancelled.status in ("cancelling", "cancelled") and cancelled.cancelling_at, cancelled
cancelled = wait(cancelled)
assert cancelled.status == "cancelled" and cancelled.cancelled_at, cancelled
done = cancelled.request_counts.completed
assert 0 < done < len(long), cancelled.request_counts
partial = [json.loads(l) for l in client.files.content(cancelled.output_file_id).text.splitlines()]
assert len({r["custom_id"] for r in partial}) == len(partial) == done, (len(partial), done)

assert [b.id for b in client.batches.list(limit=2).data] == [cancelled.id, batch.id]
print(batch.id, cancelled.id, done)
