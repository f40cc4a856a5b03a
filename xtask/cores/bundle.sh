#!/usr/bin/env bash
# Gathers everything run.sh needs into one folder, for a bare x86-64 Linux machine with cores to
# spare (nothing installed there beyond a C library): the benchmarks built with the bench-fast
# profile, libnicbar and coll/nicbar, the MPI and reference programs, and Debian's Open MPI
# unpacked beside them. Run on a Debian machine with Rust and Open MPI's development files (as
# `cargo xtask mpi test` installs them), from the repository's root.
#
# usage: xtask/cores/bundle.sh [DIR]   (default bench-out/cores; then run DIR/run.sh there, and
# DIR/compare.sh for the allreduce against the barrier, DIR/long.sh for the long allreduce)
set -eu
BUNDLE=$(mkdir -p "${1:-bench-out/cores}" && cd "${1:-bench-out/cores}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
rm -rf "$BUNDLE"/{bin,nb,ompi}
mkdir -p "$BUNDLE"/{bin,nb,ompi}
cargo build --profile bench-fast -p host-driver --bin nicctl \
  -p nicbar-system --example cluster --example bench_barrier --example bench_nic_allreduce
cp target/bench-fast/nicctl target/bench-fast/examples/{cluster,bench_barrier,bench_nic_allreduce} "$BUNDLE/bin/"
PREFIX=$(mktemp -d)
cargo xtask mpi install --prefix "$PREFIX" --components "$BUNDLE/nb"
cp "$PREFIX/lib/libnicbar.so" "$BUNDLE/nb/"
rm -rf "$PREFIX"
strip "$BUNDLE"/bin/* "$BUNDLE/nb/libnicbar.so"
for program in barrier_bench coll_bench; do
  mpicc -O2 -Wall -Werror -o "$BUNDLE/bin/$program" "host-lib/coll-nicbar/bench/$program.c"
done
gcc -O2 -Wall -Wextra -Werror -o "$BUNDLE/bin/pshared_barrier" "$HERE/pshared_barrier.c" -lpthread
gcc -O2 -Wall -Wextra -Werror -o "$BUNDLE/bin/udp_pingpong" "$HERE/udp_pingpong.c"
DEBS=$(mktemp -d)
(cd "$DEBS" && apt-get download openmpi-bin openmpi-common libopenmpi3 libpmix2 libhwloc15 \
  libevent-core-2.1-7 libevent-pthreads-2.1-7 libnuma1)
for deb in "$DEBS"/*.deb; do dpkg -x "$deb" "$BUNDLE/ompi"; done
rm -rf "$DEBS"
cp "$HERE/run.sh" "$HERE/compare.sh" "$HERE/long.sh" "$HERE/mpi.sh" "$HERE/out.sh" "$BUNDLE/"
du -sh "$BUNDLE"
