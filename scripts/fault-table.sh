#!/usr/bin/env bash
# Runs every test that injects a fault into real processes (strace fails or
# kills a system call, SIGSTOP, SIGKILL, a full file system, a rank that never
# starts) and prints the table of docs/RELIABILITY.md: each fault and what
# came of it, as the tests observed it (gtest properties fault_N, see
# tests/support/fault_jobs.h), and whether the test passed.
#   bash scripts/fault-table.sh            # builds first; about 10 minutes on 2 cores
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
bash scripts/build.sh distckpt_tests >/dev/null
filter='IoFaultTest.*:DiskFullTest.*:Faults/LocalSaveFaultTest.*:ExportFaultTest.*:HungRankTest.*:PeerFaultTest.*:TransferFault.*:DirectReads.Where*:DirectReads.AReadFailing*'
report=$(mktemp -t distckpt-fault-table.XXXXXX.json)
trap 'rm -f "$report"' EXIT
OMP_NUM_THREADS=1 "$BUILD_DIR/tests/distckpt_tests" --gtest_filter="$filter" --gtest_output="json:$report" \
  >/dev/null 2>&1 || true
python3 - "$report" <<'PY'
import json, re, sys
doc = json.load(open(sys.argv[1]))
print("| test | fault injected | observed result | test |")
print("|---|---|---|---|")
for suite in doc["testsuites"]:
    for test in suite["testsuite"]:
        faults = sorted((k for k in test if k.startswith("fault_")), key=lambda k: int(k.split("_")[1]))
        status = "skipped" if test.get("result") == "SKIPPED" else ("FAILED" if test.get("failures") else "passed")
        name = f'{suite["name"]}.{test["name"]}'
        if not faults:
            print(f"| {name} | (none recorded) | | {status} |")
        for k in faults:
            fault, _, outcome = test[k].partition(" => ")
            row = f"| {name} | {fault} | {outcome} | {status} |".replace("\n", " ")
            print(re.sub(r"/tmp/distckpt-[A-Za-z0-9-]+", "<tmp>", row))  # the same table on every run
PY
