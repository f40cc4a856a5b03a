#!/bin/sh
# An Open MPI plm_rsh_agent that reaches "hosts" that are network namespaces on this machine:
# `netns_rsh.sh [ssh options] HOST COMMAND...` runs COMMAND inside the namespace named by
# $NICBAR_NETNS_PREFIX<N-1> for the address A.B.C.N (default prefix: nbh), with that host's own
# nicbar socket ($NICBAR_NETNS_RUN/<N-1>/control.sock, default run directory /tmp/nicbar-netns).
#
#   mpirun --hostfile HOSTS --mca plm_rsh_agent netns_rsh.sh ...
while [ "${1#-}" != "$1" ]; do shift; done
host=$1
shift
index=$(( ${host##*.} - 1 ))
prefix=${NICBAR_NETNS_PREFIX:-nbh}
run=${NICBAR_NETNS_RUN:-/tmp/nicbar-netns}
exec ip netns exec "$prefix$index" env NICBAR_SOCKET="$run/$index/control.sock" sh -c "$*"
