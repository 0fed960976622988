#!/usr/bin/env python3
"""Instructions per operation of each phase of the `server-cost` workload, from the callgrind
dumps that benches/callgrind/server-cost.sh collects (see there). Usage: phases.py OUT_DIR.

Columns, per operation (a lock+unlock cycle, an acquire, a release, or one call of a part):
  command   parsing and running the client's commands (processInputBuffer, less the harness's
            INFO), without socket reads and writes
  script    EVALSHA (or FCALL), whole (evalShaCommand or fcallCommand, inclusive)
  calls     the commands the script runs through redis.call, each from lookup, ACL check and
            the command itself to its reply (scriptCall, inclusive)
  lua       Lua: the script's own code, and turning each redis.call's arguments into a command
            and its reply back into Lua values (lua_pcall less calls)
  args      KEYS and ARGV made into Lua tables, the script's reply turned into Redis's, and
            the call's set-up (luaCallFunction less lua_pcall and lua_gc)
  gc        the Lua garbage-collector step Redis runs after each script (lua_gc)
  evalsha   finding the script by its SHA (or the function by its name) and preparing the
            run (evalShaCommand or fcallCommand, less luaCallFunction)
"""
import os
import re
import subprocess
import sys

FUNCS = [
    "processInputBuffer",
    "infoCommand",
    "evalShaCommand",
    "fcallCommand",
    "luaCallFunction",
    "lua_pcall",
    "scriptCall",
    "lua_gc",
]


def inclusive(path):
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", path],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    costs = {}
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+) .*?(?:\?\?\?|[^:\s]+):(\w+)\b", line)
        if m and m.group(2) in FUNCS and m.group(2) not in costs:
            costs[m.group(2)] = int(m.group(1).replace(",", ""))
    return costs


def main():
    out = sys.argv[1]
    bench = open(os.path.join(out, "bench.txt")).read()
    pid = re.search(r"redis-server pid (\d+) for this workload", bench).group(1)
    phases = re.findall(r"phase (\d+): (.+?), (\d+) operations", bench)
    print(f"{'phase':<62} {'command':>8} {'script':>8} {'calls':>8} {'lua':>8} {'args':>8} {'gc':>8} {'evalsha':>8}")
    for k, name, ops in phases:
        path = os.path.join(out, f"callgrind.out.{pid}.{2 * int(k)}")
        if not os.path.exists(path):
            print(f"{name}: no dump {path}")
            continue
        c = inclusive(path)
        g = lambda f: c.get(f, 0)
        n = int(ops)
        row = [
            g("processInputBuffer") - g("infoCommand"),
            g("evalShaCommand") + g("fcallCommand"),
            g("scriptCall"),
            g("lua_pcall") - g("scriptCall"),
            g("luaCallFunction") - g("lua_pcall") - g("lua_gc"),
            g("lua_gc"),
            g("evalShaCommand") + g("fcallCommand") - g("luaCallFunction"),
        ]
        print(f"{name:<62} " + " ".join(f"{v / n:>8,.0f}" for v in row))


main()
