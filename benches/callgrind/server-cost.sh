#!/bin/sh
# Counts, with callgrind, the instructions redis-server spends on each phase of the `server-cost`
# workload of the `locks` benchmark (Redis's work per lock+unlock cycle of each lock type, per
# acquire and per release, and per part of a script), and prints them per operation.
#
#   benches/callgrind/server-cost.sh [OUT_DIR]     (default target/locksmith-bench/callgrind)
#
# Every redis-server the bench starts runs under valgrind (through LOCKSMITH_TEST_SERVER); the
# workload's own server dumps its counts at each CONFIG RESETSTAT, which the workload sends
# where each phase begins and where it ends, so dump 2k holds phase k. Instruction counts
# do not depend on the machine's load, unlike the workload's microseconds. Needs valgrind
# (callgrind_annotate) and python3; takes a few minutes (Redis runs about 50 times slower).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/target/locksmith-bench/callgrind}
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -f "$out"/callgrind.out.*
server=${REDIS_SERVER:-redis-server}
wrapper="$out/redis-server-under-callgrind"
cat >"$wrapper" <<WRAP
#!/bin/sh
exec valgrind --tool=callgrind --dump-before=configResetStatCommand \
  --callgrind-out-file=$out/callgrind.out.%p $server "\$@"
WRAP
chmod +x "$wrapper"
cd "$root"
LOCKSMITH_TEST_SERVER="$wrapper" cargo bench --bench locks -- --only server-cost --quick \
  >"$out/bench.txt" 2>&1 || { cat "$out/bench.txt"; exit 1; }
python3 "$root/benches/callgrind/phases.py" "$out"
