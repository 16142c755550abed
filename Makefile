# frugal: the two setup commands are `make run` and `make test` (see README.md).
CARGO ?= cargo
JOBS ?= 2
OUT ?= out

.PHONY: run demo test first-hour lint fmt models bench sample test-deps

MODEL ?= models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
# The larger (qwen2) tier, which the tests also load.
LARGE := models/qwen2.5/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf
# The semantic cache's embedder (all-MiniLM-L6-v2), on by default in `frugal serve`.
EMBEDDER := models/minilm/model.safetensors

# The main job: fetch the default model if missing, build, and serve it on
# http://127.0.0.1:8080/v1 (OpenAI-compatible), metering every request into the ledger.
# Built as `make test` builds (the whole workspace): `-p frugal` alone unifies the
# dependencies' features differently, so one after the other would rebuild most crates.
run: $(MODEL) $(EMBEDDER)
	$(CARGO) build --release --workspace -j $(JOBS)
	./target/release/frugal serve --model $(MODEL) $(ARGS)

$(MODEL):
	bash scripts/fetch-models.sh smollm2

$(LARGE):
	bash scripts/fetch-models.sh qwen2.5

$(EMBEDDER):
	bash scripts/fetch-models.sh minilm

# Fills a ledger from the bundled sample week and prints the cost report, with the HTML
# report in $(OUT)/report.html.
demo: sample
	$(CARGO) build --release -j $(JOBS) -p frugal
	rm -f $(OUT)/sample-ledger.sqlite*
	./target/release/frugal --ledger $(OUT)/sample-ledger.sqlite --prices examples/prices.toml ledger import $(OUT)/sample-usage.jsonl
	./target/release/frugal --ledger $(OUT)/sample-ledger.sqlite --prices examples/prices.toml report --html $(OUT)/report.html

sample:
	mkdir -p $(OUT)
	python3 scripts/sample_usage.py --out $(OUT)/sample-usage.jsonl

# The whole test suite, with the lints CI enforces (the tests use the default model and
# the larger tier, fetched if missing).
test: lint $(MODEL) $(LARGE) $(EMBEDDER) test-deps
	$(CARGO) test --workspace --release -j $(JOBS)
	$(MAKE) first-hour

# Every fenced `frugal ...` command in README.md and docs/ run as written from an empty
# folder, the release binary alone on PATH; prints each with PASS, FAIL or SKIP (and why).
first-hour:
	python3 scripts/first-hour.py --bin $${CARGO_TARGET_DIR:-target}/release/frugal

# The servers and Python packages the tests run beside Rust (Redis, PostgreSQL, Prometheus,
# the OpenAI client, a Kubernetes schema validator, a GGUF reader), installed if missing.
test-deps:
	bash scripts/test-deps.sh

lint:
	$(CARGO) fmt --all -- --check
	python3 scripts/module-cycles.py
	$(CARGO) clippy --workspace --all-targets -j $(JOBS) -- -D warnings

fmt:
	$(CARGO) fmt --all

# Default models for the engine and the semantic cache, into ./models (git-ignored).
models:
	bash scripts/fetch-models.sh

bench:
	$(CARGO) bench -p frugal-cost --bench ledger -j $(JOBS)
