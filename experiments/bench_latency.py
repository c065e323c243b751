"""Latency of the fused models on onnxruntime CPU, side by side with the unfused export and the other tools.

Five 4-layer random models of realistic width (hidden 768, 12 heads), batch 1, at sequence 128 and 512:
BERT-base-shaped; Llama-shaped (12 query heads, 4 KV heads, RoPE, causal); the same Llama's decode step
(one new token after 127 or 511 cached ones: ``llama_decode``); a ViT-base-shaped encoder (16-pixel patches of
the square image nearest the length: 122 and 530 tokens); and a Whisper-encoder-shaped model (80 mel bins,
two convolutions, ``max_source_positions`` = the length). Variants: the dynamo export as is, onnxscript's
``optimize_for_ort``, onnxruntime's optimizer (``model_type`` bert, gpt2, vit, or bart for Whisper), egfuse
for each target, and — what a user with the PyTorch source would try first — the same model re-exported at
``opset_version=23`` (torch then writes the standard ``Attention`` itself for SDPA models).

Sessions use onnxruntime's default options (what users get). Runs are interleaved in blocks of five after a
pause and an untimed run (variant A, B, … then again, the order rotated each round; at least 12 rounds and 90 s
per row), medians are reported as ratios to the unfused export. A tool's output is reused from an earlier run only
while the code that made it is unchanged (egfuse's source fingerprint, the other tools' versions).

    python experiments/bench_latency.py                       # every model (~20 min on 2 cores, exports first)
    python experiments/bench_latency.py --models vit          # one model; the others' rows are kept
    python experiments/bench_latency.py --quick               # sequence 128 only, fewer runs
    python experiments/bench_latency.py --render              # results/latency.md again from latency.json

Writes results/latency.json (``ratios``: ``{model: {seq: {tool: ratio to the unfused export}}}``, ``verdict``:
the best egfuse target against the best other tool per model and sequence, ``peak``: the GFLOP/s a large
MatMul reaches here and what each fused model achieves, ``same_graph``: the variants of a row that are one graph —
the difference between their ratios is that run's noise), results/latency.md and
``latency_ratio_vs_onnxscript`` in summary.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from fingerprint import package_version, source_fingerprint

HERE = Path(__file__).parent
REPO = HERE.absolute().parent
RESULTS = HERE / "results"
MODELS = HERE / "corpus" / "latency"
TOOLS = ["onnxscript", "ort", "egfuse:ort", "egfuse:onnx"]
ORIGINAL = "original (dynamo, opset 18)"
PACKAGE = {"onnxscript": "onnxscript", "ort": "onnxruntime"}


KINDS = ("bert", "llama", "llama_decode", "vit", "whisper_encoder")
STATIC = {"llama_decode", "vit", "whisper_encoder"}
"""Kinds exported once per sequence length: a ViT's patch count is its image size, a Whisper encoder's length
its ``max_source_positions``, and a decode step's cache length is fixed for the run (torch.export cannot
state total = past + new)."""
MODEL_TYPE = {"bert": "bert", "llama": "gpt2", "llama_decode": "gpt2", "vit": "vit", "whisper_encoder": "bart"}
HIDDEN, HEADS, KV_HEADS, LAYERS, VOCAB = 768, 12, 4, 4, 1000


def tokens(kind: str, seq: int) -> int:
    """The attention length a (kind, seq) row runs at: a ViT's patches plus its class token (16-pixel patches on
    the square image nearest ``seq`` tokens), the cache plus the new token for a decode step, else ``seq``."""
    if kind == "vit":
        return round((seq - 1) ** 0.5) ** 2 + 1
    return seq


def _llama_config(use_cache: bool):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=2048,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=1024,
        use_cache=use_cache,
        attn_implementation="sdpa",
    )


def example_inputs(kind: str, seq: int) -> dict[str, np.ndarray]:
    """The inputs a (kind, seq) row is exported with and timed on: batch 1, all-ones masks."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, (1, seq)).astype(np.int64)
    if kind in ("bert", "llama"):
        return {"input_ids": ids, "attention_mask": np.ones((1, seq), np.int64)}
    if kind == "vit":
        side = 16 * round((seq - 1) ** 0.5)
        return {"pixel_values": rng.standard_normal((1, 3, side, side)).astype(np.float32)}
    if kind == "whisper_encoder":
        return {"input_features": rng.standard_normal((1, 80, 2 * seq)).astype(np.float32)}
    feeds = {"input_ids": ids[:, :1], "attention_mask": np.ones((1, seq), np.int64)}  # llama_decode
    for i in range(LAYERS):
        for name in ("key", "value"):
            feeds[f"past_{name}_{i}"] = rng.standard_normal((1, KV_HEADS, seq - 1, HIDDEN // HEADS)).astype(np.float32)
    return feeds


def build(kind: str, seq: int = 128):
    """The module, its example inputs (names, arrays) and its output names."""
    import torch
    from transformers import BertConfig, BertModel, LlamaModel, ViTConfig, ViTModel, WhisperConfig, WhisperModel

    torch.manual_seed(0)
    inputs = example_inputs(kind, seq)
    if kind == "bert":
        cfg = BertConfig(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            intermediate_size=3072,
            max_position_embeddings=512,
            attn_implementation="sdpa",
        )
        inner = BertModel(cfg, add_pooling_layer=False)
    elif kind == "llama":
        inner = LlamaModel(_llama_config(use_cache=False))
    elif kind == "vit":
        cfg = ViTConfig(
            hidden_size=HIDDEN,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            intermediate_size=3072,
            image_size=16 * round((seq - 1) ** 0.5),
            patch_size=16,
            attn_implementation="sdpa",
        )
        inner = ViTModel(cfg, add_pooling_layer=False)
    elif kind == "whisper_encoder":
        cfg = WhisperConfig(
            vocab_size=VOCAB,
            d_model=HIDDEN,
            encoder_layers=LAYERS,
            encoder_attention_heads=HEADS,
            encoder_ffn_dim=3072,
            decoder_layers=1,
            decoder_attention_heads=HEADS,
            num_mel_bins=80,
            max_source_positions=seq,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=1,
            attn_implementation="sdpa",
        )
        inner = WhisperModel(cfg).get_encoder()
    elif kind == "llama_decode":  # one new token after seq − 1 cached ones
        from corpus import cache_step  # the corpus's decoder step with a KV cache

        cfg = _llama_config(use_cache=True)
        step, outputs = cache_step(LlamaModel(cfg), cfg)
        return step.eval(), inputs, outputs
    else:
        raise ValueError(f"unknown model kind {kind!r}")

    return exportable(inner, list(inputs)), inputs, ["last_hidden_state"]


def exportable(inner, names: list[str]):
    """``inner`` (a transformers model) behind the positional signature torch.export's dynamic_shapes are
    written against: ``(input_ids, attention_mask)`` or one input; its last hidden state out."""
    import torch

    class Text(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = inner

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    class Single(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = inner

        def forward(self, x):
            return self.model(**{names[0]: x}).last_hidden_state

    return (Text() if len(names) == 2 else Single()).eval()


def model_path(kind: str, opset: int, seq: int) -> Path:
    return MODELS / (f"{kind}_s{seq}_opset{opset}.onnx" if kind in STATIC else f"{kind}_opset{opset}.onnx")


def export(kind: str, opset: int, seq: int = 128) -> Path:
    import torch

    path = model_path(kind, opset, seq)
    if path.exists():
        return path
    MODELS.mkdir(parents=True, exist_ok=True)
    model, inputs, outputs = build(kind, seq)
    dynamic = None
    if kind not in STATIC:
        length = torch.export.Dim("sequence", min=2, max=1024)
        dynamic = tuple({1: length} for _ in inputs)
    program = torch.onnx.export(
        model,
        tuple(torch.from_numpy(a) for a in inputs.values()),
        input_names=list(inputs),
        output_names=outputs,
        dynamic_shapes=dynamic,
        opset_version=opset,
        dynamo=True,
    )
    program.save(str(path), external_data=False)
    return path


def optimize(tool: str, source: Path, kind: str) -> tuple[Path | None, str]:
    """The tool's output for ``source``, reused from an earlier run only while what made it is unchanged: an
    egfuse output is stamped with egfuse's source fingerprint (a stale one timed the code of an older commit)."""
    out = source.with_name(source.name.replace("_opset18", "").replace(".onnx", f".{tool.replace(':', '_')}.onnx"))
    stamp = out.with_name(out.name + ".fingerprint")
    made_by = source_fingerprint() if tool.startswith("egfuse") else package_version(PACKAGE[tool])
    if out.exists() and stamp.exists() and stamp.read_text() == made_by:
        return out, ""
    out.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        str(HERE / "optimize_worker.py"),
        tool,
        str(source),
        "--out",
        str(out),
        "--heads",
        str(HEADS),
        "--hidden",
        str(HIDDEN),
        "--model-type",
        MODEL_TYPE[kind],
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return None, (proc.stderr.strip().splitlines() or ["the optimizer wrote nothing"])[-1][:200]
    record = json.loads(lines[-1])
    if not record.get("ok"):
        return None, record.get("error", "failed")
    stamp.write_text(made_by)
    return out, json.dumps(record.get("fused"))


def matmul_peak_gflops(n: int = 2048, runs: int = 5) -> float:
    """The machine's practical peak: onnxruntime's own MatMul on two n×n float32 matrices."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"])],
        "peak",
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [n, n]) for x in ("a", "b")],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [n, n])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {x: np.random.default_rng(0).standard_normal((n, n)).astype(np.float32) for x in ("a", "b")}
    session.run(None, feeds)
    best = min(_timed(session, feeds) for _ in range(runs))
    return 2.0 * n**3 / best / 1e9


def _timed(session, feeds) -> float:
    start = time.perf_counter()
    session.run(None, feeds)
    return time.perf_counter() - start


def model_gflop(kind: str, seq: int) -> float:
    """The model's matrix-multiply work at batch 1 (projections, MLP, scores and values), GFLOP."""
    hidden, n = HIDDEN, tokens(kind, seq)
    if kind in ("bert", "vit", "whisper_encoder"):
        per_layer = 2 * n * hidden * (4 * hidden + 2 * 3072) + 4 * n * n * hidden
    elif kind == "llama":  # q and o full width, k and v a third (4 of 12 heads), gated MLP
        per_layer = 2 * n * hidden * (hidden * (2 + 2 / 3) + 3 * 2048) + 4 * n * n * hidden
    else:  # a decode step: one token's projections and MLP, its scores and values over the n cached positions
        per_layer = 2 * hidden * (hidden * (2 + 2 / 3) + 3 * 2048) + 4 * n * hidden
    return LAYERS * per_layer / 1e9


def open_session(path: Path, feeds: dict):
    """A warmed-up session and the feeds it takes, or why it cannot run."""
    import onnxruntime as ort

    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = {i.name for i in session.get_inputs()}
        mine = {k: v for k, v in feeds.items() if k in names}
        session.run(None, mine)  # warm-up
    except Exception as err:
        return f"fails on onnxruntime: {str(err).strip().splitlines()[-1][:120]}"
    return session, mine


def time_interleaved(sessions: dict, rounds: int, min_seconds: float, block: int = 5) -> dict[str, list[float]]:
    """Each variant run in short blocks, the blocks interleaved and their order rotated every round: a slow
    spell of a shared machine falls on every variant alike instead of on whichever variant it hit. Each block
    starts with a 0.1 s pause and an untimed run: onnxruntime's threads keep spinning for a while after a run
    (its default), and the previous session's spinning threads slowed the next one's runs (a decode step 2–3×
    slower in blocks of five without the pause). At least ``rounds`` blocks, more for a fast model until the
    runs took ``min_seconds``."""
    names = list(sessions)
    times: dict[str, list[float]] = {name: [] for name in names}
    began, r = time.perf_counter(), 0
    while r < rounds or time.perf_counter() - began < min_seconds:
        for name in names[r % len(names) :] + names[: r % len(names)]:
            session, feeds = sessions[name]
            time.sleep(0.1)
            session.run(None, feeds)
            for _ in range(block):
                start = time.perf_counter()
                session.run(None, feeds)
                times[name].append(time.perf_counter() - start)
        r += 1
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=12, help="blocks of 5 runs of each variant, interleaved")
    parser.add_argument("--min-seconds", type=float, default=90.0, help="more rounds until a row took this long")
    parser.add_argument("--models", nargs="+", choices=KINDS, default=list(KINDS),
                        help="measure these; the others' rows are kept from results/latency.json")  # fmt: skip
    parser.add_argument("--render", action="store_true", help="write results/latency.md from latency.json, no timing")
    args = parser.parse_args(argv)
    if args.render:
        old = json.loads((RESULTS / "latency.json").read_text())
        write({k: old[k] for k in ("rounds", "min_seconds", "models", "peak")})
        return 0
    seqs = [128] if args.quick else [128, 512]
    rounds, min_seconds = (2, 5.0) if args.quick else (args.rounds, args.min_seconds)
    results: dict = {"rounds": rounds, "min_seconds": min_seconds, "models": {}}
    previous = RESULTS / "latency.json"
    if previous.exists() and set(args.models) != set(KINDS):
        old = json.loads(previous.read_text())
        for kind, data in old.get("models", {}).items():
            if kind not in args.models:
                data.setdefault("seqs", old.get("seqs", seqs))
                data.setdefault("peak_gflops", old["peak"]["matmul_gflops"])  # the peak of the run that timed it
                results["models"][kind] = data
    before = matmul_peak_gflops()  # and again after the rows: the best of both (a busy moment reads low)
    for kind in args.models:
        table: dict[str, dict[str, list]] = {}
        paths: dict[str, dict[str, str | None]] = {}
        notes: dict[str, dict[str, str]] = {}
        for s in seqs:
            key = str(s)
            source = export(kind, 18, s)
            variants: dict[str, Path | None] = {ORIGINAL: source}
            notes[key] = {}
            for tool in TOOLS:
                variants[tool], notes[key][tool] = optimize(tool, source, kind)
            try:
                variants["torch opset 23"] = export(kind, 23, s)
            except Exception as err:  # recorded, not fatal
                variants["torch opset 23"], notes[key]["torch opset 23"] = None, f"export failed: {err}"[:300]
            paths[key] = {name: _relative(v) if v else None for name, v in variants.items()}
            feeds = example_inputs(kind, s)
            sessions = {}
            for name, path in variants.items():
                opened = open_session(path, feeds) if path is not None else notes[key].get(name, "not built")
                if isinstance(opened, str):
                    table.setdefault(name, {})[key] = [opened]
                else:
                    sessions[name] = opened
            for name, seconds in time_interleaved(sessions, rounds, min_seconds).items():
                table.setdefault(name, {})[key] = seconds
                shown = f"{statistics.median(seconds) * 1000:.1f} ms over {len(seconds)} runs"
                print(f"{kind} S={s} {name:<28} {shown}", flush=True)
            del sessions
        results["models"][kind] = {
            "seqs": seqs,
            "tokens": {str(s): tokens(kind, s) for s in seqs},
            "variants": paths,
            "notes": notes,
            "seconds": table,
        }
    results["peak"] = {"matmul_gflops": round(max(before, matmul_peak_gflops()), 1)}
    for kind in args.models:
        results["models"][kind]["peak_gflops"] = results["peak"]["matmul_gflops"]
    write(results)
    return 0


def _relative(path: Path) -> str:
    """A results file names models relative to the repository, never by this machine's path."""
    return Path(path).absolute().relative_to(REPO).as_posix()  # not resolve(): a linked corpus stays in the repo


def _median(values: list) -> float | None:
    numbers = [v for v in values if isinstance(v, float)]
    return statistics.median(numbers) if numbers else None


def same_graphs(variants: dict[str, str | None]) -> list[list[str]]:
    """The variants of one row (name → model path relative to the repository) that hold the same graph, byte for
    byte once the nodes' source maps and the producer are set aside: groups of two or more, in column order.
    Timed side by side, their ratios differ only by the run's noise — the yardstick the other gaps are read by."""
    import onnx

    graphs: dict[bytes, list[str]] = {}
    for name, path in variants.items():
        if not name.startswith("egfuse") or path is None or not (REPO / path).exists():
            continue
        model = onnx.load(str(REPO / path), load_external_data=False)
        for node in model.graph.node:
            del node.metadata_props[:]
        graphs.setdefault(model.graph.SerializeToString(), []).append(name)
    return [names for names in graphs.values() if len(names) > 1]


def write(results: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    same: dict = {}
    spread: list[float] = []
    columns = [ORIGINAL, *TOOLS, "torch opset 23"]
    lines = ["| model | seq | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    ratios_vs_onnxscript = {}
    ratios: dict = {}
    verdict: dict = {}
    achieved: dict = {}
    for kind, data in results["models"].items():
        for seq in data["seqs"]:
            s = str(seq)
            base = _median(data["seconds"][ORIGINAL][s])
            if base:
                ratios.setdefault(kind, {})[str(s)] = {
                    name: round(m / base, 3)
                    for name, by_seq in data["seconds"].items()
                    if name != ORIGINAL and (m := _median(by_seq[s]))
                }
                ours = {k: v for k, v in ratios[kind][str(s)].items() if k.startswith("egfuse")}
                others = {k: v for k, v in ratios[kind][str(s)].items() if not k.startswith("egfuse")}
                if ours and others:
                    best, rival = min(ours, key=ours.get), min(others, key=others.get)
                    verdict.setdefault(kind, {})[str(s)] = {
                        "best_egfuse": best, "ratio": ours[best], "best_other": rival, "other_ratio": others[rival],
                        "egfuse_vs_other": round(ours[best] / others[rival], 3),
                    }  # fmt: skip
                best_seconds = min(
                    (m for by_seq in data["seconds"].values() if (m := _median(by_seq[s]))), default=None
                )
                if best_seconds:
                    achieved.setdefault(kind, {})[str(s)] = round(model_gflop(kind, seq) / best_seconds, 1)
            cells = []
            for by_seq in (data["seconds"].get(name, {s: ["not run"]}) for name in columns):
                m = _median(by_seq[s])
                if m is None:
                    reason = next((v for v in by_seq[s] if isinstance(v, str)), "n/a")
                    cells.append(f"— ({reason[:50]})")
                else:
                    cells.append(f"{m * 1000:.1f} ms ({m / base:.2f}×)" if base else f"{m * 1000:.1f} ms")
            shown = s if tokens(kind, seq) == seq else f"{s} ({tokens(kind, seq)} tokens)"
            lines.append(f"| {kind} | {shown} | " + " | ".join(cells) + " |")
            for group in same_graphs(data.get("variants", {}).get(s, {})):
                same.setdefault(kind, {})[s] = group
                alike = [ratios.get(kind, {}).get(s, {}).get(name) for name in group]
                if None not in alike:
                    spread.append(max(alike) - min(alike))
            ours = _median(data["seconds"]["egfuse:ort"][s])
            theirs = _median(data["seconds"]["onnxscript"][s])
            if ours and theirs:
                ratios_vs_onnxscript[f"{kind}_s{s}"] = round(ours / theirs, 3)
    results["ratios"] = ratios
    results["verdict"] = verdict
    results["peak"]["achieved_gflops_fastest"] = achieved
    results["same_graph"] = same
    if same:
        rows = sum(len(by_seq) for by_seq in same.values())
        lines += [
            "",
            f"Variants that wrote the same graph (byte for byte, source maps aside) on {rows} rows: "
            + "; ".join(sorted({" = ".join(g) for by_seq in same.values() for g in by_seq.values()}))
            + f". Timed side by side, their ratios differ by at most {max(spread, default=0.0):.3f} (median "
            f"{statistics.median(spread) if spread else 0.0:.3f}): this run's noise.",
        ]
    lines += [
        "",
        "Best egfuse target against the best other tool (ratio of their times; < 1: egfuse faster), and the GFLOP/s "
        "the fastest variant's matrix work achieves against a large MatMul's on the machine in the run that timed "
        "that model (rows from separate runs are compared only within themselves):",
        "",
    ]
    for kind, by_seq in verdict.items():
        peak = results["models"][kind].get("peak_gflops", results["peak"]["matmul_gflops"])
        for s, v in by_seq.items():
            got = achieved.get(kind, {}).get(s)
            share = f", {got:.0f} GFLOP/s ({got / peak:.0%} of a {peak:.0f} GFLOP/s peak)" if got else ""
            lines.append(f"- {kind} S={s}: {v['best_egfuse']} {v['ratio']:.2f}× vs {v['best_other']} "
                         f"{v['other_ratio']:.2f}× → {v['egfuse_vs_other']:.3f}{share}")  # fmt: skip
    results["markdown_table"] = "\n".join(lines)
    (RESULTS / "latency.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    (RESULTS / "latency.md").write_text(
        "# Fused-model latency on onnxruntime CPU\n\nBatch 1, median of interleaved runs; ratio to the unfused "
        "export in parentheses (lower is faster).\n\n" + results["markdown_table"] + "\n"
    )
    summary_path = RESULTS / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    summary["latency_ratio_vs_onnxscript"] = ratios_vs_onnxscript
    summary_path.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    sys.exit(main())
