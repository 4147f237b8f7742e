#!/usr/bin/env bash
# Runs the fuzz targets one after another for a bounded time each, then prints one line per
# target: seconds, executions, corpus size, findings, and how to reproduce.
#
#   bash fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]     (default: 600 s, every target)
#
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`). Each target starts
# from its working corpus fuzz/corpus/<target>/ (kept between runs, not committed) and the
# committed seeds fuzz/seeds/<target>/; new inputs go to the working corpus. Logs go to
# fuzz/logs/<target>.log, crashes, timeouts and out-of-memory inputs to
# fuzz/artifacts/<target>/. Exits 1 if any target found one (or failed to run).
set -euo pipefail

cd "$(dirname "$0")/.."
seconds="${1:-600}"
shift || true
all_targets=(json_decoder document continuation query auth)
if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    targets=("${all_targets[@]}")
fi
case "$seconds" in
    '' | *[!0-9]*)
        echo "usage: $0 [SECONDS_PER_TARGET] [TARGET...]" >&2
        exit 2
        ;;
esac

# Release with debug assertions: overflow checks find bugs a release build would hide.
build_flags=(-O --debug-assertions)
echo "building the fuzz targets (cargo +nightly fuzz build ${build_flags[*]})"
cargo +nightly fuzz build "${build_flags[@]}"

mkdir -p fuzz/logs
libfuzzer_flags=(
    -max_total_time="$seconds"
    -rss_limit_mb=2048
    -malloc_limit_mb=2048
    -timeout=10
    -max_len=65536
    -print_final_stats=1
)
summary=()
failed=0
for target in "${targets[@]}"; do
    if [ ! -d "fuzz/seeds/$target" ]; then
        echo "no seeds for target '$target' (fuzz/seeds/$target)" >&2
        exit 2
    fi
    corpus="fuzz/corpus/$target"
    artifacts="fuzz/artifacts/$target"
    log="fuzz/logs/$target.log"
    mkdir -p "$corpus" "$artifacts"
    marker="$artifacts/.run-started"
    touch "$marker"
    echo "fuzzing $target for ${seconds}s (log: $log)"
    started=$(date +%s)
    # The fuzzer stops by itself after max_total_time; the outer timeout only guards against a
    # hang outside it (a target stuck past -timeout is reported as a timeout artifact).
    status=0
    timeout --kill-after=30 $((seconds + 300)) \
        cargo +nightly fuzz run "${build_flags[@]}" "$target" "$corpus" "fuzz/seeds/$target" -- \
        "${libfuzzer_flags[@]}" >"$log" 2>&1 || status=$?
    elapsed=$(($(date +%s) - started))
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    corpus_size=$(find "$corpus" -type f | wc -l)
    # Artifacts of this run only (earlier runs' stay in the folder).
    new_artifacts() { find "$artifacts" -type f -newer "$marker" -name "$1" | wc -l; }
    crashes=$(new_artifacts 'crash-*')
    timeouts=$(new_artifacts 'timeout-*')
    ooms=$(new_artifacts 'oom-*')
    found=$(new_artifacts '*')
    if [ "$found" -gt 0 ] || [ "$status" -ne 0 ]; then
        failed=1
        newest=$(find "$artifacts" -type f -newer "$marker" -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2-)
        reproduce="cargo +nightly fuzz run ${build_flags[*]} $target ${newest:-<artifact>}"
        verdict="FAILED (exit $status, $found new artifact(s))"
        # `cargo fuzz run` rebuilds when the sources changed since the build above.
        if [ "$found" -eq 0 ] && grep -q '^error' "$log"; then
            verdict="FAILED: did not build or start, see $log"
        fi
    else
        reproduce="cargo +nightly fuzz run ${build_flags[*]} $target $corpus fuzz/seeds/$target -- -max_total_time=$seconds"
        verdict="ok"
    fi
    summary+=("$(printf '%-13s %5ss  execs=%-10s corpus=%-6s crashes=%s timeouts=%s ooms=%s  %s\n    reproduce: %s' \
        "$target" "$elapsed" "${execs:-?}" "$corpus_size" "$crashes" "$timeouts" "$ooms" "$verdict" "$reproduce")")
done

echo
echo "fuzz summary ($(date -u +%Y-%m-%dT%H:%M:%SZ), ${seconds}s per target):"
for line in "${summary[@]}"; do
    echo "$line"
done
exit "$failed"
