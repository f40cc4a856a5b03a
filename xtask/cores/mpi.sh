# Sourced by run.sh, compare.sh and long.sh (with D, the bundle's folder, set): Open MPI unpacked
# in the bundle, how the benchmarks launch it — with its own collectives (OWN_SHM, OWN_TCP) or
# through coll/nicbar (`nicbar [MORE ARGS]`), `mr P` for P ranks — and `cpu_ns PID`, what a
# daemon's NIC threads spent.
export OPAL_PREFIX=$D/ompi/usr
export LD_LIBRARY_PATH=$D/nb:$OPAL_PREFIX/lib/x86_64-linux-gnu:$OPAL_PREFIX/lib/x86_64-linux-gnu/openmpi/lib
export PATH=$OPAL_PREFIX/bin:$PATH OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
COMP=$OPAL_PREFIX/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
MR="orterun --oversubscribe --mca pml ob1 --mca btl_vader_single_copy_mechanism none -x LD_LIBRARY_PATH"
OWN_SHM="--mca mca_base_component_path $COMP --mca btl self,vader"
OWN_TCP="--mca mca_base_component_path $COMP --mca btl self,tcp --mca btl_tcp_if_include lo"
# Each rank on a core of its own where there are enough (Open MPI refuses to bind more).
mr() { local bind=core; [ "$1" -le "$(nproc)" ] || bind=none; echo "$MR --bind-to $bind -np $1"; }
nicbar() { echo "-x NICBAR_SOCKET --mca mca_base_component_path $COMP:$D/nb --mca coll_nicbar_priority 100 --mca coll_nicbar_verbose 1 --mca coll_nicbar_unit -2 --mca btl self,vader $*"; }
# CPU time of a process's threads, in ns (scheduler statistics, else clock ticks).
cpu_ns() {
  local total=0 t
  for t in /proc/$1/task/*; do
    if [ -r $t/schedstat ]; then total=$((total + $(cut -d' ' -f1 $t/schedstat)))
    else total=$((total + ($(cut -d' ' -f14 $t/stat) + $(cut -d' ' -f15 $t/stat)) * 10000000)); fi
  done
  echo $total
}
