#!/usr/bin/env bash
# `make test` after setup and lint: every test, in three pytest streams, two at a time, with the tools the later
# streams need built in the background.
#
#   unit      runtime/tests, operator/tests, bench/tests: Paddle models, gRPC servers, pure logic; needs no tool
#   simulated the e2e modules that need only the control plane and helm (kwok's simulated nodes; e2e/conftest.py
#             lists them): needs `devtools/controlplane/build.sh` and `helm.sh`
#   tools     tests/, charts/tests and every other e2e module (the real node, the images, Prometheus, Jaeger, the
#             NetworkPolicy engine): needs everything `make controlplane` and `scripts/images.sh build` make
#
# Why: measured on 2 cores (docs/e2e.md, "CI time"), each stream leaves about half the CPU idle (it waits on
# servers, pods and clients), so two streams side by side take little longer than the slower one; a third would
# oversubscribe the cores and stretch the tests' own timing. The builds run under the idle scheduling class
# (`chrt --idle`): they get only CPU that no test wants, so cold they fill the streams' idle half, and warm they are
# checks of a second or less. A stream starts as soon as what it needs is built and fewer than
# $SKIFF_TEST_STREAMS (default 2; 1 runs them one after another) streams run. Each stream's lines are prefixed with
# its name; every stream runs even when another failed, so one run reports every failure. Exit status: non-zero when
# a build or any stream failed.
#
# SKIFF_E2E_REQUIRED=1 in every stream: a missing tool or cluster fails a test instead of skipping it. Extra pytest
# arguments: PYTEST_ADDOPTS (pytest reads it itself).
set -uo pipefail
cd "$(dirname "$0")/.."
export SKIFF_E2E_REQUIRED=1
PY=.venv/bin/python
MAX="${SKIFF_TEST_STREAMS:-2}"
idle=(chrt --idle 0)
"${idle[@]}" true 2>/dev/null || idle=(nice -n 19)  # a kernel without SCHED_IDLE: the lowest nice level instead
state="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$state"' EXIT
start=$SECONDS
minutes() { echo "$(( (SECONDS - start) / 60 ))m$(( (SECONDS - start) % 60 ))s"; }

# Runs "$@" in the background with its lines prefixed [$1]; its exit status lands in $state/$1.
background() {
  local name="$1"; shift
  ( "$@" 2>&1 | sed -u "s/^/[$name] /"; echo "${PIPESTATUS[0]}" > "$state/$name.rc" ) &
}
finished() { [[ -f "$state/$1.rc" ]]; }
succeeded() { [[ "$(cat "$state/$1.rc" 2>/dev/null)" == 0 ]]; }

build_control_plane() {
  "${idle[@]}" bash devtools/controlplane/build.sh && "${idle[@]}" bash devtools/controlplane/helm.sh
}
build_tools() {
  "${idle[@]}" bash devtools/prometheus-go/build.sh && "${idle[@]}" bash devtools/jaeger-go/build.sh \
    && "${idle[@]}" bash devtools/network-policies-go/build.sh || return 1
  # The images last; where the image tools are missing, the tests that need images say so themselves.
  if bash scripts/images.sh check >/dev/null 2>&1; then "${idle[@]}" bash scripts/images.sh build; fi
}
stream_unit() { $PY -m pytest runtime/tests operator/tests bench/tests; }
stream_simulated() { $PY -m pytest e2e -m "not tools"; }
stream_tools() { $PY -m pytest tests charts/tests e2e -m "tools or not cluster"; }

echo "==> building in the background (${idle[*]}): the control plane and helm, then Prometheus, Jaeger, the"
echo "    NetworkPolicy engine and the images; lines prefixed [control-plane] and [build-tools]"
# Their exit statuses land in $state/build-*.rc, apart from the streams' ($state/<stream>.rc).
( build_control_plane 2>&1 | sed -u "s/^/[control-plane] /"; rc=${PIPESTATUS[0]}
  echo "$rc" > "$state/build-control-plane.rc"
  if (( rc == 0 )); then build_tools 2>&1 | sed -u "s/^/[build-tools] /"; echo "${PIPESTATUS[0]}" > "$state/build-tools.rc"
  else echo 1 > "$state/build-tools.rc"; fi ) &

declare -A needs=([unit]="" [simulated]=build-control-plane [tools]=build-tools)
order=(unit simulated tools)
declare -A status
for name in "${order[@]}"; do status[$name]=waiting; done
while :; do
  running=0 waiting=0
  for name in "${order[@]}"; do
    if [[ ${status[$name]} == running ]] && finished "$name"; then
      status[$name]=done
      echo "==> stream $name finished ($(cat "$state/$name.rc" 2>/dev/null)) at $(minutes)"
    fi
    [[ ${status[$name]} == running ]] && running=$((running + 1))
  done
  for name in "${order[@]}"; do
    [[ ${status[$name]} == waiting ]] || continue
    need="${needs[$name]}"
    if [[ -n "$need" ]] && finished "$need" && ! succeeded "$need"; then
      status[$name]=skipped
      echo "error: stream $name not run: building $need failed (its lines above say where); rerun: make controlplane" >&2
      continue
    fi
    if (( running < MAX )) && { [[ -z "$need" ]] || succeeded "$need"; }; then
      echo "==> stream $name starting at $(minutes)"
      background "$name" "stream_$name"
      status[$name]=running
      running=$((running + 1))
    else
      waiting=$((waiting + 1))
    fi
  done
  (( running == 0 && waiting == 0 )) && break
  sleep 2
done

failed=0
for name in "${order[@]}"; do
  rc="$(cat "$state/$name.rc" 2>/dev/null || echo "not run")"
  echo "==> stream $name: exit $rc"
  [[ "$rc" == 0 ]] || failed=1
done
echo "==> every stream done in $(minutes)"
exit "$failed"
