#!/bin/bash
# Counts, with callgrind, the instructions Redis spends per call of a few one-script variants of
# a Mutex acquire's fast path, to weigh ways of raising the slot's fencing mark (see
# docs/performance.md, "The fencing mark"). Each variant takes a free lock (`TIME`, `SET NX PX`),
# does its part with the mark, and frees the lock again (`DEL`), so that every call takes the
# fast path.
#
#   benches/callgrind/mark-variants.sh [OUT_DIR]    (default target/locksmith-bench/mark-variants)
#
# Needs valgrind (callgrind_annotate), redis-server, redis-cli and redis-benchmark; about a
# minute. Prints one line per variant: its name and instructions per call (`evalShaCommand`,
# inclusive), from 2,000 calls between two `CONFIG RESETSTAT` dumps.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/target/locksmith-bench/mark-variants}
mkdir -p "$out"
rm -f "$out"/callgrind.out.*
port=${PORT:-18123}
req='req12345678901234567890|0123456789abcdef:12/host:1234/main|16'
head="local t=redis.call('time') local v=ARGV[1]..'|'..t[1]..'|'..t[2] if redis.call('set',KEYS[1],v,'nx','px',ARGV[2]) then local token=t[1]*1000000+t[2]"
tail="redis.call('del',KEYS[1]) return token end"
declare -A variant=(
  [1-time-set-nx-del]="$head $tail"
  [2-get-mark]="$head local m=redis.call('get',KEYS[2]) $tail"
  [3-set-get-built-string]="$head local m=redis.pcall('set',KEYS[2],v,'get') $tail"
  [4-set-get-number]="$head local m=redis.pcall('set',KEYS[2],token,'get') $tail"
  [5-set-get-number-compared]="$head local m=redis.pcall('set',KEYS[2],token,'get') if m and tonumber(m)>=token then return 0 end $tail"
  [6-as-acquire-lua]="$head local m=redis.pcall('set',KEYS[2],token+(tonumber(string.match(ARGV[1],'%d+\$',-4) or 0) or 0),'get') if type(m)=='table' then return m end if m and (tonumber(m) or 0)>=token then return 0 end $tail"
  [7-fixed-width-string-compared]="$head local m=redis.pcall('set',KEYS[2],t[1]..string.sub('00000'..(t[2]+16),-6),'get') if m and m>=t[1]..string.sub('00000'..t[2],-6) then return 0 end $tail"
)
for name in $(printf '%s\n' "${!variant[@]}" | sort); do
  valgrind --tool=callgrind --dump-before=configResetStatCommand \
    --callgrind-out-file="$out/callgrind.out.$name.%p" \
    redis-server --port "$port" --save "" --appendonly no >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done
  sha=$(redis-cli -p "$port" script load "${variant[$name]}")
  redis-benchmark -p "$port" -n 200 -c 1 -q evalsha "$sha" 2 "{a}lock" "{a}fence" "$req" 30000 >/dev/null
  redis-cli -p "$port" config resetstat >/dev/null
  redis-benchmark -p "$port" -n 2000 -c 1 -q evalsha "$sha" 2 "{a}lock" "{a}fence" "$req" 30000 >/dev/null
  redis-cli -p "$port" config resetstat >/dev/null
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$pid" || true
  dump=$(ls "$out"/callgrind.out."$name".*.2 | head -1)
  total=$(callgrind_annotate --inclusive=yes "$dump" | grep -m1 evalShaCommand | awk '{gsub(",","",$1); print $1}')
  printf '%-32s %8d instructions per call\n' "$name" $((total / 2000))
done
