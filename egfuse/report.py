"""What happened to each attention region, as data: printable for people, JSON for tools."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum

from egfuse.version import __version__

RegionKey = tuple[str, int]
"""What validation judges and rolls back: a region's kind (:mod:`egfuse.kinds`) and its index among that kind's
regions."""


class Status(StrEnum):
    """What became of a region: a value of the report, one spelling everywhere (a ``str``: the JSON report and
    comparisons with plain strings read it as its text)."""

    FUSED = "fused"
    NOT_FUSED = "not fused"
    ROLLED_BACK = "rolled back"


@dataclass
class RegionReport:
    index: int
    softmax: str  # the softmax node's name: where to look in a viewer
    status: Status
    output: str | None = None  # the region's output value (compared on onnxruntime)
    fused_into: str | None = None  # e.g. "com.microsoft.Attention"
    form: str | None = None  # the e-graph constructor written ("attend", "mha" …)
    variants: dict[str, str] = field(default_factory=dict)  # what spelling was seen
    reason: str | None = None  # why not fused / why rolled back
    max_abs_diff: float | None = None
    notes: list[str] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)  # model-local functions its nodes were inlined from
    candidates: list[dict] = field(default_factory=list)
    """The fused forms its e-class held, each with the op the target writes for it and the predicted cost (µs)
    of the region written with it, cheapest first: the extraction's choice, explained."""
    assumed_fill: float | None = None
    """A finite select fill (−1e4) the fused op's mask writes as absorbing: equal to the graph while every
    query row keeps a key scoring well above it, which validation checks (:mod:`egfuse.validation.fill_reach`)."""
    certificate: dict | None = None
    """For a fused region, the rule applications that put its form into its output's class, per saturation
    iteration (:class:`egfuse.egraph.certify.Certificate`): with ``max_abs_diff``, the region's proof."""
    kind: str = "attention"
    """The region kind (:mod:`egfuse.kinds`): with ``index``, the key validation judges it by."""


@dataclass
class RotaryReport:
    """One rotation (rotate-half or interleaved) found in the graph: fused into ``RotaryEmbedding``, or why not."""

    index: int
    output: str  # the rotation's output value (compared on onnxruntime)
    status: Status
    variant: str | None = None  # e.g. "rotate-half, partial (16 of 32 features)"
    fused_into: str | None = None
    reason: str | None = None
    max_abs_diff: float | None = None
    functions: list[str] = field(default_factory=list)  # model-local functions its nodes were inlined from
    candidates: list[dict] = field(default_factory=list)  # the forms its e-class held, priced (as a region's)
    kind: str = "rotary"


@dataclass
class Report:
    source: str
    target: str
    regions: list[RegionReport] = field(default_factory=list)
    rotary: list[RotaryReport] = field(default_factory=list)  # RoPE, fused apart from the attention regions
    layer_ops: list[RegionReport] = field(default_factory=list)  # norms and GELUs, in the attention e-graph
    nodes_before: int = 0
    nodes_after: int = 0
    validated: bool | None = None  # None: validation not run
    validation_note: str | None = None
    max_abs_diff: float | None = None  # over the graph outputs
    stats: dict[str, float | int | str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # target-wide caveats worth knowing
    functions: dict[str, list[str]] = field(default_factory=dict)  # model-local functions "inlined" / "kept"
    unexamined: list[str] = field(default_factory=list)  # Softmax nodes no region covered: "where: node"
    rules: dict[str, int] = field(default_factory=dict)
    """Rule applications of the search that gave this result, by stable rule name (``masks.12``), most first. All
    regions share one e-graph, so the counts are the model's; each fused region's own are in its certificate."""
    egfuse_version: str = __version__

    def entries(self) -> list[RegionReport | RotaryReport]:
        """Every region's entry, of every kind: attention, rotations, norms and activations."""
        return [*self.regions, *self.rotary, *self.layer_ops]

    @property
    def fused(self) -> int:
        return sum(r.status == Status.FUSED for r in self.regions)

    @property
    def changed(self) -> bool:
        """Anything rewritten: an attention region, a rotary embedding, a norm or an activation."""
        return any(r.status == Status.FUSED for r in self.entries())

    def fused_ops(self) -> dict[str, int]:
        """Ops written, by kind (attention, RoPE, norms, activations), most first."""
        counts: dict[str, int] = {}
        for r in self.entries():
            if r.status == Status.FUSED and r.fused_into:
                counts[r.fused_into] = counts.get(r.fused_into, 0) + 1
        return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))

    def loud_note(self) -> str | None:
        """What a reader of "0/0 … unchanged" must not miss: Softmax nodes no region covered (in If/Loop
        bodies, or in functions that could not be inlined), or a model with no Softmax at all."""
        if self.unexamined:
            count = len(self.unexamined)
            shown = "; ".join(self.unexamined[:3]) + (f"; … {count - 3} more" if count > 3 else "")
            return (
                f"{count} softmax node{'s were' if count != 1 else ' was'} not examined "
                f"(inside control-flow bodies or functions egfuse did not inline, where no region can reach): {shown}"
            )
        if not self.regions:
            return "no Softmax node in the model's graph: nothing was recognised as attention, the model is unchanged"
        return None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["fused"] = self.fused
        d["attention_regions"] = len(self.regions)
        d["loud_note"] = self.loud_note()
        return d

    def to_json(self, indent: int = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=float)

    def _distinct(self) -> str:
        """How many of the regions differ (the rest repeat one up to value names: the layers of a model)."""
        distinct = self.stats.get("distinct_regions")
        return f" ({distinct} distinct)" if distinct and distinct < len(self.regions) else ""

    def __str__(self) -> str:
        """The report as the CLI prints it: the summary, what was fused beside attention, the verdict and notes,
        one row per attention region, then time and rules."""
        lines = [
            f"egfuse {self.egfuse_version}: {self.source} → target {self.target}",
            f"  attention fused: {self.fused}/{len(self.regions)}{self._distinct()}   "
            f"nodes: {self.nodes_before} → {self.nodes_after}",
        ]
        written = self.fused_ops()
        if written:
            lines.append("  ops written: " + ", ".join(f"{op} ×{count}" for op, count in written.items()))
        lines.extend(self._rotary_lines())
        lines.extend(self._layer_op_lines())
        lines.extend(self._verdict_lines())
        lines.extend(self._region_rows())
        lines.extend(self._search_lines())
        return "\n".join(lines)

    def _rotary_lines(self) -> list[str]:
        """How many rotations were fused (of which variants), and each one that was not, with why."""
        if not self.rotary:
            return []
        fused = sum(r.status == Status.FUSED for r in self.rotary)
        variants = sorted({r.variant for r in self.rotary if r.status == Status.FUSED and r.variant})
        kinds = f" ({'; '.join(variants)})" if variants else ""
        lines = [f"  rotary embeddings fused: {fused}/{len(self.rotary)}{kinds}"]
        missed = [r for r in self.rotary if r.status != Status.FUSED]
        lines.extend(f"       rotary {r.index} at {r.output}: {r.status} — {r.reason}" for r in missed)
        return lines

    def _layer_op_lines(self) -> list[str]:
        """How many norms and activations were fused, and each one rolled back, with why."""
        if not self.layer_ops:
            return []
        fused = sum(r.status == Status.FUSED for r in self.layer_ops)
        lines = [f"  norms and activations fused: {fused}/{len(self.layer_ops)}"]
        missed = [r for r in self.layer_ops if r.status == Status.ROLLED_BACK]
        lines.extend(f"       {r.softmax} at {r.output}: {r.status} — {r.reason}" for r in missed)
        return lines

    def _verdict_lines(self) -> list[str]:
        """Validation's verdict, its note, the report's notes and the loud note."""
        lines = []
        if self.validated is not None:
            verdict = "passed" if self.validated else "FAILED"
            diff = f" (max abs diff {self.max_abs_diff:.2e})" if self.max_abs_diff is not None else ""
            lines.append(f"  onnxruntime validation: {verdict}{diff}")
        if self.validation_note:
            lines.append(f"  note: {self.validation_note}")
        lines.extend(f"  note: {n}" for n in self.notes)
        loud = self.loud_note()
        if loud:
            lines.append(f"  NOTE: {loud}")
        return lines

    def _region_rows(self) -> list[str]:
        """A table of the attention regions: result and details per row, a too-long softmax name on a line of
        its own above its row, each region's notes and the form chosen below it."""
        lines = []
        width = min(max((len(r.softmax) for r in self.regions), default=12), _NAME_WIDTH)
        results = [f"fused → {r.fused_into}" if r.status == Status.FUSED else r.status for r in self.regions]
        result_width = max((len(text) for text in results), default=6)
        if self.regions:
            lines.append(f"  {'#':>3}  {'softmax node':<{width}} {'result':<{result_width}} details")
        for r, result in zip(self.regions, results, strict=True):
            details = ", ".join(f"{k}: {v}" for k, v in r.variants.items())
            if r.reason:
                details = f"{r.reason}" + (f" [{details}]" if details else "")
            name = r.softmax
            if len(name) > width:  # never cut: the full name on a line of its own, the row below it
                lines.append(f"  {r.index:>3}  {name}")
                name = ""
            lines.append(f"  {'' if not name else r.index:>3}  {name:<{width}} {result:<{result_width}} {details}")
            lines.extend(f"       note: {n}" for n in r.notes)
            if r.status == Status.FUSED and (choice := _choice_line(r)):
                lines.append(f"       {choice}")
        return lines

    def _search_lines(self) -> list[str]:
        """Where the time went, how the e-graph grew, and the rules that fired most."""
        lines = []
        timing = self.stats.get("seconds_total")
        if timing is not None:
            lines.append(
                f"  time {timing:.2f}s (saturate {self.stats.get('seconds_saturate', 0):.2f}s, certify "
                f"{self.stats.get('seconds_certify', 0):.2f}s, validate {self.stats.get('seconds_validate', 0):.2f}s); "
                "e-graph "
                f"{self.stats.get('enodes_before')} → {self.stats.get('enodes_after')} e-nodes, "
                f"{self.stats.get('iterations')} iterations ({self.stats.get('stop_reason')})"
            )
        if self.rules:
            top = ", ".join(f"{name} ×{count}" for name, count in list(self.rules.items())[:5])
            families = sorted({name.split(".")[0] for name in self.rules})
            lines.append(f"  rules applied: {len(self.rules)} ({', '.join(families)}); most: {top}")
        return lines


WRITTEN_NOTE = "fused over the ops as written"
"""A region note's start: the fused form is predicted cheaper than the region as the graph spells it, though
not than a rewrite of its own ops (which egfuse never writes: a region not fused is kept as written)."""

_NAME_WIDTH = 48
"""The softmax-name column's widest; a longer name gets a line of its own."""


def _choice_line(region: RegionReport) -> str | None:
    """The form written and what the other forms were predicted to cost. A target that fuses wherever it can
    (``keep_unfused`` off) writes a fused op even where the graph's own ops are predicted a little cheaper:
    the line says so rather than calling the cheaper prediction the choice."""
    priced = [c for c in region.candidates if c.get("cost_us") is not None]
    fused = [c for c in priced if c["form"] != "unfused"]
    if len(priced) < 2 or not fused:
        return None
    written = next((c for c in fused if c["form"] == region.form), None)
    written = written or next((c for c in fused if c["op"] == region.fused_into), fused[0])
    others = [c for c in priced if c is not written]
    listed = ", ".join(f"{c['form']} → {c['op']} {c['cost_us']:.0f} µs" for c in others[:3])
    line = f"chosen: {written['form']} → {written['op']}, {written['cost_us']:.0f} µs predicted"
    if any(n.startswith(WRITTEN_NOTE) for n in region.notes):  # beats the ops as written, not their rewrite
        return f"{line}; also priced: {listed}"
    if any(c["form"] == "unfused" and c["cost_us"] < written["cost_us"] for c in others):
        return f"{line} (this target fuses wherever it can; also priced: {listed})"
    return f"{line}; over {listed}"
