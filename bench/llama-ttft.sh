#!/bin/sh
# llama-ttft.sh - llama.cpp's time to first token with kvstrata as its prompt cache (kvs-llama)
# against llama.cpp alone, over multi-turn sessions whose histories reach 1k to 4k tokens.
#
# For each history length H: two sessions of three turns share a 256-token system prompt; each
# session's document fills the history so that its later turns' prompts are about H tokens. Each
# turn is a new request: llama.cpp alone computes the whole prompt, kvs-llama restores the longest
# stored prefix (64-token chunks) and computes the rest. Runs per H, each a new process: none
# (--no-store); dram (one private DRAM tier: each turn restores what the turn before saved); ssd
# (one SSD tier in a temporary directory under $TMPDIR, run twice: the first run's saves are the
# llama_save figures, the second run, a restart, restores everything from the SSD and gives the
# TTFT; the files are fresh, so its reads may come from the page cache).
#
# Prints JSON lines:
#   llama_ttft  mean TTFT of the turns after the first with kvstrata (mean_ms) and without
#               (reference_ms), ratio = without / with; the tokens restored and computed per turn
#   llama_save  the save after those turns (mean_ms) against the whole turn (reference_ms), ratio =
#               the mean of save / turn (target <= 0.05)
# (the keys bench/report.py parse reads: tier and context_tokens name the row)
#
# usage: bench/llama-ttft.sh [KVS_LLAMA] [GGUF]   (defaults: build/bin/kvs-llama and the mini
#        model's GGUF in build/share/kvstrata); LLAMA_TTFT_HISTORIES="1024 2048 4096" to change the
#        lengths, LLAMA_TTFT_THREADS (default 1) llama.cpp's threads.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$here/build/bin/kvs-llama}
gguf=${2:-$here/build/share/kvstrata/mini-256.gguf}
histories=${LLAMA_TTFT_HISTORIES:-1024 2048 4096}
threads=${LLAMA_TTFT_THREADS:-1}
[ -x "$bin" ] || { echo "llama-ttft.sh: $bin is not built (scripts/install-llama.sh, make)" >&2; exit 1; }
[ -f "$gguf" ] || { echo "llama-ttft.sh: no GGUF $gguf" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/kvs-llama-ttft.XXXXXX")
trap 'rm -rf "$work"' EXIT
trap 'exit 1' INT TERM

cat >"$work/dram.yaml" <<EOF
version: 1
tiers:
  - name: dram
    type: dram
    capacity: 1GiB
EOF
mkdir -p "$work/ssd"
cat >"$work/ssd.yaml" <<EOF
version: 1
tiers:
  - name: ssd
    type: ssd
    capacity: 1GiB
    paths: [$work/ssd]
EOF

sys=256 user=64 gen=4 turns=3
for h in $histories; do
    doc=$((h - sys - turns * (user + gen)))
    [ $doc -gt 0 ] || { echo "llama-ttft.sh: history $h is too short" >&2; exit 1; }
    common="--gguf $gguf --system $sys --doc $doc --user $user --gen $gen --turns $turns
            --sessions 2 --chunk 64 --threads $threads --json"
    "$bin" $common --no-store >"$work/none.$h"
    "$bin" $common --config "$work/dram.yaml" >"$work/dram.$h"
    rm -rf "$work/ssd"/*
    "$bin" $common --config "$work/ssd.yaml" >"$work/ssdfill.$h"
    "$bin" $common --config "$work/ssd.yaml" >"$work/ssd.$h"
    python3 - "$work" "$h" "$threads" <<'EOF'
import json, os, sys
work, h, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def later(mode):
    with open(os.path.join(work, f"{mode}.{h}")) as f:
        rows = [json.loads(l) for l in f if l.startswith("{")]
    return [r for r in rows if r.get("type") == "llama_turn" and r["turn"] > 0]
def mean(xs):
    return sum(xs) / len(xs) if xs else 0.0
none = later("none")
base = mean([r["ttft_ms"] for r in none])
for tier, saver in (("dram", "dram"), ("ssd", "ssdfill")):
    t = later(tier)
    with_ = mean([r["ttft_ms"] for r in t])
    print(json.dumps({"bench": "llama_ttft", "tier": tier, "context_tokens": h,
                      "mean_ms": round(with_, 3), "reference_ms": round(base, 3),
                      "reference": "llama.cpp alone (the whole prompt)",
                      "ratio": round(base / with_, 3) if with_ > 0 else None,
                      "prompt_tokens": round(mean([r["prompt"] for r in t])),
                      "restored_tokens": round(mean([r["restored"] for r in t])),
                      "computed_tokens": round(mean([r["computed"] for r in t])),
                      "turns": len(t), "llama_threads": threads, "cpus": os.cpu_count()}))
    t = later(saver)
    save = mean([r["save_ms"] for r in t])
    turn = mean([r["turn_ms"] for r in t])
    fracs = [r["save_ms"] / r["turn_ms"] for r in t if r["turn_ms"] > 0]
    print(json.dumps({"bench": "llama_save", "tier": tier, "context_tokens": h,
                      "mean_ms": round(save, 3), "reference_ms": round(turn, 3),
                      "reference": "the turn (lookup, prompt, decode, save)",
                      "ratio": round(mean(fracs), 4), "fraction_max": round(max(fracs), 4),
                      "target": 0.05, "turns": len(t), "llama_threads": threads,
                      "cpus": os.cpu_count()}))
EOF
done
