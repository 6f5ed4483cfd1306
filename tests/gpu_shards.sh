#!/usr/bin/env bash
# Run pytest in N parallel processes on one GPU machine (the GPU image has no pytest-xdist):
# test ids are dealt round-robin to N shards, each shard runs under `timeout T`, logs go to
# $OUT/shards (or ./gpu_shards), and the summary line of each shard plus every failure is printed.
# The gpu-marked suite is compile-bound (each test compiles its own specialisations), so 8 shards
# on 16 cores finish it in about a quarter of the serial time.
#
#   bash tests/gpu_shards.sh N T -m gpu tests          # select with pytest arguments
#   bash tests/gpu_shards.sh N T --ids ids.txt         # or from a file of test ids
set -u
N=$1; T=$2; shift 2
LOGS=${OUT:-.}/shards
[ -n "${OUT:-}" ] || LOGS=./gpu_shards
mkdir -p "$LOGS"
IDS=$(mktemp)
if [ "${1:-}" = "--ids" ]; then cp "$2" "$IDS"; else
  python -m pytest --collect-only -q -p no:cacheprovider "$@" 2>/dev/null | grep "::" > "$IDS"; fi
echo "collected $(wc -l < "$IDS")"
# an empty selection (a misspelt path) would hand each shard no ids and pytest would run everything
[ -s "$IDS" ] || { echo "nothing collected: check the pytest arguments"; exit 2; }
for i in $(seq 0 $((N - 1))); do
  awk -v n="$N" -v i="$i" 'NR % n == i' "$IDS" > "$IDS.$i"
  # -u: a shard cut by its timeout still shows every test it finished
  ( xargs -d '\n' -a "$IDS.$i" timeout "$T" python -u -m pytest -q -p no:cacheprovider -rfE \
      > "$LOGS/log_$i.txt" 2>&1 ) &
done
wait
for i in $(seq 0 $((N - 1))); do echo "== shard $i: $(tail -1 "$LOGS/log_$i.txt")"; done
grep -h "^FAILED\|^ERROR" "$LOGS"/log_*.txt | head -40
# one file of all shards' logs, so a failure's traceback comes back whatever the file-count limit
cat "$LOGS"/log_*.txt > "$LOGS/all.txt" && rm "$LOGS"/log_*.txt
