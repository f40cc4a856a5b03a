# Sourced first by run.sh, compare.sh and long.sh (with S, the run's summary file, set): `say`, a
# line to the screen and to S, and W, a scratch folder removed, with the daemons the script
# started, when it exits.
mkdir -p "$(dirname "$S")"
W=$(mktemp -d)
trap 'pkill -P $$ 2>/dev/null; rm -rf "$W"' EXIT
say() { echo "$*" | tee -a "$S"; }
