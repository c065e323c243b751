#!/usr/bin/env bash
# Regenerate every figure in experiments/results/ and the tables of README.md and paper/ (about 3 h on
# 2 cores, most of it the variant space: see experiments/README.md). Each step's time is printed as it ends.
# Needs the corpus extra: pip install -e '.[corpus]'
set -euo pipefail
cd "$(dirname "$0")/.."
step() {
    local start=$SECONDS
    echo "== $*"
    python "$@"
    echo "== $1: $((SECONDS - start)) s (total $((SECONDS / 60)) min)"
}
step experiments/corpus.py --out experiments/corpus/hf
step experiments/compare.py
step experiments/bench_speed.py
step experiments/bench_depth.py
step experiments/bench_latency.py
step experiments/bench_rotary.py
step experiments/bench_gqa.py
step experiments/validation_mutations.py
step experiments/robustness.py
step experiments/bench_memory.py
step experiments/rules_vs_patterns.py
step experiments/variant_space.py          # resumes from results/.variant_space_cache.jsonl
step experiments/rope_drift.py            # RoPE per release (~15 min)
step experiments/exporter_drift.py         # reads drift_coverage.json: experiments/drift_coverage.py (~1 h) re-measures it
step experiments/render_results.py
