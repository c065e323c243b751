#!/usr/bin/env bash
# Regenerate every figure in experiments/results/ and the tables of README.md and paper/ (~45 min, 2 cores).
# Needs the corpus extra: pip install -e '.[corpus]'
set -euo pipefail
cd "$(dirname "$0")/.."
python experiments/corpus.py --out experiments/corpus/hf
python experiments/compare.py
python experiments/bench_speed.py
python experiments/bench_depth.py
python experiments/bench_latency.py
python experiments/bench_rotary.py
python experiments/bench_gqa.py
python experiments/validation_mutations.py
python experiments/robustness.py
python experiments/bench_memory.py
python experiments/rules_vs_patterns.py
python experiments/exporter_drift.py       # reads drift_coverage.json: python experiments/drift_coverage.py (~1 h) re-measures it
python experiments/render_results.py
