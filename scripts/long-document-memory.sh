#!/usr/bin/env bash
# The memory a very long one-line document adds to a run: `xtoken train --check`'s estimate
# against the peak resident memory of the same run (`/usr/bin/time -v`), for documents of short
# records (the anchor), 7.2 and 28.7 MB of English words, and 7.2 MB of symbols and digits
# (about three times the tokens per byte). The models are `xtoken bench train`'s tiny random
# ones at the real tokenizers' widths; the documents are made here, the same on every machine.
# Prints a Markdown table.
#
# Usage: scripts/long-document-memory.sh WORK_DIR
# Environment:
#   XTOKEN                  the binary (default: xtoken on the PATH)
#   XTOKEN_TOKENIZERS_DIR   the real tokenizers (llama-3.2 and qwen3 are read)
set -euo pipefail

work="${1:?usage: scripts/long-document-memory.sh WORK_DIR}"
xtoken="${XTOKEN:-xtoken}"
tokenizers="${XTOKEN_TOKENIZERS_DIR:?set XTOKEN_TOKENIZERS_DIR to the real tokenizers}"
mkdir -p "$work"

"$xtoken" bench train --student-tokenizer "$tokenizers/llama-3.2" \
    --teacher-tokenizer "$tokenizers/qwen3" --context 128 --top-k 256 --steps 1 \
    --work-dir "$work/models" >/dev/null

python3 - "$work" <<'EOF'
import json, random, string, sys
work = sys.argv[1]
words = ("the of and to in is was for on that with as by at from his her they this which be or "
         "are an had it not were but have one all their there been has its who more when will "
         "would also into other some these than can only time two first over after new most may "
         "such then so many about them could any very out like made up what see where just three "
         "each use through between during our how both under years well while does much city "
         "world state life water system school family group number part people day early later "
         "found known called place house").split()
def english(size, seed):
    rng, out, n = random.Random(seed), [], 0
    while n < size:
        w = rng.choice(words)
        if rng.random() < 0.08: w += "."
        if rng.random() < 0.05: w = str(rng.randint(0, 9999))
        out.append(w); n += len(w) + 1
    return " ".join(out)
def symbols(size, seed):
    rng, out, n = random.Random(seed), [], 0
    chars = string.ascii_letters + string.digits + "{}[]()<>=+-*/_#@$%^&"
    while n < size:
        w = "".join(rng.choice(chars) for _ in range(rng.randint(3, 12)))
        out.append(w); n += len(w) + 1
    return " ".join(out)
def write(name, texts):
    with open(f"{work}/{name}.jsonl", "w") as f:
        f.write("\n".join(json.dumps({"text": t}) for t in texts) + "\n")
text = english(600_000, 1).split(" ")
write("short", [" ".join(text[i:i + 200]) for i in range(0, len(text), 200)])
write("english-7mb", [english(7_170_000, 1)])
write("english-29mb", [english(28_700_000, 1)])
write("symbols-7mb", [symbols(7_170_000, 2)])
EOF

echo "| data | longest document | \`--check\` estimate (host) | measured peak (RSS) | peak / estimate |"
echo "|---|---:|---:|---:|---:|"
for data in short english-7mb english-29mb symbols-7mb; do
    cat >"$work/$data.toml" <<EOF
output_dir = "$work/run-$data"
[student]
model = "$work/models/student"
[[teachers]]
name = "qwen3"
model = "$work/models/teacher"
loss = "pkl"
[data]
path = "$work/$data.jsonl"
[training]
steps = 2
batch_size = 2
micro_batch = 2
context_length = 128
[loss]
top_k = 256
[checkpoint]
every = 100
EOF
    rm -rf "$work/run-$data"
    plan="$("$xtoken" train --config "$work/$data.toml" --check 2>&1)"
    estimate="$(sed -n 's/^host memory of one process, estimated: \([0-9.]*\) \([MG]\)B.*/\1 \2/p' <<<"$plan" |
        awk '{ print ($2 == "M") ? $1 / 1000 : $1 }')"
    document="$(grep -o 'the longest document aligned [0-9.]* [kMG]B' <<<"$plan" | sed 's/.* \([0-9.]* [kMG]B\)/\1/' | head -n 1 || true)"
    peak_kb="$(/usr/bin/time -v "$xtoken" train --config "$work/$data.toml" 2>&1 >/dev/null |
        sed -n 's/.*Maximum resident set size (kbytes): //p')"
    awk -v d="$data" -v doc="${document:-—}" -v e="$estimate" -v p="$peak_kb" 'BEGIN {
        printf "| %s | %s | %.2f GB | %.2f GB | %.2f× |\n", d, doc, e, p * 1024 / 1e9, p * 1024 / 1e9 / e
    }'
done
