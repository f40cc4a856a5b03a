#!/usr/bin/env bash
# Runs the engine's benchmarks on a machine with cores to spare, everything compared side by side
# in one run: reference barriers and UDP ping-pong; MPI_Barrier and MPI_Ibarrier's overlap,
# MPI_Allreduce, and an 8-byte MPI_Iallreduce's overlap, through Open MPI's own collectives and
# through coll/nicbar under several NIC thread counts and idle policies; `bench_barrier` (one
# daemon); and `cluster` over daemons of one NIC each on authenticated UDP.
#
# usage: run.sh [OUT]   (from a bundle made by bundle.sh; OUT, where it writes, defaults to ./out)
# SIZES (default "2 4 8 16"), ITERATIONS (default 5000) and DAEMONS (default "4 8") shrink a run;
# ENGINES lists the one-host daemon's settings measured under coll/nicbar (`;` between them; the
# allreduce runs under the first), THREADS the NIC thread counts bench_barrier sweeps with the
# adaptive policy, ALLREDUCE_BYTES the MPI_Allreduce sizes (default 8,64,1024), and SKIP the parts
# left out (refs, own, allreduce, bench, cluster).
# Writes summary.txt (one line per figure) and details.txt (every program's output) to OUT.
set -u
D=$(cd "$(dirname "$0")" && pwd)
B=$D/bin
O=${1:-$D/out}
SIZES=${SIZES:-2 4 8 16}
ITERATIONS=${ITERATIONS:-5000}
DAEMONS=${DAEMONS:-4 8}
ENGINES=${ENGINES:---idle adaptive;--idle poll --threads 1;--idle poll --threads 2;--idle sleep}
THREADS=${THREADS:-auto,1,2}
ALLREDUCE_BYTES=${ALLREDUCE_BYTES:-8,64,1024}
SKIP=${SKIP:-}
# Whether a part is to run.
part() { [[ " $SKIP " != *" $1 "* ]]; }
S=$O/summary.txt
X=$O/details.txt
. "$D/out.sh"

log() { say "## $(date +%T) $*"; }
# Runs a command with a deadline, its whole output into details.txt; prints its `result` lines.
measure() {
  local limit=$1; shift
  { echo "### $*"; } >> "$X"
  timeout "$limit" "$@" > "$W/last" 2>&1; local rc=$?
  cat "$W/last" >> "$X"; echo "rc=$rc" >> "$X"
  grep "^result" "$W/last" | sed 's/^result //' | paste -sd';' || true
  [ $rc -eq 0 ] || echo "FAILED rc=$rc"
}
# Starts a one-host daemon of 16 units with the given engine arguments; sets DAEMON and SOCKET.
start_daemon() {
  SOCKET=$W/control-$RANDOM.sock
  "$B/nicctl" emulate --units 16 --socket "$SOCKET" "$@" >> "$X" 2>&1 & DAEMON=$!
  for _ in $(seq 100); do [ -S "$SOCKET" ] && return 0; sleep 0.05; done
  say "daemon $* did not start"; return 1
}
stop_daemon() { kill $DAEMON 2>/dev/null; wait $DAEMON 2>/dev/null; }

chmod +x "$B"/* 2>/dev/null
log "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), kernel $(uname -r), $(ldd --version | head -1)"
if part refs; then
  log "references: process-shared pthread barrier, raw UDP ping-pong"
  for p in $SIZES; do say "pshared P=$p: $(measure 30 "$B/pshared_barrier" $p 20000)"; done
  for mode in busy block; do say "udp $mode: $(measure 30 "$B/udp_pingpong" $mode 20000)"; done
fi

if [ -d "$D/ompi/usr" ]; then
  . "$D/mpi.sh"

  part own && log "MPI_Barrier / MPI_Ibarrier (barrier_bench $ITERATIONS): Open MPI's own"
  part own && for p in $SIZES; do
    say "barrier P=$p ompi-shm: $(measure 60 $(mr $p) $OWN_SHM "$B/barrier_bench" $ITERATIONS)"
    say "barrier P=$p ompi-tcp: $(measure 60 $(mr $p) $OWN_TCP "$B/barrier_bench" $ITERATIONS)"
  done
  IFS=';' read -ra engines <<< "$ENGINES"
  for engine in "${engines[@]}"; do
    log "MPI_Barrier / MPI_Ibarrier through coll/nicbar, daemon $engine"
    start_daemon $engine || continue
    export NICBAR_SOCKET=$SOCKET
    for p in $SIZES; do
      if [ "${engine#*poll}" != "$engine" ] && [ $((p + ${engine##* })) -gt $(nproc) ]; then say "barrier P=$p nicbar[$engine]: skipped (more polling threads than cores)"; continue; fi
      before=$(cpu_ns $DAEMON)
      r=$(measure 60 $(mr $p) $(nicbar) "$B/barrier_bench" $ITERATIONS)
      say "barrier P=$p nicbar[$engine]: $r nic_cpu_ms=$(( ($(cpu_ns $DAEMON) - before) / 1000000 ))"
    done
    stop_daemon
  done

  part allreduce && log "MPI_Allreduce of doubles (coll_bench): Open MPI's own, with coll/nicbar loaded (up to 32 B in the NIC, longer ones left to Open MPI), and coll/nicbar's"
  part allreduce && start_daemon ${engines[0]} && export NICBAR_SOCKET=$SOCKET &&
  for p in $SIZES; do
    say "allreduce P=$p ompi-shm: $(measure 60 $(mr $p) $OWN_SHM "$B/coll_bench" $ALLREDUCE_BYTES 300 0 allreduce)"
    say "allreduce P=$p ompi-tcp: $(measure 60 $(mr $p) $OWN_TCP "$B/coll_bench" $ALLREDUCE_BYTES 300 0 allreduce)"
    say "allreduce P=$p ompi-shm+nicbar-loaded: $(measure 60 $(mr $p) $(nicbar --mca coll_nicbar_allreduce_algorithm -1) "$B/coll_bench" $ALLREDUCE_BYTES 300 0 allreduce)"
    say "allreduce P=$p nicbar: $(measure 60 $(mr $p) $(nicbar --mca coll_nicbar_allreduce_algorithm 0) "$B/coll_bench" $ALLREDUCE_BYTES 300 0 allreduce)"
    for who in "ompi-shm|$OWN_SHM" "ompi-tcp|$OWN_TCP" "nicbar|$(nicbar)"; do
      say "iallreduce 8 B P=$p ${who%%|*}: $(measure 60 $(mr $p) ${who#*|} "$B/barrier_bench" $ITERATIONS allreduce 8)"
    done
  done && stop_daemon
else
  log "no Open MPI in the bundle: MPI rows skipped"
fi

part bench && log "bench_barrier: one daemon, every process a unit of it"
part bench &&
# Processes spinning, NIC threads polling: only where every one has a core (spinning threads
# that share cores wait out each other's time slices). Adaptive everywhere.
for p in $SIZES; do
  polling=""
  for t in 1 2 4; do [ $((p + t)) -le $(nproc) ] && polling="$polling,$t"; done
  if [ -n "$polling" ]; then
    measure 200 "$B/bench_barrier" --sizes $p --barriers 2000 --no-mpi --spin --threads ${polling#,} --idle poll --out "$W" > /dev/null
    sed -n '/^barrier latency/,$p' "$W/last" | tee -a "$S"
  fi
done
if part bench; then
  measure 200 "$B/bench_barrier" --sizes "${SIZES// /,}" --barriers 2000 --no-mpi --spin --threads $THREADS --idle adaptive --out "$W" > /dev/null
  sed -n '/^barrier latency/,$p' "$W/last" | tee -a "$S"
  measure 200 "$B/bench_barrier" --sizes "${SIZES// /,}" --barriers 2000 --no-mpi --threads $THREADS --idle adaptive,sleep --out "$W" > /dev/null
  sed -n '/^barrier latency/,$p' "$W/last" | tee -a "$S"
fi

part cluster && log "daemons of one NIC each over authenticated UDP on loopback (cluster)"
"$B/nicctl" keygen "$W/key" > /dev/null
part cluster && for n in $DAEMONS; do
  for mode in "poll spin" "adaptive spin" "sleep sleep"; do
    idle=${mode% *}; wait_mode=${mode#* }
    if [ $idle = poll ] && [ $((2 * n)) -gt $(nproc) ]; then
      say "cluster N=$n idle=$idle processes=$wait_mode: skipped (more polling threads than cores)"; continue
    fi
    for i in $(seq 0 $((n - 1))); do echo "node $i 127.0.0.1:$((47100 + i))"; done > "$W/map"
    daemons=""
    for i in $(seq 0 $((n - 1))); do
      "$B/nicctl" emulate --node $i --fabric "$W/map" --fabric-key "$W/key" --socket "$W/u$i.sock" --idle $idle >> "$X" 2>&1 & daemons="$daemons $!"
    done
    for _ in $(seq 100); do [ -S "$W/u$((n - 1)).sock" ] && break; sleep 0.05; done
    ranks=""
    for i in $(seq 0 $((n - 1))); do
      spin=""; [ $wait_mode = spin ] && spin=--spin
      timeout 60 "$B/cluster" --rank $i --nodes $n --socket "$W/u$i.sock" --barriers 2000 --round-trips 5000 $spin > "$W/rank$i" 2>&1 & ranks="$ranks $!"
    done
    wait $ranks; rc=$?
    { echo "### cluster N=$n idle $idle, processes $wait_mode"; cat "$W/rank0"; echo "rc=$rc"; } >> "$X"
    say "cluster N=$n idle=$idle processes=$wait_mode rc=$rc:"
    grep -E "^ping-pong|^pairwise|^gather|^dissemination" "$W/rank0" | grep -v "barriers each" | sed 's/^/    /' | tee -a "$S"
    kill $daemons 2>/dev/null; wait $daemons 2>/dev/null
  done
done
log done
