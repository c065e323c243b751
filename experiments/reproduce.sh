#!/usr/bin/env bash
# Regenerate every figure in experiments/results/ and the tables of README.md and paper/ (its last timed run
# is in experiments/README.md; most of it is the variant space). Each step's time is printed as it ends.
# Needs the corpus extra: pip install -e '.[corpus]'
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step's seconds go to results/reproduce_times.tsv (after a line naming the commit, day, cores and
# whether the corpora and the variant-space cache were there to start from), which
# render_results.py turns into the run-time table of experiments/README.md and the paper.
TIMES=experiments/results/reproduce_times.tsv
state() { if [ -e "$1" ]; then echo present; else echo absent; fi; }
printf '# commit=%s day=%s cores=%s corpus=%s cache=%s\n' "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    "$(date -u +%F)" "$(nproc)" "$(state experiments/corpus)" "$(state experiments/results/.variant_space_cache.jsonl)" \
    > "$TIMES"
step() {
    local start=$SECONDS
    echo "== $*"
    python "$@"
    echo "== $1: $((SECONDS - start)) s (total $((SECONDS / 60)) min)"
    printf '%s\t%d\n' "$1" "$((SECONDS - start))" >> "$TIMES"
}
step experiments/corpus.py --out experiments/corpus/hf
step experiments/compare.py --tools ort onnxscript egfuse:ort egfuse:onnx egfuse:npu
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
