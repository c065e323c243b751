"""Mutation testing of egfuse's proof: inject semantic faults into correctly fused models and count how many
egfuse's own validation catches.

For each base block (spellings from the property-test generator: encoder with padding, causal, select mask,
GQA, MQA, KV cache, cross-attention, softcap, RoPE, float16) fused and validated for each target, every fault
kind that applies is injected into the *fused* model — a wrong or doubled scale, a dropped, inverted, rolled or
transposed mask, padding on the other side, K and V swapped, K transposed, wrong head counts, a wrong kv-head
grouping, RoPE on the wrong half or dropped, a cache reversed, softcap dropped or changed, … — and the mutant
is judged exactly as ``egfuse.fuse`` judges its own output (:func:`egfuse.validation.judge.judge`: generated feeds,
graph outputs and every fused region's output against the original on onnxruntime). A fault is caught when
validation fails or the mutant does not run.

    python experiments/validation_mutations.py          # ~1 min on 2 cores

Writes results/validation_mutations.json (``kinds``, ``trials``, ``caught``, per-kind and per-base rows) and
results/validation_mutations.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import egfuse  # noqa: E402
from egfuse.testing import Variant, attention_model  # noqa: E402
from egfuse.validation.judge import judge  # noqa: E402

RESULTS = HERE / "results"
FUSED_OPS = {"Attention", "MultiHeadAttention", "GroupQueryAttention"}

BASES = {
    "encoder, padding": Variant(heads=4),
    "causal": Variant(heads=4, k_layout="transpose_0132", causal="trilu"),
    "select mask, guard": Variant(heads=4, k_layout="transpose_0132", mask="where_finfo", guard=True),
    "int padding mask": Variant(heads=4, k_layout="transpose_0132", mask="padding_int", causal="range_greater"),
    "gqa, causal": Variant(heads=4, kv_heads=2, k_layout="transpose_0132", causal="trilu"),
    "mqa": Variant(heads=4, kv_heads=1, k_layout="transpose_0132"),
    "kv cache": Variant(heads=4, past=True, k_layout="transpose_0132", causal="trilu"),
    "cross-attention": Variant(heads=2, cross=True, k_layout="transpose_0132"),
    "softcap": Variant(heads=2, softcap="div", k_layout="transpose_0132"),
    "rope": Variant(heads=2, rope=True, rope_tables="positions", k_layout="transpose_0132", causal="trilu"),
    "float16": Variant(heads=2, dtype="float16", k_layout="transpose_0132"),
}
TARGETS = ("ort", "onnx")


# --- graph surgery ---------------------------------------------------------------------------------------------


class Mutant:
    """A copy of a fused model and its fused attention node, with helpers to rewire it."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = copy.deepcopy(model)
        self.nodes = self.model.graph.node
        fused = [n for n in self.nodes if n.op_type in FUSED_OPS]
        self.node = fused[0] if fused else None
        self._n = 0

    def name(self, hint: str) -> str:
        self._n += 1
        return f"mutant/{hint}_{self._n}"

    def insert(self, op: str, inputs: list[str], **attrs) -> str:
        """A node written just before the fused node (its inputs are all defined by then)."""
        out = self.name(op.lower())
        index = list(self.nodes).index(self.node)
        self.nodes.insert(index, helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def const(self, array: np.ndarray) -> str:
        name = self.name("const")
        self.model.graph.initializer.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def attr(self, key: str):
        for a in self.node.attribute:
            if a.name == key:
                return a
        return None

    def set_float(self, key: str, value: float) -> None:
        a = self.attr(key)
        if a is None:
            self.node.attribute.append(helper.make_attribute(key, float(value)))
        else:
            a.f = float(value)

    def input(self, i: int) -> str:
        return self.node.input[i] if len(self.node.input) > i else ""

    def mask_slot(self) -> int | None:
        """The index of the additive mask the fused op reads (standard: 3, MultiHeadAttention: 5, packed: 5)."""
        slot = {"Attention": 3 if self.node.domain in ("", "ai.onnx") else 5, "MultiHeadAttention": 5}.get(
            self.node.op_type
        )
        if slot is None or not self.input(slot):
            return None
        return slot

    @property
    def dtype(self) -> type:
        """The model's float type (float16 where its inputs or outputs are, else float32)."""
        for v in [*self.model.graph.input, *self.model.graph.output]:
            if v.type.tensor_type.elem_type == TensorProto.FLOAT16:
                return np.float16
            if v.type.tensor_type.elem_type == TensorProto.FLOAT:
                return np.float32
        return np.float32

    def fill(self) -> float:
        return float(np.finfo(self.dtype).min)

    def scalar(self, value: float) -> str:
        return self.const(np.array(value, self.dtype))

    def ints(self, *values: int) -> str:
        return self.const(np.array(values, np.int64))

    def rewire_mask(self, transform) -> bool:
        """The fused op's mask replaced by ``transform(mask name)``; False where the op reads no mask."""
        slot = self.mask_slot()
        if slot is None:
            return False
        self.node.input[slot] = transform(self.input(slot))
        return True

    @property
    def standard(self) -> bool:
        return self.node.domain in ("", "ai.onnx")

    @property
    def packed(self) -> bool:
        return self.node.op_type == "Attention" and not self.standard


def _rescaled(m: Mutant, new_scale, *, unit_too: bool = False) -> bool:
    """The op's scale attribute s replaced by ``new_scale(s)`` (not where there is none, nor where s is 1 and
    the fault would change nothing unless ``unit_too``)."""
    a = m.attr("scale")
    if a is None or (not unit_too and abs(a.f - 1.0) < 1e-6):
        return False
    m.set_float("scale", new_scale(a.f))
    return True


# --- the faults ------------------------------------------------------------------------------------------------


def scale_doubled(m: Mutant) -> bool:
    return _rescaled(m, lambda s: 2 * s, unit_too=True)


def scale_applied_twice(m: Mutant) -> bool:
    return _rescaled(m, lambda s: s * s)


def scale_dropped(m: Mutant) -> bool:
    return _rescaled(m, lambda s: 1.0)


def mask_dropped(m: Mutant) -> bool:
    return m.rewire_mask(lambda mask: "")


def mask_inverted(m: Mutant) -> bool:
    """Masked positions attended and attended ones masked: ``Where(mask == 0, fill, 0)``."""

    def inverted(mask: str) -> str:
        zero = m.scalar(0)
        return m.insert("Where", [m.insert("Equal", [mask, zero]), m.scalar(m.fill()), zero])

    return m.rewire_mask(inverted)


def mask_on_the_wrong_axis(m: Mutant) -> bool:
    """The mask's last two axes swapped (queries read as keys)."""

    def swapped(mask: str) -> str:
        wide = m.insert("Unsqueeze", [mask, m.ints(0)])
        return m.insert("Squeeze", [m.insert("Transpose", [wide], perm=[0, 1, 2, 4, 3]), m.ints(0)])

    return m.rewire_mask(swapped)


def padding_side_flipped(m: Mutant) -> bool:
    """The mask reversed along the keys: left padding read as right padding."""
    return m.rewire_mask(lambda mask: m.insert("Slice", [mask, m.ints(-1), m.ints(-(2**62)), m.ints(-1), m.ints(-1)]))


def mask_off_by_one(m: Mutant) -> bool:
    """The mask shifted one key to the right (a causal or padding boundary off by one)."""

    def shifted(mask: str) -> str:
        head = m.insert("Slice", [mask, m.ints(0), m.ints(1), m.ints(-1)])
        rest = m.insert("Slice", [mask, m.ints(0), m.ints(-1), m.ints(-1)])
        return m.insert("Concat", [head, rest], axis=-1)

    return m.rewire_mask(shifted)


def mask_of_the_first_row_for_all(m: Mutant) -> bool:
    """Every batch row gets row 0's mask (a broadcast over the batch that should not be)."""
    return m.rewire_mask(lambda mask: m.insert("Slice", [mask, m.ints(0), m.ints(1), m.ints(0)]))


def mild_fill(m: Mutant) -> bool:
    """Masked positions filled with −1 instead of a very negative number: they still get weight."""
    return m.rewire_mask(lambda mask: m.insert("Max", [mask, m.scalar(-1.0)]))


def fully_masked_rows_to_zero_weight_change(m: Mutant) -> bool:
    """Entries at finfo.min made −inf: a query row masked entirely gives NaN or 0 instead of the mean of V. Such
    rows come from left padding under a causal mask and from the feed set that pads one batch row entirely
    (``egfuse.validation.inputs.mask_feed_sets``); in half precision that row need only stay finite (its value is the
    fill's rounding), so a kernel giving 0 there goes unseen."""

    def hardened(mask: str) -> str:
        low = m.insert("LessOrEqual", [mask, m.scalar(m.fill() / 2)])
        return m.insert("Where", [low, m.scalar(-np.inf), mask])

    return m.rewire_mask(hardened)


def k_and_v_swapped(m: Mutant) -> bool:
    if m.packed or not m.input(1) or not m.input(2):
        return False
    m.node.input[1], m.node.input[2] = m.node.input[2], m.node.input[1]
    return True


def k_transposed(m: Mutant) -> bool:
    """K given with its last two axes swapped (Kᵀ where K is expected)."""
    if m.packed or not m.input(1):
        return False
    rank4 = (m.standard and not m.attr("q_num_heads")) or (not m.standard and m.input(6))
    perm = [0, 1, 3, 2] if rank4 else [0, 2, 1]
    m.node.input[1] = m.insert("Transpose", [m.input(1)], perm=perm)
    return True


def v_from_k(m: Mutant) -> bool:
    if m.packed or not m.input(1) or not m.input(2):
        return False
    m.node.input[2] = m.node.input[1]
    return True


def query_scaled_slightly(m: Mutant) -> bool:
    """Q times 0.98: a small numeric fault (a scale off by 2 %)."""
    if m.packed:
        return False
    m.node.input[0] = m.insert("Mul", [m.input(0), m.scalar(0.98)])
    return True


def head_count_wrong(m: Mutant) -> bool:
    for key in ("num_heads", "q_num_heads"):
        a = m.attr(key)
        if a is not None and a.i > 1:
            a.i //= 2
            kv = m.attr("kv_num_heads")
            if kv is not None and kv.i > a.i:
                kv.i = a.i
            return True
    return False


def kv_grouping_wrong(m: Mutant) -> bool:
    """K/V heads tiled (head i reads kv head i mod N_kv) where they must be repeated (i // group)."""
    if not m.standard or m.attr("q_num_heads") is not None or not m.input(1):
        return False
    # (B, N_kv, T, H) with N_kv < N: repeat by tiling, to N heads, so the op no longer groups them itself.
    counts = _head_counts(m)
    if counts is None or counts[1] == 1 or counts[0] == counts[1]:  # one K/V head tiled or repeated is the same
        return False
    repeats = m.ints(1, counts[0] // counts[1], 1, 1)
    m.node.input[1] = m.insert("Tile", [m.input(1), repeats])
    m.node.input[2] = m.insert("Tile", [m.input(2), repeats])
    return True


def _head_counts(m: Mutant) -> tuple[int, int] | None:
    """Query and K heads of a (B, N, S, H) standard op, from shape inference; None where unknown."""
    inferred = onnx.shape_inference.infer_shapes(m.model)
    dims = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in
            [*inferred.graph.value_info, *inferred.graph.input]}  # fmt: skip
    q, k = dims.get(m.input(0)), dims.get(m.input(1))
    if not q or not k or len(q) != 4 or len(k) != 4 or not q[1] or not k[1]:
        return None
    return q[1], k[1]


def output_features_reversed(m: Mutant) -> bool:
    """The op's output features in the wrong order (heads or head features permuted)."""
    out = m.node.output[0]
    reversed_ = m.name("reversed")
    steps = [m.ints(v) for v in (-1, -(2**62), -1, -1)]
    m.node.output[0] = m.name("raw")
    index = list(m.nodes).index(m.node)
    m.nodes.insert(index + 1, helper.make_node("Slice", [m.node.output[0], *steps], [reversed_], name=reversed_))
    for node in m.nodes:
        if node is not m.nodes[index + 1]:
            for i, name in enumerate(node.input):
                if name == out:
                    node.input[i] = reversed_
    for o in m.model.graph.output:
        if o.name == out:
            m.nodes.insert(index + 2, helper.make_node("Identity", [reversed_], [out], name=m.name("id")))
    return True


def softcap_dropped(m: Mutant) -> bool:
    a = m.attr("softcap")
    if a is None or a.f == 0.0:
        return False
    m.node.attribute.remove(a)
    return True


def softcap_changed(m: Mutant) -> bool:
    a = m.attr("softcap")
    if a is None or a.f == 0.0:
        return False
    a.f *= 2
    return True


def cache_reversed(m: Mutant) -> bool:
    """The past keys and values in the wrong order along the sequence (a cache concatenated backwards)."""
    slots = (4, 5) if m.standard else (6, 7)
    if not m.input(slots[0]) or not m.input(slots[1]):
        return False
    for slot in slots:
        m.node.input[slot] = m.insert("Slice", [m.input(slot), *(m.ints(v) for v in (-1, -(2**62), 2, -1))])
    return True


def _rotations(m: Mutant) -> list:
    return [n for n in m.nodes if n.op_type == "RotaryEmbedding"]


def _as_identity(node: onnx.NodeProto) -> None:
    """A RotaryEmbedding that no longer rotates: its input passed through."""
    node.op_type, node.domain = "Identity", ""
    del node.input[1:]
    del node.attribute[:]


def rope_wrong_half(m: Mutant) -> bool:
    """RotaryEmbedding told the pairs are interleaved where they are halves (or the other way round)."""
    rope = _rotations(m)
    if not rope:
        return False
    for a in rope[0].attribute:
        if a.name == "interleaved":
            a.i = 1 - a.i
            return True
    rope[0].attribute.append(helper.make_attribute("interleaved", 1))
    return True


def rope_dropped(m: Mutant) -> bool:
    rope = _rotations(m)
    if not rope:
        return False
    _as_identity(rope[0])
    return True


def rope_on_keys_only(m: Mutant) -> bool:
    """The rotation of Q dropped, K's kept."""
    rope = _rotations(m)
    if len(rope) < 2:
        return False
    for node in rope:
        if node.output[0] == m.input(0) or _feeds(m, node.output[0], m.input(0)):
            _as_identity(node)
            return True
    return False


def _feeds(m: Mutant, source: str, target: str, depth: int = 6) -> bool:
    producers = {o: n for n in m.nodes for o in n.output}
    stack = [(target, 0)]
    while stack:
        name, d = stack.pop()
        if name == source:
            return True
        node = producers.get(name)
        if node is not None and d < depth:
            stack.extend((i, d + 1) for i in node.input)
    return False


FAULTS: dict[str, Callable[[Mutant], bool]] = {
    "scale doubled": scale_doubled,
    "scale applied twice": scale_applied_twice,
    "scale dropped": scale_dropped,
    "query off by 2%": query_scaled_slightly,
    "mask dropped": mask_dropped,
    "mask inverted": mask_inverted,
    "mask on the wrong axis": mask_on_the_wrong_axis,
    "padding side flipped": padding_side_flipped,
    "mask off by one key": mask_off_by_one,
    "row 0's mask for every row": mask_of_the_first_row_for_all,
    "mild fill (−1)": mild_fill,
    "fully masked rows changed": fully_masked_rows_to_zero_weight_change,
    "K and V swapped": k_and_v_swapped,
    "K transposed": k_transposed,
    "V read from K": v_from_k,
    "wrong head count": head_count_wrong,
    "wrong kv-head grouping": kv_grouping_wrong,
    "output features permuted": output_features_reversed,
    "softcap dropped": softcap_dropped,
    "softcap changed": softcap_changed,
    "cache in the wrong order": cache_reversed,
    "RoPE on the wrong half": rope_wrong_half,
    "RoPE dropped": rope_dropped,
    "RoPE on K only": rope_on_keys_only,
}


# --- the experiment --------------------------------------------------------------------------------------------


def trial(original: onnx.ModelProto, result: egfuse.FuseResult, fault: Callable[[Mutant], bool]) -> dict | None:
    mutant = Mutant(result.model)
    if mutant.node is None or not fault(mutant):
        return None
    report = copy.deepcopy(result.report)  # an invalid mutant is judged too: onnxruntime refusing it is a catch
    verdict = judge(original, mutant.model, report, None, None)
    verdict.record(report)
    failing = verdict.failing
    caught = bool(failing) or report.validated is not True
    worst = max((diff for _, diff in failing.values()), default=report.max_abs_diff or 0.0)
    return {"caught": caught, "max_abs_diff": float(worst) if np.isfinite(worst) else str(worst),
            "note": (report.validation_note or "")[:160]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    start = time.perf_counter()
    rows = []
    for base, variant in BASES.items():
        original = attention_model(variant)
        for target in TARGETS:
            result = egfuse.fuse(original, target=target)
            if result.report.validated is not True or result.report.fused != 1:
                print(f"{base} / {target}: not fused and validated, skipped ({result.report.validation_note})")
                continue
            for kind, fault in FAULTS.items():
                outcome = trial(original, result, fault)
                if outcome is None:
                    continue
                rows.append({"base": base, "target": target, "kind": kind, **outcome})
                mark = "caught" if outcome["caught"] else "MISSED"
                print(f"{base:<20} {target:<5} {kind:<28} {mark}", flush=True)
    kinds = sorted({r["kind"] for r in rows})
    per_kind = {k: {"trials": sum(r["kind"] == k for r in rows),
                    "caught": sum(r["kind"] == k and r["caught"] for r in rows)} for k in kinds}  # fmt: skip
    summary = {
        "kinds": len(kinds),
        "trials": len(rows),
        "caught": sum(r["caught"] for r in rows),
        "missed": [r for r in rows if not r["caught"]],
        "per_kind": per_kind,
        "bases": list(BASES),
        "targets": list(TARGETS),
        "seconds": round(time.perf_counter() - start, 1),
        "versions": {"egfuse": egfuse.__version__, "onnxruntime": __import__("onnxruntime").__version__},
        "rows": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "validation_mutations.json").write_text(json.dumps(summary, indent=1))
    lines = [
        "# Validation under injected faults",
        "",
        f"{summary['caught']} of {summary['trials']} faulty models caught ({summary['kinds']} fault kinds, "
        f"{len(BASES)} block spellings × {len(TARGETS)} targets; `experiments/validation_mutations.py`).",
        "",
        "| fault | trials | caught |",
        "|---|---|---|",
        *(f"| {k} | {v['trials']} | {v['caught']} |" for k, v in per_kind.items()),
    ]
    if summary["missed"]:
        lines += ["", "Missed:", *(f"- {r['base']} / {r['target']}: {r['kind']}" for r in summary["missed"])]
        lines += ["", "Rows whose every key is masked come from left padding under a causal mask and from a batch row "
                  "padded entirely. In half precision the graph's value there is decided by how its fill absorbs the "
                  "scores in floating point, which no kernel is bound to reproduce, so those outputs need only be "
                  "finite: a fault that turns them into 0 (onnxruntime's float16 `Attention` on a −inf row) is not "
                  "seen (`egfuse.validation.inputs.mask_feed_sets`)."]  # fmt: skip
    (RESULTS / "validation_mutations.md").write_text("\n".join(lines) + "\n")
    print(f"{summary['caught']}/{summary['trials']} caught, {summary['kinds']} kinds, {summary['seconds']} s")
    return 0 if summary["caught"] == summary["trials"] else 1


if __name__ == "__main__":
    sys.exit(main())
