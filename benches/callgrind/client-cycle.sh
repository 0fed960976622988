#!/bin/sh
# Counts, with callgrind, the instructions the client spends per deduplicating-save cycle (the
# `capacity` workload's cycle, in one process of 16 threads: see benches/client-cycle/), for
# bare SET pairs, the naive lock and locksmith's Mutex, and prints them with their ratios to
# the SET pairs. Instruction counts do not depend on the machine's load, unlike CPU time.
#
#   benches/callgrind/client-cycle.sh [OUT_DIR]   (default target/locksmith-bench/client-cycle)
#
# Each kind runs twice under callgrind, 100 and 300 cycles a thread; the difference over the
# 3,200 cycles between them leaves out the start (the server, the connections, the scripts).
# callgrind counts the client process alone (redis-server is another process). Needs valgrind
# and redis-server; a few minutes. Without valgrind, `benches/client-cycle` run on its own
# (`cargo run --release -- all 2000 3` in that folder) prints CPU time per cycle instead.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/target/locksmith-bench/client-cycle}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cargo build --release --quiet --manifest-path "$root/benches/client-cycle/Cargo.toml" \
  --target-dir "$root/target/client-cycle"
bin=$root/target/client-cycle/release/client-cycle
count() { # kind cycles-per-thread -> instructions of the whole run
  valgrind --tool=callgrind --callgrind-out-file="$out/callgrind.out.$1.$2" "$bin" "$1" "$2" 1 \
    2>&1 | awk '/Collected/ { print $4 }'
}
bare=
for kind in bare naive ls; do
  a=$(count "$kind" 100)
  b=$(count "$kind" 300)
  per=$(( (b - a) / 3200 ))
  [ -n "$bare" ] || bare=$per
  echo "$kind instructions per cycle: $per ($(python3 -c "print(f'{$per / $bare:.2f}')") x SET pairs)"
done
