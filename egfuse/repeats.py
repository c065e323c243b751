"""Repeated regions, solved once: the layers of a model are one region up to the names of their values.

A 48-layer model has 48 attention regions, 96 norms and as many activations, but only two or three distinct ones
(the first layer often holds the mask's computation the others read). Loading all of them into the e-graph made
loading, saturation and extraction grow with depth, though every repeat comes out the same. So each region is
lowered alone first (:meth:`egfuse.egraph.certify.Certifier.lower`, which numbers a region's values in the order it
meets them): regions of one kind whose commands are equal, and whose values have the same shapes and element types
position by position, are equal up to renaming. Only the first of each such group (its representative) goes into
the e-graph; a repeat is written from the representative's extracted program with every graph value renamed
position by position (:class:`Renamed`). Validation still runs the whole written model, as before.

A program that reads a value outside the representative's own lowering cannot be renamed; writing raises
:class:`NotRenamed` and the search runs again with every region in the e-graph (:func:`egfuse.search.fuse_once`).
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import onnx_ir as ir

from egfuse.analysis.facts import GraphFacts
from egfuse.egraph.certify import LoweredRegion
from egfuse.egraph.enodes import value_index
from egfuse.egraph.session import EClass, ENode
from egfuse.kinds.regions import Region
from egfuse.lowering.lower_terms import Lowered


class NotRenamed(Exception):
    """A repeat's program read a value the representative's lowering does not hold: no renaming is known."""


@dataclass
class Repeats:
    """Which regions go into the e-graph (``representatives``, in the order given) and, for every other region,
    the renaming of its representative's values onto its own."""

    representatives: list[Region] = field(default_factory=list)
    lowered: dict[int, LoweredRegion] = field(default_factory=dict)
    """Every region's lone lowering, by ``id(region)`` (the certificates reuse it)."""
    renames: dict[int, dict[ir.Value, ir.Value]] = field(default_factory=dict)
    """``id(repeat)`` → {representative's value: the repeat's value at the same position}."""

    def rename_of(self, region: Region) -> dict[ir.Value, ir.Value] | None:
        return self.renames.get(id(region))

    def classes_of(self, region: Region, class_of: Mapping[ir.Value, EClass]) -> Mapping[ir.Value, EClass]:
        """``class_of`` as ``region`` sees it: a repeat's values in the classes of its representative's."""
        rename = self.rename_of(region)
        if rename is None:
            return class_of
        own = {mine: class_of[theirs] for theirs, mine in rename.items() if theirs in class_of}
        return ChainMap(own, class_of)  # type: ignore[arg-type]

    def extend(self, class_of: dict[ir.Value, EClass], regions: list[Region]) -> None:
        """Puts the main output of every repeat among ``regions`` (what the writers of norms and rotations read) in
        its representative's class — also where the value is there already as another region's input, whose leaf
        class does not hold the fused form (the repeat's own value, had it been lowered, would be preferred too)."""
        for region in regions:
            rename = self.rename_of(region)
            if rename is None:
                continue
            theirs = next((t for t, mine in rename.items() if mine is region.main_output), None)
            if theirs is not None and theirs in class_of:
                class_of[region.main_output] = class_of[theirs]


def find_repeats(
    regions: list[tuple[str, Region]],
    lower: Callable[[Region], LoweredRegion],
    facts: GraphFacts,
    *,
    solve_once: bool = True,
) -> Repeats:
    """Groups ``(kind, region)`` pairs by their lone lowering; with ``solve_once`` off every region is its own
    representative (the search's fallback)."""
    repeats = Repeats()
    first: dict[tuple, Region] = {}
    for kind, region in regions:
        lowered = repeats.lowered[id(region)] = lower(region)
        key = (kind, lowered, _signature(lowered.values, facts))
        representative = first.setdefault(key, region) if solve_once else region
        if representative is region:
            repeats.representatives.append(region)
            continue
        theirs = repeats.lowered[id(representative)].values
        repeats.renames[id(region)] = dict(zip(theirs, lowered.values, strict=True))
    return repeats


def _signature(values: tuple[ir.Value, ...], facts: GraphFacts) -> tuple:
    """Shapes and element types position by position: what the cost model and the writers read beyond the
    commands (the commands state only the dims the rules compare)."""
    return tuple((facts.shape(v), v.dtype) for v in values)  # (Dims compare as their text did, without making it)


class Renamed(Lowered):
    """A lowered table whose values are read through a repeat's renaming: the representative's program, written
    with the repeat's own values — except those of classes whose chosen program reads only values the renaming
    leaves in place (:class:`InPlace`), which are the same tensor in every repeat."""

    def __init__(self, table: Lowered, rename: dict[ir.Value, ir.Value], kept: frozenset[int] = frozenset()) -> None:
        super().__init__(values=_RenamedValues(table.values, rename, kept), ids=table.ids, leaves=table.leaves,  # type: ignore[arg-type]
                         commands=table.commands, cuts=table.cuts)  # fmt: skip


class InPlace:
    """Which values a repeat reads as the representative's own: those of classes that hold a term over values the
    renaming leaves in place (shared constants, graph inputs, the mask every layer reads) — the same tensor in
    every repeat. With every region in one e-graph, the layers' equal classes were one class, and every layer read
    its first value (a cos/sin table sliced to the sequence length in each layer: one slice written, not one a
    layer); this keeps that."""

    def __init__(self, table: Lowered, classes: Mapping[EClass, list[ENode]]) -> None:
        self._table, self._classes = table, classes
        self._users: dict[EClass, list[tuple[EClass, int]]] = {}  # child class → (parent class, node position)
        self._leaves: dict[int, EClass] = {}  # a ``value`` leaf's id → its class
        self._open: dict[tuple[EClass, int], int] = {}  # (class, node position) → children not yet known fixed
        self._free: list[EClass] = []  # classes holding a term with no class children (a constant's fill)
        for cid, nodes in classes.items():
            for position, node in enumerate(nodes):
                index = value_index(node)
                if index is not None:
                    if node.op == "value":
                        self._leaves[index] = cid
                    continue
                children = set(node.children)
                if not children:
                    self._free.append(cid)
                self._open[cid, position] = len(children)
                for child in children:
                    self._users.setdefault(child, []).append((cid, position))
        self._done: dict[frozenset[int], frozenset[int]] = {}

    def kept(self, rename: dict[ir.Value, ir.Value]) -> frozenset[int]:
        """The value ids a repeat with ``rename`` reads as they are (computed once per set of values left in place:
        the repeats of one representative share it)."""
        values = self._table.values
        same = frozenset(i for i in self._leaves if rename.get(values[i]) is values[i])
        if same not in self._done:
            self._done[same] = self._propagate(same)
        return self._done[same]

    def _propagate(self, same: frozenset[int]) -> frozenset[int]:
        fixed: set[EClass] = set()
        waiting = dict(self._open)
        work = [*(self._leaves[i] for i in same), *self._free]
        while work:
            cid = work.pop()
            if cid in fixed:
                continue
            fixed.add(cid)
            for parent, position in self._users.get(cid, ()):
                waiting[parent, position] -= 1
                if waiting[parent, position] == 0 and parent not in fixed:
                    work.append(parent)
        return frozenset(
            index for cid in fixed for node in self._classes[cid] if (index := value_index(node)) is not None
        )


class _RenamedValues(Sequence):
    def __init__(self, values: list[ir.Value], rename: dict[ir.Value, ir.Value], kept: frozenset[int]) -> None:
        self._values, self._rename, self._kept = values, rename, kept

    def __len__(self) -> int:
        return len(self._values)

    def __getitem__(self, index):  # type: ignore[override]
        value = self._values[index]
        if index in self._kept:
            return value
        if value not in self._rename:
            raise NotRenamed(f"{value.name} is not a value of the representative region")
        return self._rename[value]
