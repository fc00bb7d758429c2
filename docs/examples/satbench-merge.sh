#!/bin/bash
# After the array (docs/examples/satbench-array.sbatch): merge the shards' stores into one and
# write the tag's report from it, the report of one run over the whole benchmark.
#
#   sbatch --dependency=afterok:<array job id> docs/examples/satbench-merge.sh
#
#SBATCH --job-name=satbench-merge
#SBATCH --cpus-per-task=2
#SBATCH --time=00:30:00
#SBATCH --output=satbench-merge-%j.log
set -euo pipefail

TAG=${TAG:-qwen25vl7b-jpeg50}
PROJECT=${PROJECT:-${SLURM_SUBMIT_DIR:-$PWD}}
STORES=${STORES:-$PROJECT/satbench-stores}
OUT=${OUT:-$PROJECT/reports}
PYTHON=${PYTHON:-python}

shopt -s nullglob
shards=("$STORES"/shard-*-of-*.sqlite)
if [ ${#shards[@]} -eq 0 ]; then
    echo "satbench: no shard stores in $STORES; did the array run?" >&2
    exit 2
fi
# all or nothing: a store still being written, or a shard measured differently, merges nothing
"$PYTHON" -m pytest_satbench.report --merge "${shards[@]}" --into "$STORES/merged.sqlite"
"$PYTHON" -m pytest_satbench.report --store "$STORES/merged.sqlite" --tag "$TAG" --out "$OUT"
