# frugal: the two setup commands are `make run` and `make test` (see README.md).
CARGO ?= cargo
JOBS ?= 2
OUT ?= out

.PHONY: run test lint fmt models bench sample

# Builds frugal, fills a ledger from the bundled sample week and prints the report,
# with the HTML report in $(OUT)/report.html.
run: sample
	$(CARGO) build --release -j $(JOBS) -p frugal
	rm -f $(OUT)/sample-ledger.sqlite*
	./target/release/frugal --ledger $(OUT)/sample-ledger.sqlite --prices examples/prices.toml ledger import $(OUT)/sample-usage.jsonl
	./target/release/frugal --ledger $(OUT)/sample-ledger.sqlite --prices examples/prices.toml report --html $(OUT)/report.html

sample:
	mkdir -p $(OUT)
	python3 scripts/sample_usage.py --out $(OUT)/sample-usage.jsonl

# The whole test suite, with the lints CI enforces.
test: lint
	$(CARGO) test --workspace -j $(JOBS)

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -j $(JOBS) -- -D warnings

fmt:
	$(CARGO) fmt --all

# Default models for the engine and the semantic cache, into ./models (git-ignored).
models:
	bash scripts/fetch-models.sh

bench:
	$(CARGO) bench -p frugal-cost --bench ledger -j $(JOBS)
