#!/usr/bin/env bash
# proxrl at f8030f1 (the README's 1.56x) against this tree, the same vs_trl.py GRPO worker,
# alternated in fresh processes (issue 39). First: mkdir old && git archive f8030f1 src | tar -x -C old
# then, from the repository root: ab_f8030f1_vs_now.sh <a vs_trl.py 128x2 models dir> <pairs> <out dir>
set -u
M=$1; PAIRS=$2; OUT=$3; mkdir -p "$OUT"
PATHS=$(printf '{"model": "%s/policy", "reward": "%s/reward", "prompts": "%s/prompts.jsonl", "eos": "%s", "vocab": "%s"}' "$M" "$M" "$M" 2 "$(python3 -c "import json;print(json.load(open('$M/policy/config.json'))['vocab_size'])")")
for pair in $(seq 0 $((PAIRS-1))); do
  order="new old"; [ $((pair % 2)) = 1 ] && order="old new"
  for src in $order; do
    for packed in "" "--packed"; do
      S=$PWD/src; [ $src = old ] && S=$PWD/old/src
      line=$(OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=$PWD/benchmarks:$S .venv/bin/python benchmarks/vs_trl.py --worker proxrl $packed --workload spread --max-tokens 4096 --trainer grpo --paths "$PATHS" --updates 4 --tokens 256 --out "$OUT/run-$pair-$src${packed}" --precision fp32 2>/dev/null | grep '^{')
      echo "{\"pair\": $pair, \"src\": \"$src\", \"packed\": \"$packed\", \"load\": $(cut -d' ' -f1 /proc/loadavg), \"run\": $line}"
    done
  done
done
