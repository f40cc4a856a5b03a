#!/usr/bin/env bash
# Where a long MPI_Allreduce over the NIC's messages spends its time on a machine with cores to
# spare: coll_bench's sum of doubles through coll/nicbar (`coll_nicbar_allreduce_algorithm 0`),
# one size per run, under daemons of several NIC thread counts, with the CPU time the daemon's
# threads spent per allreduce beside the allreduce's own time (a NIC thread busy all along is
# what bounds it; one mostly idle is waiting for the processes); Open MPI's own over shared
# memory and TCP in the same rounds. Runs alternate; ROUNDS of each, medians.
#
# usage: long.sh [OUT]   (from a bundle made by bundle.sh; OUT defaults to ./out)
# SIZES: processes (default "2 8"); BYTES: vector sizes (default "1048576 16777216"); THREADS:
# the daemon's NIC thread counts (default "1 2 8"); ROUNDS (default 2); BUDGET_MS per run (300);
# NICCTL: another nicctl to run the daemons with (a build to compare). Appends to OUT/long.txt.
set -u
D=$(cd "$(dirname "$0")" && pwd)
B=$D/bin
O=${1:-$D/out}
SIZES=${SIZES:-2 8}
BYTES=${BYTES:-1048576 16777216}
THREADS=${THREADS:-1 2 8}
ROUNDS=${ROUNDS:-2}
BUDGET_MS=${BUDGET_MS:-300}
NICCTL=${NICCTL:-$B/nicctl}
S=$O/long.txt
. "$D/out.sh"

. "$D/mpi.sh"

# One coll_bench run of one size: "µs" or "µs/nic_ms" (with DAEMON set: the daemon's CPU ms
# per allreduce, the warm-up counted), else "failed".
once() {
  local bytes=$1 before=0; shift
  [ -n "${DAEMON:-}" ] && before=$(cpu_ns $DAEMON)
  timeout 120 "$@" "$B/coll_bench" $bytes $BUDGET_MS 0 allreduce > "$W/last" 2>&1
  local us iterations
  us=$(sed -n 's/^result .* us=\([0-9.]*\) iterations=.*/\1/p' "$W/last")
  iterations=$(sed -n 's/^result .* iterations=\([0-9]*\).*/\1/p' "$W/last")
  [ -n "$us" ] || { echo failed; return; }
  if [ -n "${DAEMON:-}" ]; then
    awk -v us="$us" -v ns=$(($(cpu_ns $DAEMON) - before)) -v n="$iterations" \
      'BEGIN {printf "%s/%.2f", us, ns / 1e6 / (n + 1)}'
  else
    echo "$us"
  fi
}
median() {
  tr ' ' '\n' | grep -v '^$' | cut -d/ -f"$1" | sort -g |
    awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'
}

chmod +x "$B"/* 2>/dev/null
say "## $(date +%T) machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2); daemons $NICCTL"
say "## MPI_Allreduce of doubles, coll_bench BYTES $BUDGET_MS, $ROUNDS alternating rounds, medians: µs, and for nicbar the NIC threads' CPU ms per allreduce"
for p in $SIZES; do
  for bytes in $BYTES; do
    declare -A runs=()
    for _ in $(seq "$ROUNDS"); do
      DAEMON=
      runs[shm]="${runs[shm]:-} $(once $bytes $(mr $p) $OWN_SHM)"
      runs[tcp]="${runs[tcp]:-} $(once $bytes $(mr $p) $OWN_TCP)"
      for t in $THREADS; do
        export NICBAR_SOCKET=$W/control.sock
        "$NICCTL" emulate --units 16 --threads $t --socket "$NICBAR_SOCKET" > "$W/daemon.log" 2>&1 & DAEMON=$!
        for _ in $(seq 100); do [ -S "$NICBAR_SOCKET" ] && break; sleep 0.05; done
        runs[t$t]="${runs[t$t]:-} $(once $bytes $(mr $p) $(nicbar --mca coll_nicbar_allreduce_algorithm 0))"
        kill $DAEMON; wait $DAEMON 2>/dev/null; rm -f "$NICBAR_SOCKET"
      done
    done
    line="P=$p bytes=$bytes: Open MPI shm $(median 1 <<< "${runs[shm]}") TCP $(median 1 <<< "${runs[tcp]}")"
    for t in $THREADS; do
      line="$line; nicbar $t thread(s) $(median 1 <<< "${runs[t$t]}") (NIC $(median 2 <<< "${runs[t$t]}") ms)"
    done
    say "$line"
    say "    runs: shm${runs[shm]} / tcp${runs[tcp]}$(for t in $THREADS; do echo -n " / t$t${runs[t$t]}"; done)"
    unset runs
  done
done
say "## $(date +%T) done"
