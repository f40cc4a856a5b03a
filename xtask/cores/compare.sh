#!/usr/bin/env bash
# Where an 8-byte allreduce in the NIC loses time against the NIC barrier it is built on, on a
# machine with cores to spare: the same unmodified MPI program (`barrier_bench`) times
# MPI_Barrier and an 8-byte MPI_Allreduce through coll/nicbar, and through Open MPI's own over
# TCP, the runs alternating, ROUNDS of each, medians (the blocking call's mean, and the
# non-blocking one's overlap with computation as OSU computes it); then `bench_nic_allreduce`
# times the two in the NIC with no MPI and no C in between (members as threads of one process).
#
# usage: compare.sh [OUT]   (from a bundle made by bundle.sh; OUT defaults to ./out)
# SIZES (default "8 16"), ITERATIONS (default 5000), ROUNDS (default 3) and ENGINES shape the
# run. ENGINES lists the settings measured through coll/nicbar, `;` between them, each the
# daemon's arguments and, after a `|`, Open MPI's for the program (default "--idle adaptive;--idle
# adaptive --nice -10"). Appends to OUT/compare.txt.
set -u
D=$(cd "$(dirname "$0")" && pwd)
B=$D/bin
O=${1:-$D/out}
SIZES=${SIZES:-8 16}
ITERATIONS=${ITERATIONS:-5000}
ROUNDS=${ROUNDS:-3}
ENGINES=${ENGINES:---idle adaptive;--idle adaptive --nice -10}
S=$O/compare.txt
. "$D/out.sh"

. "$D/mpi.sh"

# One barrier_bench run: "µs:overlap%", the blocking collective's mean (the slowest rank) and the
# non-blocking one's overlap (the smallest over the ranks), else "failed".
once() {
  timeout 60 "$@" > "$W/last" 2>&1
  sed -n 's/^result barrier_us=\([0-9.]*\) .*overlap_pct=\([0-9.]*\) .*/\1:\2/p' "$W/last" | grep . || echo failed
}
# The median of the FIELDth (1: µs, 2: overlap) of a list of once's answers.
median() {
  tr ' ' '\n' | grep : | cut -d: -f"$1" | sort -g |
    awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'
}

chmod +x "$B"/* 2>/dev/null
say "## $(date +%T) machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
say "## MPI_Barrier against an 8-byte MPI_Allreduce (barrier_bench $ITERATIONS), $ROUNDS alternating runs, medians: µs, and the overlap of MPI_Ibarrier / MPI_Iallreduce; each run µs:overlap"
for p in $SIZES; do
  tcp_barrier=""; tcp_allreduce=""
  for _ in $(seq "$ROUNDS"); do
    tcp_barrier="$tcp_barrier $(once $(mr $p) $OWN_TCP "$B/barrier_bench" $ITERATIONS)"
    tcp_allreduce="$tcp_allreduce $(once $(mr $p) $OWN_TCP "$B/barrier_bench" $ITERATIONS allreduce 8)"
  done
  say "P=$p Open MPI TCP: barrier $(median 1 <<< "$tcp_barrier") allreduce $(median 1 <<< "$tcp_allreduce") overlap $(median 2 <<< "$tcp_barrier") / $(median 2 <<< "$tcp_allreduce") % (runs:$tcp_barrier /$tcp_allreduce)"
  IFS=';' read -ra engines <<< "$ENGINES"
  for engine in "${engines[@]}"; do
    daemon_args=${engine%%|*}; mpi_args=""; [ "$engine" = "$daemon_args" ] || mpi_args=${engine#*|}
    export NICBAR_SOCKET=$W/control.sock
    "$B/nicctl" emulate --units 16 --socket "$NICBAR_SOCKET" $daemon_args > "$W/daemon.log" 2>&1 & daemon=$!
    for _ in $(seq 100); do [ -S "$NICBAR_SOCKET" ] && break; sleep 0.05; done
    barrier=""; allreduce=""
    for _ in $(seq "$ROUNDS"); do
      barrier="$barrier $(once $(mr $p) $(nicbar $mpi_args) "$B/barrier_bench" $ITERATIONS)"
      allreduce="$allreduce $(once $(mr $p) $(nicbar $mpi_args) "$B/barrier_bench" $ITERATIONS allreduce 8)"
    done
    kill $daemon; wait $daemon 2>/dev/null; rm -f "$NICBAR_SOCKET"
    b=$(median 1 <<< "$barrier"); a=$(median 1 <<< "$allreduce")
    say "P=$p nicbar [$engine]: barrier $b allreduce $a ratio $(awk -v a="$a" -v b="$b" 'BEGIN {if (b > 0) printf "%.2f", a / b}') overlap $(median 2 <<< "$barrier") / $(median 2 <<< "$allreduce") % (runs:$barrier /$allreduce)"
  done
done
say "## in the NIC, no MPI (bench_nic_allreduce, members sleeping, the daemon's defaults)"
timeout 120 "$B/bench_nic_allreduce" --sizes "$(echo $SIZES | tr ' ' ',')" --operations 2000 --rounds "$ROUNDS" 2>&1 | tee -a "$S"
say "## $(date +%T) done"
