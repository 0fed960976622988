#!/bin/bash
# Counts, with callgrind, the instructions Redis spends per renewed lock in a 128-lease call of
# the batched renewal (src/protocol/scripts/renew_batch.lua on a single master) and of a few
# variants and floors, so that a change to the script can be weighed without the noise of a
# loaded machine (see docs/performance.md, "Renewal").
#
#   benches/callgrind/renew-variants.sh [OUT_DIR]   (default target/locksmith-bench/renew-variants)
#
# Needs valgrind (callgrind_annotate), redis-server, redis-cli, redis-benchmark and python3;
# about a minute. Prints one line per variant: instructions per lock of the whole server
# (reading, parsing, running, replying) and of `evalShaCommand` alone, from 500 calls between
# two `CONFIG RESETSTAT` dumps.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/target/locksmith-bench/renew-variants}
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -f "$out"/callgrind.out.*
port=${PORT:-18124}
n=128
# 128 locks as the library writes them (a 22-character acquisition prefix and a counter),
# and the call's arguments: no fencing mark, one run of n leases of 3 s.
python3 - "$out" "$n" <<'PY'
import sys
out, n = sys.argv[1], int(sys.argv[2])
prefix = "AbCdEfGhIjKlMnOpQrStUv"
keys = [f"locksmith:{{bench:renew:{i}}}:lock" for i in range(n)]
gens = [f"{prefix}{i + 4096:x}|" for i in range(n)]
owner = "0123456789abcdef0123456789abcdef:1"
with open(f"{out}/setup.txt", "w") as f:
    for k, g in zip(keys, gens):
        f.write(f"SET {k} {g}{owner}|0|1700000000|123456 PX 300000000\n")
with open(f"{out}/args.txt", "w") as f:
    f.write(" ".join([str(n)] + keys + ["0", "1", "3000", str(n)] + gens))
PY
body=$(sed -n '/^local fence/,$p' "$root/src/protocol/scripts/renew_batch.lua")
# raise_mark (prelude/fence.lua) is never called without marks.
stub="local function raise_mark() end
"
get_check="local v, g = pcall('get', KEYS[i]), ARGV[gens + i]
    if type(v) == 'string' and string.sub(v, 1, #g) == g then"
declare -A variant=(
  [1-script]="$stub$body"
  [2-get-and-sub]="$stub$(python3 -c '
import re, sys
b = sys.stdin.read()
start = b.index("    local g = ARGV[gens + i]")
end = b.index("== g then", start) + len("== g then")
print(b[:start] + sys.argv[1] + b[end:])' "    $get_check" <<<"$body")"
  [3-floor-arguments-only]="local n = #KEYS local s = 0 for i = 1, n do local k, g = KEYS[i], ARGV[4 + i] s = s + #g end return {}"
  [4-floor-check-only]="local n = #KEYS local f = {} for i = 1, n do local g = ARGV[4 + i] if redis.pcall('getrange', KEYS[i], '0', tostring(#g - 1)) ~= g then f[#f + 1] = i end end return f"
  [5-floor-empty]="return {}"
)
for name in $(printf '%s\n' "${!variant[@]}" | sort); do
  valgrind --tool=callgrind --dump-before=configResetStatCommand \
    --callgrind-out-file="$out/callgrind.out.$name.%p" \
    redis-server --port "$port" --save "" --appendonly no >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done
  redis-cli -p "$port" <"$out/setup.txt" >/dev/null
  sha=$(redis-cli -p "$port" script load "${variant[$name]}")
  # shellcheck disable=SC2046
  redis-benchmark -p "$port" -n 100 -c 1 -q evalsha "$sha" $(cat "$out/args.txt") >/dev/null
  failed=$(redis-cli -p "$port" evalsha "$sha" $(cat "$out/args.txt") | grep -c . || true)
  redis-cli -p "$port" config resetstat >/dev/null
  # shellcheck disable=SC2046
  redis-benchmark -p "$port" -n 500 -c 1 -q evalsha "$sha" $(cat "$out/args.txt") >/dev/null
  redis-cli -p "$port" config resetstat >/dev/null
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$pid" || true
  dump=$(ls "$out"/callgrind.out."$name".*.2 | head -1)
  total=$(grep -m1 '^summary:\|^totals:' "$dump" | awk '{print $2}')
  ev=$(callgrind_annotate --inclusive=yes "$dump" | grep -m1 evalShaCommand | awk '{gsub(",","",$1); print $1}')
  printf '%-26s %6d instructions per lock (evalShaCommand %6d); leases not extended: %s\n' \
    "$name" $((total / 500 / n)) $((ev / 500 / n)) "$failed"
done
