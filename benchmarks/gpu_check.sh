#!/usr/bin/env bash
# The first minutes on a GPU machine, in one script (issue 39): the accelerator tests, the vLLM
# tests on CUDA and the GRPO rows of benchmarks/vs_trl_05b.py at Qwen2-0.5B's shape (16- and
# 256-token prompts), then one table. Each step has its own time limit (100 + 130 + 240 + 180 s),
# so the whole stays under 11 minutes:
#
#     bash benchmarks/gpu_check.sh                  # from the repository root
#     PYTHON=/path/to/python LOGS=results bash benchmarks/gpu_check.sh
#
# PYTHON: an environment with proxrl's dependencies and a CUDA torch (default python3; proxrl
# itself is read from src/). vLLM (a CUDA build) and TRL 1.16 are used if PYTHON imports them,
# else their rows say "skipped" and why. LOGS: where the logs and the table go (default $OUT,
# the device tool's folder, where set; else gpu_check/). Nothing is downloaded: the models are
# built locally with random weights, in a temporary directory removed at the end.
set -u -o pipefail

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${LOGS:-${OUT:-gpu_check}}
mkdir -p "$OUT"
MODELS=$(mktemp -d)
trap 'rm -rf "$MODELS"' EXIT
export PYTHONPATH="$PWD/src:$PWD/benchmarks:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false VLLM_LOGGING_LEVEL=WARNING PYTHONUNBUFFERED=1
START=$SECONDS
ROWS=()

row() { ROWS+=("$(printf '| %s | %s | %s | %s |' "$1" "$2" "$3" "$4")"); }

# one line of pytest's summary ("12 passed, 1 skipped in 40.1s"), or what stopped it
summary() {
    local log=$1 rc=$2
    if [ "$rc" -eq 124 ]; then echo "timed out"; return; fi
    local line
    line=$(grep -E '(passed|failed|error|skipped|no tests ran)' "$log" | tail -1 |
        sed -E 's/^=+ //; s/ =+$//')
    echo "${line:-exit $rc (see log)}"
}

has() { "$PYTHON" -c "import $1" >/dev/null 2>&1; }

# 0. The machine
if ! "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_check: $PYTHON's torch sees no CUDA device; nothing to check here" >&2
    exit 2
fi
GPU=$("$PYTHON" -c 'import torch; print(torch.cuda.get_device_name(0))')
VERSIONS=$("$PYTHON" - <<'EOF'
import importlib.metadata as m
names = ["torch", "transformers", "peft", "vllm", "trl"]
print(", ".join(f"{n} {m.version(n)}" for n in names if any(True for _ in m.distributions(name=n))))
EOF
)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT/gpu.txt" 2>&1

# 1. tests/accelerator on the GPU (CUDA is picked when torch sees it; 100 s at most)
t0=$SECONDS
timeout 100 "$PYTHON" -m pytest tests/accelerator -q -o addopts="" -p no:cacheprovider \
    >"$OUT/accelerator.log" 2>&1
rc=$?
row "pytest tests/accelerator" "$(summary "$OUT/accelerator.log" $rc)" "$((SECONDS - t0)) s" \
    "$OUT/accelerator.log"

# 2. tests/vllm with the engine on CUDA (130 s at most)
t0=$SECONDS
if has vllm; then
    timeout 130 "$PYTHON" -m pytest tests/vllm -q -o addopts="" -p no:cacheprovider -x \
        >"$OUT/vllm.log" 2>&1
    rc=$?
    row "pytest tests/vllm (CUDA)" "$(summary "$OUT/vllm.log" $rc)" "$((SECONDS - t0)) s" \
        "$OUT/vllm.log"
else
    row "pytest tests/vllm (CUDA)" "skipped: $PYTHON has no vllm (a CUDA build is needed)" "0 s" "-"
fi

# 3. GRPO rows at the 0.5B shape (vs_trl_05b.py), one pair, 3 updates per run (the first is
# warm-up). The floors are CPU loops and are left out here. All sides run in PYTHON (no per-side
# environments on this machine). grpo_row NAME LOG TIMEOUT SIDE... -- ARGS...
grpo_row() {
    local name=$1 log=$2 limit=$3 t0=$SECONDS sides=() args=()
    shift 3
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do sides+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    args=("$@")
    PROXRL_PYTHON=$PYTHON PROXRL_VLLM_PYTHON=$PYTHON TRL_PYTHON=$PYTHON \
        timeout "$limit" "$PYTHON" benchmarks/vs_trl_05b.py --trainers grpo --pairs 1 \
        --updates 3 --threads 8 --sides "${sides[@]}" "${args[@]}" --work "$MODELS/$log" \
        --results "$OUT/$log.jsonl" >"$OUT/$log.log" 2>&1
    local rc=$?
    while read -r line; do  # one row per side that ran (also when a later one timed out)
        side=$(awk '{print $4}' <<<"$line")
        row "$name: $side" "$(cut -d' ' -f5- <<<"$line" | tr -s ' ' | cut -c1-100)" "" \
            "$OUT/$log.log"
    done < <(grep -E '^grpo pair 0 [a-z]' "$OUT/$log.log")
    local ratio status
    ratio=$(grep -E '^grpo pair 0:' "$OUT/$log.log" | cut -d: -f2-)
    case $rc in
        0) status="${ratio:-no TRL side}" ;;
        124) status="timed out${ratio:+; $ratio}" ;;
        *) status="exit $rc${ratio:+; $ratio}" ;;
    esac
    row "$name: tokens/s ratios" "$status" "$((SECONDS - t0)) s" "$OUT/$log.log"
}

# 3a. proxrl cached, proxrl vllm, TRL 1.16 (colocated vLLM when it has both): 7-10-token
# prompts, responses of 10-256 tokens (240 s at most)
SIDES=(cached)
has vllm && SIDES+=(vllm)
TRL_FLAG=()
if has trl; then
    SIDES+=(trl)
    has vllm && TRL_FLAG=(--trl-vllm)
fi
grpo_row "GRPO 0.5B LoRA" grpo_05b 240 "${SIDES[@]}" -- --tokens 256 \
    ${TRL_FLAG[@]+"${TRL_FLAG[@]}"}

# 3b. At a user's lengths (issue 50, benchmarks/results/issue50_user_lengths.md): 256-token
# prompts, responses of 16-256 tokens, all 24 layers; proxrl with the shared prefix (cached)
# and without it (repeated), TRL 1.16 (180 s at most)
SIDES=(cached repeated)
has trl && SIDES+=(trl)
grpo_row "GRPO 0.5B LoRA, 256-token prompts" grpo_05b_p256 180 "${SIDES[@]}" -- \
    --prompt-tokens 256 --tokens 256 --shortest 16

# 4. One table
{
    echo "gpu_check on $GPU ($VERSIONS), $((SECONDS - START)) s in all"
    echo
    echo "| check | result | time | log |"
    echo "|---|---|---|---|"
    printf '%s\n' "${ROWS[@]}"
} | tee "$OUT/table.md"
