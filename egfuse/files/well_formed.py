"""Is the model a graph at all? The structural faults that make every later stage meaningless — a value read
but defined nowhere, a cycle, an output nothing produces, a name defined twice, a tensor whose bytes do not
match its shape, an unset IR version — each named in one line before anything is fused.

onnxruntime runs models that onnx's checker rejects (``LayerNormalization`` before opset 17 — its own op —, nodes
out of topological order), so the checker's verdict is a note in the report, not a refusal; only the faults
below, which no runtime can make sense of, stop the run."""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Iterable

import onnx

from egfuse.errors import InvalidModelError
from egfuse.files import protos


def _item_bytes() -> dict[int, int]:
    sizes = {}
    for data_type in onnx.TensorProto.DataType.values():
        if data_type in (onnx.TensorProto.UNDEFINED, onnx.TensorProto.STRING) or _bits(data_type) is not None:
            continue
        if (size := protos.item_bytes(data_type)) is not None:
            sizes[data_type] = size
    return sizes


_FIELDS = ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data")


def check(proto: onnx.ModelProto, source: str) -> list[int]:
    """Raise :class:`InvalidModelError` naming the first structural fault of ``proto``; else the order its
    nodes run in (the graph's own where that is valid: onnx requires it, but onnxruntime sorts, and so do
    exporters not always)."""
    if proto.ir_version < 3:
        raise InvalidModelError(
            f"IR version {proto.ir_version} ({'unset' if proto.ir_version == 0 else 'before opset imports'}): "
            "not a model onnxruntime loads; re-export it or set ir_version",
            path=source,
        )
    if proto.ir_version > onnx.IR_VERSION:
        raise InvalidModelError(
            f"IR version {proto.ir_version} is newer than the installed onnx reads ({onnx.IR_VERSION}): upgrade onnx",
            path=source,
        )
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    return _check_graph(proto.graph, set(), source, opset)


def checker_note(proto: onnx.ModelProto) -> str | None:
    """onnx's checker on the model, as a note: None when it passes. It reads a copy without the weights
    (large initializers stood in for by typed graph inputs): serialized whole, a model's weights would be held
    twice more, and their files the loader checked."""
    probe = protos.inference_probe(proto)
    probe.ir_version, probe.producer_name = proto.ir_version, proto.producer_name
    probe.metadata_props.extend(proto.metadata_props)
    try:
        onnx.checker.check_model(probe)
    except (onnx.checker.ValidationError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return f"onnx's checker rejects the input model ({first}); egfuse went on: onnxruntime loads models it rejects"
    return None


def _check_graph(graph: onnx.GraphProto, outer: set[str], source: str, opset: int, where: str = "") -> list[int]:
    """Definitions before reads, each name once, outputs produced, tensors sized; subgraphs (If/Loop/Scan
    bodies) also read the names their node sees."""
    _check_text(graph, source, where)
    defined: dict[str, str | int] = {}  # name → what defines it (a node by its index: labelled only for a message)

    def by(what: str | int) -> str:
        return what if isinstance(what, str) else f"node {_label(graph.node[what], what)}"

    def define(name: str, what: str | int) -> None:
        if not name:
            return
        if name in defined:
            twice = f"value {name!r}{where} is defined twice: by {by(defined[name])} and by {by(what)}"
            raise InvalidModelError(twice, path=source)
        defined[name] = what

    inputs = {i.name for i in graph.input}
    for value in graph.input:
        define(value.name, "a graph input")
    for tensor in graph.initializer:
        if tensor.name not in inputs:  # an initializer listed as an input too (IR < 4) is its default
            define(tensor.name, "an initializer")
        _check_tensor(tensor, f"initializer {tensor.name!r}{where}", source)
    for tensor in graph.sparse_initializer:
        define(tensor.values.name, "a sparse initializer")
    for index, node in enumerate(graph.node):
        for output in node.output:
            define(output, index)
    known = set(defined) | outer
    order = _run_order(graph, known, source, where)
    for index, node in enumerate(graph.node):
        _check_attributes(node, index, opset, source, where)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                _check_tensor(attr.t, f"the tensor of node {_label(node, index)}{where}", source)
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                _check_graph(sub, known, source, opset, f" (in the {attr.name!r} body of node {_label(node, index)})")
    for output in graph.output:
        if output.name not in known:
            raise InvalidModelError(
                f"graph output {output.name!r}{where} is produced by no node, input or initializer", path=source
            )
    return order


def _check_attributes(node: onnx.NodeProto, index: int, opset: int, source: str, where: str) -> None:
    """Each attribute of a standard op has the type its schema declares (a ``perm`` given as one int is no
    permutation); ops onnx does not define are onnxruntime's to judge."""
    if not node.attribute:
        return
    schema = _schema(node.op_type, opset, node.domain) if node.domain in ("", "ai.onnx") else None
    for attr in node.attribute:
        declared = schema.attributes.get(attr.name) if schema is not None else None
        if attr.type == onnx.AttributeProto.UNDEFINED or (declared is not None and attr.type != declared.type):
            expected = "" if declared is None else f", expected {onnx.AttributeProto.AttributeType.Name(declared.type)}"
            raise InvalidModelError(
                f"attribute {attr.name!r} of node {_label(node, index)}{where} has type "
                f"{onnx.AttributeProto.AttributeType.Name(attr.type)}{expected}",
                path=source,
            )


@functools.lru_cache(maxsize=1024)
def _schema(op_type: str, opset: int, domain: str) -> onnx.defs.OpSchema | None:
    """The op's schema at the opset (None: onnx does not define it); asked once per op, not per node."""
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None


def _check_text(graph: onnx.GraphProto, source: str, where: str) -> None:
    """Names are UTF-8 text (protobuf hands bytes that are not as ``bytes``: nothing can be written back).
    Looked at name by name only where one is not (a type test of every name took 6 ms of a 48-layer BERT's load)."""
    values = [*graph.input, *graph.output, *graph.value_info, *graph.initializer]
    if _all_text(values, graph.node):
        return
    for value in values:
        if isinstance(value.name, bytes):
            raise InvalidModelError(f"a value name{where} is not UTF-8 text: {value.name[:40]!r}", path=source)
    for index, node in enumerate(graph.node):
        fields = [node.name, node.op_type, node.domain, *node.input, *node.output, *(a.name for a in node.attribute)]
        bad = next((field for field in fields if isinstance(field, bytes)), None)
        if bad is not None:
            label = (
                f"#{index}" if isinstance(node.name, bytes) or isinstance(node.op_type, bytes) else _label(node, index)
            )
            raise InvalidModelError(f"node {label}{where} has a name that is not UTF-8 text: {bad[:40]!r}", path=source)


def _all_text(values: list, nodes) -> bool:
    """Whether every name of ``values`` and ``nodes`` is text: joining text works, a ``bytes`` among it raises."""
    try:
        "".join([value.name for value in values])
        for node in nodes:
            names = [node.name, node.op_type, node.domain, *node.input, *node.output]
            "".join([*names, *(a.name for a in node.attribute)])
    except TypeError:
        return False
    return True


def _run_order(graph: onnx.GraphProto, known: set[str], source: str, where: str) -> list[int]:
    """An order that runs each node after what it reads, the earliest ready node first (Kahn's algorithm: the
    graph's own order where it is one); a read of a name defined nowhere, or a cycle, is refused with the node
    named."""
    if _in_order(graph, known):  # the usual case, one pass: every read defined above its reader
        return list(range(len(graph.node)))
    producer = {o: i for i, node in enumerate(graph.node) for o in node.output if o}
    waiting: list[set[int]] = []
    readers: dict[int, list[int]] = {}
    for index, node in enumerate(graph.node):
        needs: set[int] = set()
        for name in _reads(node):
            if name not in known:
                raise InvalidModelError(
                    f"node {_label(node, index)}{where} reads {name!r}, which no node, graph input or initializer "
                    "defines",
                    path=source,
                )
            if name in producer and producer[name] != index:
                needs.add(producer[name])
            elif name in producer:
                raise InvalidModelError(f"node {_label(node, index)}{where} reads its own output {name!r}", path=source)
        waiting.append(needs)
        for need in needs:
            readers.setdefault(need, []).append(index)
    ready = [i for i, needs in enumerate(waiting) if not needs]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for reader in readers.get(index, []):
            waiting[reader].discard(index)
            if not waiting[reader]:
                heapq.heappush(ready, reader)
    if len(order) < len(graph.node):
        stuck = next(i for i, needs in enumerate(waiting) if needs)
        cycle = _cycle(stuck, waiting, graph)
        raise InvalidModelError(f"the nodes form a cycle{where}: {' → '.join(cycle)}", path=source)
    return order


def _in_order(graph: onnx.GraphProto, known: set[str]) -> bool:
    """Whether each node reads only what the graph's inputs, initializers, the outer graph (all in ``known``,
    with every node's outputs) or a node above it define: then the graph's own order runs, and is the order
    Kahn's algorithm would give (it takes the earliest ready node first)."""
    outputs = {o for node in graph.node for o in node.output if o}
    ready = known - outputs
    ready.add("")  # an omitted optional input reads nothing
    for node in graph.node:
        if not ready.issuperset(node.input):
            return False
        if node.attribute and _has_subgraph(node) and not ready.issuperset(_reads(node)):
            return False
        ready.update(node.output)
    return True


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def _cycle(start: int, waiting: list[set[int]], graph: onnx.GraphProto) -> list[str]:
    """Node labels around one cycle among the nodes left waiting, for the message."""
    seen: list[int] = []
    index = start
    while index not in seen:
        seen.append(index)
        index = min(waiting[index])
    loop = [*seen[seen.index(index) :], index]
    return [_label(graph.node[i], i) for i in reversed(loop)]


def _reads(node: onnx.NodeProto) -> Iterable[str]:
    """What a node reads: its inputs and the outer names its bodies read."""
    yield from (name for name in node.input if name)
    for sub in protos.subgraphs(node):
        yield from sorted(outer_reads(sub))


def outer_reads(graph: onnx.GraphProto) -> set[str]:
    """The names ``graph`` (and the graphs inside it) reads but does not define: what a body reads from the
    graph around it."""
    local = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    local |= {o for node in graph.node for o in node.output}
    return {name for node in graph.node for name in _reads(node)} - local


def _check_tensor(tensor: onnx.TensorProto, what: str, source: str) -> None:
    if tensor.data_type not in onnx.TensorProto.DataType.values() or tensor.data_type == onnx.TensorProto.UNDEFINED:
        raise InvalidModelError(f"{what} has no element type (data_type {tensor.data_type})", path=source)
    if any(d < 0 for d in tensor.dims):
        raise InvalidModelError(f"{what} has a negative dimension {list(tensor.dims)}", path=source)
    if tensor.data_location == onnx.TensorProto.EXTERNAL or not _known_size(tensor):
        return  # external data: the loader checked its span against the shape
    count = math.prod(tensor.dims)
    if tensor.HasField("raw_data"):
        expected = _expected_bytes(tensor, tensor.data_type)
        if len(tensor.raw_data) != expected:
            raise InvalidModelError(
                f"{what} holds {len(tensor.raw_data)} bytes of data, but its shape {list(tensor.dims)} of "
                f"{onnx.TensorProto.DataType.Name(tensor.data_type).lower()} needs {expected}",
                path=source,
            )
        return
    held = [(f, len(getattr(tensor, f))) for f in _FIELDS if len(getattr(tensor, f))]
    if not held and count == 0:
        return
    per_element = 2 if tensor.data_type in (onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128) else 1
    total = sum(n for _, n in held)
    if total != count * per_element and not _packed(tensor.data_type, total, count):
        raise InvalidModelError(
            f"{what} holds {total} values, but its shape {list(tensor.dims)} needs {count * per_element}", path=source
        )


def _packed(data_type: int, held: int, count: int) -> bool:
    """Sub-byte types (int4, float4) pack two values in each int32_data entry."""
    bits = _bits(data_type)
    return bits is not None and bits < 8 and held == math.ceil(count * bits / 8)


def _bits(data_type: int) -> int | None:
    name = onnx.TensorProto.DataType.Name(data_type)
    return 4 if name.endswith("4") and ("INT4" in name or "FLOAT4" in name) else None


def _known_size(tensor: onnx.TensorProto) -> bool:
    return tensor.data_type in _ITEM_BYTES or _bits(tensor.data_type) is not None


def _expected_bytes(tensor: onnx.TensorProto, data_type: int) -> int:
    count = math.prod(tensor.dims)
    bits = _bits(data_type)
    return math.ceil(count * bits / 8) if bits is not None else count * _ITEM_BYTES[data_type]


_ITEM_BYTES = _item_bytes()


def _tensors(graph: onnx.GraphProto) -> Iterable[onnx.TensorProto]:
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                yield from _tensors(sub)


def _label(node: onnx.NodeProto, index: int) -> str:
    return f"{node.name!r} ({node.op_type})" if node.name else f"#{index} ({node.op_type})"
