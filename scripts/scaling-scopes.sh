#!/usr/bin/env bash
# Does taking dynamic scaling's γ (and adaptive α) from the previous step change training?
# Trains the demo's student from its warm-up on P-KL from the demo's teacher for STEPS steps of
# 4 micro-batches, with `scaling_scope = "step"` (the paper) and `"previous-step"`, each at two
# data-order seeds, and prints per scope pair the mean and largest |Δ CE| over the steps and the
# difference of the last 10 % of steps' mean CE, against the same figures between the two seeds
# of one scope (the noise).
#
# Usage: scripts/scaling-scopes.sh DEMO OUT     (DEMO: what `xtoken demo --out DEMO` left)
# Environment: XTOKEN (default: target/release/xtoken), STEPS (default 200).
set -euo pipefail

demo="${1:?usage: scripts/scaling-scopes.sh DEMO OUT}"
out="${2:?usage: scripts/scaling-scopes.sh DEMO OUT}"
xtoken="${XTOKEN:-target/release/xtoken}"
steps="${STEPS:-200}"
if [ -e "$out" ]; then
    echo "error: $out exists; give a new directory" >&2
    exit 2
fi
for f in runs/warm-up/student runs/digit-splitting/teacher/student train.jsonl; do
    if [ ! -e "$demo/$f" ]; then
        echo "error: $demo/$f is missing: run \`xtoken demo --out $demo\` first" >&2
        exit 2
    fi
done
mkdir -p "$out"

for scope in step previous-step; do
    for seed in 1 2; do
        name="$scope-$seed"
        cat >"$out/$name.toml" <<TOML
output_dir = "$out/$name"
seed = $seed
[student]
model = "$demo/runs/warm-up/student"
[[teachers]]
name = "teacher"
model = "$demo/runs/digit-splitting/teacher/student"
loss = "pkl"
[data]
path = "$demo/train.jsonl"
[training]
steps = $steps
batch_size = 16
micro_batch = 4
context_length = 96
lr = 3e-3
log_every = $steps
activation_checkpointing = false
[loss]
top_k = 0
scaling_scope = "$scope"
[checkpoint]
every = $steps
save_dtype = "f32"
TOML
        echo "training $name" >&2
        "$xtoken" train --config "$out/$name.toml" 2>"$out/$name.log"
    done
done

# The `ce` and `tokens_per_s` columns of a run's metrics.csv, one "ce tokens_per_s" per line.
columns() {
    awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) { if ($i == "ce") c = i; if ($i == "tokens_per_s") t = i }; next }
             { print $c, $t }' "$out/$1/metrics.csv"
}
# Mean and largest |Δ CE| over the steps, and the difference of the last 10 % of steps' means.
compare() {
    paste -d ' ' <(columns "$1") <(columns "$2") | awk -v n="$steps" '
        { d = $1 - $3; if (d < 0) d = -d; sum += d; if (d > max) max = d
          if (NR > n - n / 10) { a += $1; b += $3; k++ } }
        END { printf "| %.4f | %.4f | %+.4f |", sum / NR, max, (a - b) / k }'
}
speed() {
    columns "$1" | awk 'NR > 1 { s += $2; k++ } END { printf "%.0f", s / k }'
}

{
    echo "| runs compared | mean \|Δ CE\| | largest \|Δ CE\| | Δ of the last 10 % mean CE |"
    echo "|---|---|---|---|"
    for seed in 1 2; do
        echo "| previous-step − step, seed $seed $(compare "previous-step-$seed" "step-$seed")"
    done
    for scope in step previous-step; do
        echo "| seed 2 − seed 1 ($scope: the noise) $(compare "$scope-2" "$scope-1")"
    done
    echo
    for scope in step previous-step; do
        echo "- $scope: $(speed "$scope-1") student tokens/s (seed 1, steps 2 on)"
    done
} | tee "$out/report.md"
