#!/bin/sh
# An Open MPI plm_rsh_agent that reaches "hosts" that are network namespaces on this machine:
# `netns_rsh.sh [ssh options] HOST COMMAND...` runs COMMAND inside the namespace named by
# $NICBAR_NETNS_PREFIX<N-1> for the address A.B.C.N (default prefix: nbh), with that host's own
# nicbar socket ($NICBAR_NETNS_RUN/<N-1>/control.sock, default run directory /tmp/nicbar-netns)
# and its own Open MPI session directory under $NICBAR_NETNS_RUN/<N-1>/tmp: the namespaces share
# one /tmp and one host name, and Open MPI's daemons race to make the same session directories
# otherwise ("mkdir ... File exists").
#
#   mpirun --hostfile HOSTS --mca plm_rsh_agent netns_rsh.sh ...
while [ "${1#-}" != "$1" ]; do shift; done
host=$1
shift
index=$(( ${host##*.} - 1 ))
prefix=${NICBAR_NETNS_PREFIX:-nbh}
run=${NICBAR_NETNS_RUN:-/tmp/nicbar-netns}
mkdir -p "$run/$index/tmp"
exec ip netns exec "$prefix$index" env NICBAR_SOCKET="$run/$index/control.sock" \
    OMPI_MCA_orte_tmpdir_base="$run/$index/tmp" sh -c "$*"
