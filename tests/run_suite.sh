#!/usr/bin/env bash
# `make test` after `make deps`: lint, the image and the test cloud beside the suite, not
# before it (they took ~7 of CI's 25 minutes first, and only the test cloud's and podman's
# tests need the last two: those wait for theirs, tests/support/prep.py). Each preparation
# logs to .sco/prep/<name>.log and leaves its exit code in <name>.rc; this script says when
# each is done and fails when lint, the test cloud or the tests failed. Set by the Makefile:
# PYTEST (the pytest command line), TESTCLOUD (1: bring the test cloud up).
set -uo pipefail
cd "$(dirname "$0")/.."
PREP=.sco/prep
rm -rf "$PREP" && mkdir -p "$PREP"

prepare() {  # prepare NAME COMMAND...: in the background, its log and exit code in $PREP
    local name=$1
    shift
    : >"$PREP/$name.log"
    (
        start=$(date +%s)
        "$@" >"$PREP/$name.log" 2>&1
        rc=$?
        echo "$rc" >"$PREP/$name.rc.part" && mv "$PREP/$name.rc.part" "$PREP/$name.rc"
        echo "sco: $name done in $(($(date +%s) - start)) s (exit $rc, $PREP/$name.log)"
    ) &
}

# Lint is on no test's path and the image's chain is shorter than the test cloud's: nice
# them, so the test cloud's bring-up (the longest chain: bring-up, then its serial tests) gets
# the cores first.
prepare lint nice -n 10 make --no-print-directory lint
if [ "${TESTCLOUD:-1}" = 1 ]; then prepare testcloud make --no-print-directory testcloud-up; fi
if command -v podman >/dev/null; then prepare image nice -n 5 make --no-print-directory image; fi

SCO_PREP_DIR=$PREP SCO_FIXTURE_TIMES=.sco/fixture-times.json SCO_TEST_TIMELINE=.sco/test-timeline.json \
    eval "$PYTEST"
rc=$?
if [ $rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; rc=1; fi
wait

# The image's own tests build it again and say why; lint and the test cloud fail the run.
for name in lint testcloud; do
    [ -f "$PREP/$name.log" ] || continue
    code=$(cat "$PREP/$name.rc" 2>/dev/null || echo "?")
    if [ "$code" != 0 ]; then
        echo "sco: $name failed (exit $code); the end of $PREP/$name.log:" >&2
        tail -n 30 "$PREP/$name.log" >&2
        rc=1
    fi
done
exit $rc
