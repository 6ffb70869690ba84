#!/usr/bin/env bash
# The GPU figures of one training step in one command, for a machine that has only the xtoken
# binary and the tokenizers: the phase profile of `xtoken bench train` (Llama-3.2-1B-shaped
# student <- Qwen3-4B-shaped teacher, P-KL, 1 x 4096 tokens, top-K 8192) computing in f32 and in
# bf16 (f32 master weights: mixed precision), the bf16 part's first step again with the kernel
# cache the first parts filled (cold against warm), `bench forward` in bf16
# (forward, forward + backward) and `bench kernels`; then NCCL: the f32 part again with its one
# worker summing through NCCL (a communicator of one, its id carried by a session, the gradients
# in 25 MB buckets), whose losses must equal the f32 part's, and `bench exchange` on NCCL of the
# 1B student's gradients (4.9 GB in f32, 2.5 GB in bf16) against the device's memory pass
# (DEVICE=cuda only; the binary built with `cuda,collective`). Each part under its own time
# limit, written as
# they finish into OUT/report.md and OUT/report.json (with each run's own output beside them).
# The random models are made once, in a temporary directory removed at the end; the first
# training part's output says how long that took.
#
# Usage: scripts/gpu-step.sh OUT
# Environment:
#   XTOKEN                 the binary (default: xtoken on PATH, else target/release/xtoken)
#   XTOKEN_TOKENIZERS_DIR  holds llama-3.2/ and qwen3/ (their tokenizer.json)
#   DEVICE                 cuda (default), or cpu for the dry run: tiny bodies, short sequences,
#                          training on burn-flex (the CPU backend with bf16)
#   TORCH_BASELINE         optional: a PyTorch script printing one JSON line (tokens/s, memory)
#                          for the same step, run first as the anchor
#   LIMIT_S                seconds each run may take (default 300)
#   XTOKEN_NCCL            libnccl.so.2 or its directory (default: PyTorch's copy, found by
#                          xtoken itself)
# OUT must not exist or be empty: nothing in it is overwritten.
set -uo pipefail

out="${1:?usage: scripts/gpu-step.sh OUT}"
if [ -e "$out" ] && [ -n "$(ls -A "$out" 2>/dev/null)" ]; then
    echo "error: $out exists and is not empty; give a new directory" >&2
    exit 2
fi
mkdir -p "$out" || exit 2
xtoken="${XTOKEN:-$(command -v xtoken || echo target/release/xtoken)}"
tokenizers="${XTOKEN_TOKENIZERS_DIR:?set XTOKEN_TOKENIZERS_DIR to the folder with llama-3.2/ and qwen3/}"
device="${DEVICE:-cuda}"
limit="${LIMIT_S:-300}"
for t in llama-3.2 qwen3; do
    if [ ! -f "$tokenizers/$t/tokenizer.json" ]; then
        echo "error: $tokenizers/$t/tokenizer.json is missing" >&2
        exit 2
    fi
done
if [ ! -x "$xtoken" ]; then
    echo "error: no xtoken binary at $xtoken (set XTOKEN)" >&2
    exit 2
fi

# The paper's shapes on a GPU; tiny ones for the CPU dry run (same commands, same report).
if [ "$device" = cpu ]; then
    student=tiny teacher=tiny context=64 top_k=256 steps=1 preset=tiny len=64 train_device=flex
    kernels=(--device ndarray --rows 64 --student-vocab 2048 --teacher-vocab 3072 --top-k 64 --runs 1
        --hidden 32 --layers 2)
    forward_device=ndarray forward_dtype=f32
else
    student=llama1b teacher=qwen4b context=4096 top_k=8192 steps=3 preset=llama1b len=4096
    train_device="$device"
    kernels=(--device "$device" --dtype bf16)
    forward_device="$device" forward_dtype=bf16
fi

report="$out/report.md"
status=()
# Runs one part with its time limit, its output in OUT/NAME.md and its log in OUT/NAME.log,
# written directly (a run cut at its limit still leaves them); records how it ended.
part() {
    local name=$1
    shift
    local started=$SECONDS
    timeout "$limit" "$@" >"$out/$name.md" 2>"$out/$name.log"
    local code=$?
    local took=$((SECONDS - started))
    local how="exit $code"
    [ "$code" = 124 ] && how="cut at the ${limit} s limit"
    status+=("\"$name\": {\"exit\": $code, \"seconds\": $took}")
    {
        echo
        echo "## $name ($how, ${took} s)"
        echo
        echo '```'
        echo "$*"
        echo '```'
        echo
        cat "$out/$name.md"
        if [ "$code" != 0 ]; then
            echo
            echo "Last lines of $name.log:"
            echo '```'
            tail -n 15 "$out/$name.log"
            echo '```'
        fi
    } >>"$report"
    return 0
}

{
    echo "# xtoken: one training step on $device"
    echo
    echo "Date: $(date -u +%Y-%m-%dT%H:%MZ). Host: $(hostname). CPU: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1)."
    if command -v nvidia-smi >/dev/null 2>&1; then
        echo "GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -n 1)."
    fi
    echo "Binary: $xtoken. Each part below ran under a ${limit} s limit."
} >"$report"

if [ -n "${TORCH_BASELINE:-}" ]; then
    part torch-baseline python3 "$TORCH_BASELINE" --context "$context" --steps "$steps" --top-k "$top_k"
fi
# Both training parts share one work directory: the random models are made once, by the first.
work="$(mktemp -d "${TMPDIR:-/tmp}/xtoken-gpu-step.XXXXXX")" || exit 2
trap 'rm -rf "$work"' EXIT
# cubecl's kernel cache starts empty, so the first step of each training part is a cold one;
# `train-bf16-warm` runs the bf16 part's first step again with the cache it left.
export XTOKEN_KERNEL_CACHE="$work/kernel-cache"
train() {
    local name=$1 compute=$2 steps=$3
    shift 3
    part "$name" "$xtoken" bench train "$@" --device "$train_device" --work-dir "$work" \
        --student-tokenizer "$tokenizers/llama-3.2" --teacher-tokenizer "$tokenizers/qwen3" \
        --student "$student" --teacher "$teacher" --loss pkl --context "$context" \
        --top-k "$top_k" --steps "$steps" --compute-dtype "$compute" --profile \
        --json "$out/$name.json"
}
train train-f32 f32 "$steps"
train train-bf16 bf16 "$steps"
train train-bf16-warm bf16 1
part forward "$xtoken" bench forward --device "$forward_device" --preset "$preset" --len "$len" \
    --dtype "$forward_dtype"
part kernels "$xtoken" bench kernels "${kernels[@]}"
if [ "$device" = cuda ]; then
    train train-f32-nccl-exchange f32 "$steps" --exchange nccl
    part nccl-losses python3 -c '
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
def losses(r):
    return [x for run in r["runs"] for x in run.get("losses", [])]
la, lb = losses(a), losses(b)
worst = max((abs(x - y) for x, y in zip(la, lb)), default=float("nan"))
print(f"| losses | without NCCL | through NCCL | largest difference |\n|---|---|---|---|\n| {len(la)} | {la} | {lb} | {worst:.3g} |")
sys.exit(0 if la and len(la) == len(lb) and worst <= 1e-6 else 1)
' "$out/train-f32.json" "$out/train-f32-nccl-exchange.json"
    for dtype in f32 bf16; do
        part "exchange-$dtype" "$xtoken" bench exchange --device cuda --exchange nccl \
            --values 1235814400 --dtype "$dtype" --rounds 3
    done
fi

{
    echo "{"
    echo "  \"device\": \"$device\","
    echo "  \"date\": \"$(date -u +%Y-%m-%dT%H:%MZ)\","
    echo "  \"parts\": {$(IFS=,; echo "${status[*]}")},"
    for name in train-f32 train-bf16 train-bf16-warm; do
        [ "$name" = train-f32 ] || echo ","
        if [ -s "$out/$name.json" ]; then
            echo "  \"${name//-/_}\": $(cat "$out/$name.json")"
        else
            echo "  \"${name//-/_}\": null"
        fi
    done
    echo "}"
} >"$out/report.json"
echo "wrote $report and $out/report.json"
