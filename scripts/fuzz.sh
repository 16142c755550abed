#!/usr/bin/env bash
# Runs every fuzz target (the `fuzz_*` tests) longer than CI does and prints, per target,
# its cases, its time and whether it passed.
#
#   bash scripts/fuzz.sh                  # FUZZ_SCALE=100: 100x the cases CI runs
#   FUZZ_SCALE=10 bash scripts/fuzz.sh fuzz_gguf_   # one group, 10x
#   PROPTEST_CASES=5000 bash scripts/fuzz.sh        # exactly 5000 cases each
#   FUZZ_IGNORED=1 bash scripts/fuzz.sh   # also the targets ignored for a known bug
#
# A failing property prints its shrunk input; proptest also saves the seed under the
# crate's proptest-regressions/, where the next run tries it first. An allocation past a
# target's cap aborts the test binary and prints the input (crates/frugal-testkit/src/fuzz.rs).
set -uo pipefail
cd "$(dirname "$0")/.."
export FUZZ_SCALE="${FUZZ_SCALE:-100}" CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
filter="${1:-fuzz_}"
crates=(frugal-gateway frugal-watch frugal-cost frugal-engine)
extra=()
[[ "${FUZZ_IGNORED:-}" == 1 ]] && extra=(--include-ignored)

# One crate at a time, as the targets run below (`-p` of several crates at once unifies
# their dependencies' features differently, which rebuilds most of them).
for crate in "${crates[@]}"; do
    cargo test --release -q --no-run -p "$crate" --lib 2>/dev/null ||
        cargo test --release --no-run -p "$crate" --lib || exit 1
done

summary=()
failed=0
for crate in "${crates[@]}"; do
    list=$(cargo test --release -q -p "$crate" --lib -- --list "${extra[@]}" 2>/dev/null |
        sed -n 's/: test$//p' | grep -E "(^|::)${filter}" || true)
    for test in $list; do
        start=$(date +%s.%N)
        log=$(cargo test --release -q -p "$crate" --lib -- --exact "$test" --nocapture \
            "${extra[@]}" 2>&1)
        rc=$?
        secs=$(echo "$(date +%s.%N) - $start" | bc)
        n=$(echo "$log" | sed -n 's/^fuzz: .*: \([0-9]*\) cases$/\1/p' | tail -n1)
        status=ok
        grep -q ' 1 ignored' <<<"$log" && status=ignored
        if [[ $rc -ne 0 ]]; then
            status=FAILED
            failed=$((failed + 1))
            echo "$log" | tail -n 40
        fi
        line=$(printf '%-16s %-34s %8s cases %8.1f s  %s' "$crate" "${test##*::}" "${n:-fixed}" "$secs" "$status")
        echo "$line"
        summary+=("$line")
    done
done
echo
printf '%s\n' "${summary[@]}"
echo "$(( ${#summary[@]} - failed )) passed, $failed failed"
[[ $failed -eq 0 ]]
