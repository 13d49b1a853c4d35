#!/usr/bin/env bash
# benchmarks/bench.py --help lists every scenario of the table that bench.py runs from (add_scenario() and
# OTHER_SCENARIOS in bench_common.py), each with its line from the table and nothing else; every one listed
# is accepted by --scenarios (--plan: no root, no GPU, nothing run) and a name not listed is refused.
#
#   bench_help.sh PATH/TO/bench.py
set -euo pipefail
bench=${1:?usage: bench_help.sh PATH/TO/bench.py}
T=$(mktemp -d /tmp/cuda-criu-bench-help.XXXXXX)
trap 'rm -rf "$T"' EXIT
failures=0

# At a narrow width too: a description wrapped over lines is still found whole.
for columns in 80 200; do
	COLUMNS=$columns python3 "$bench" --help >"$T/help.$columns" || {
		echo "FAIL --help (COLUMNS=$columns) exited $?"
		exit 1
	}
done

# Prints the table's names, one a line; fails (naming them) where --help's list and the table differ.
if python3 - "$bench" "$T/help.80" "$T/help.200" >"$T/names" 2>"$T/differ" <<'EOF'; then
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[1])))
from bench_common import OTHER_SCENARIOS, SCENARIO_HELP  # noqa: E402

table = {**SCENARIO_HELP, **OTHER_SCENARIOS}
print("\n".join(table))
bad = False
for path in sys.argv[2:]:
    text = open(path).read()
    section = text.split("\nscenarios (", 1)
    if len(section) != 2:
        print(f"{path}: no list of scenarios", file=sys.stderr)
        bad = True
        continue
    listed, name = {}, None
    for line in section[1].splitlines()[1:]:
        m = re.match(r"  (\S+)\s+(.*)", line)
        if m:
            name = m.group(1)
            listed[name] = m.group(2)
        elif name and line.strip():
            listed[name] += " " + line.strip()
    for n in table:
        if n not in listed:
            print(f"{path}: scenario {n} missing from --help", file=sys.stderr)
            bad = True
        elif " ".join(listed[n].split()) != " ".join(table[n].split()):
            print(f"{path}: scenario {n}: --help says {listed[n]!r}, the table {table[n]!r}", file=sys.stderr)
            bad = True
    for n in sorted(set(listed) - set(table)):
        print(f"{path}: --help lists {n}, which is not in the table", file=sys.stderr)
        bad = True
sys.exit(1 if bad else 0)
EOF
	echo "ok   --help lists the $(wc -l <"$T/names") scenarios of the table, each with its line"
else
	echo "FAIL --help and the table of scenarios differ:"
	cat "$T/differ"
	failures=$((failures + 1))
fi

# Each listed scenario is accepted and planned (the plan names it).
names=$(paste -sd, "$T/names")
if python3 "$bench" --scenarios "$names" --variants ours --rounds 1 --plan >"$T/plan" 2>&1; then
	missing=$(while read -r n; do grep -qE "^\[bench [0-9:]+\]   ${n}[ :]" "$T/plan" || echo "$n"; done <"$T/names")
	if [ -z "$missing" ]; then
		echo "ok   --scenarios $names --plan: each one planned"
	else
		echo "FAIL --plan does not name: $missing"
		failures=$((failures + 1))
	fi
else
	echo "FAIL --scenarios $names --plan was refused: $(tail -3 "$T/plan")"
	failures=$((failures + 1))
fi

# A name not in the list is refused, by name.
if python3 "$bench" --scenarios 4g,no-such-scenario --plan >"$T/unknown" 2>&1; then
	echo "FAIL --scenarios no-such-scenario was accepted"
	failures=$((failures + 1))
elif grep -q "unknown scenario(s) no-such-scenario" "$T/unknown"; then
	echo "ok   --scenarios no-such-scenario: refused"
else
	echo "FAIL --scenarios no-such-scenario: refused without naming it: $(cat "$T/unknown")"
	failures=$((failures + 1))
fi

[ "$failures" = 0 ]
