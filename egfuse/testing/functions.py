"""A generated model wrapped in model-local functions, as torch 2.1–2.4's dynamo exporter writes modules."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper


def in_functions(model: onnx.ModelProto, depth: int = 2, domain: str = "pkg.egfuse.testing") -> onnx.ModelProto:
    """``model`` as torch 2.1–2.4's dynamo exporter writes modules: the main graph one call of a model-local
    function, which calls the next, ``depth`` deep, the innermost holding every node. Weights stay initializers
    of the main graph, passed down as inputs; small constants become ``Constant`` nodes inside the body."""
    graph = model.graph
    weights = [t for t in graph.initializer if t.dims and int(np.prod(t.dims)) > 1]
    small = [t for t in graph.initializer if not (t.dims and int(np.prod(t.dims)) > 1)]
    ins = [i.name for i in graph.input] + [t.name for t in weights]
    outs = [o.name for o in graph.output]
    body = [helper.make_node("Constant", [], [t.name], value=t) for t in small] + list(graph.node)
    opsets = [helper.make_opsetid("", default_opset_of(model))]
    functions = []
    callee = None
    for level in range(depth):
        name = f"Block_{level}"
        nodes = body if callee is None else [helper.make_node(callee, ins, outs, domain=domain, name=f"call_{callee}")]
        functions.append(
            helper.make_function(domain, name, ins, outs, nodes, [*opsets, helper.make_opsetid(domain, 1)])
        )
        callee = name
    call = helper.make_node(callee, ins, outs, domain=domain, name=f"call_{callee}")
    main = helper.make_graph([call], graph.name, list(graph.input), list(graph.output), weights)
    wrapped = helper.make_model(
        main, opset_imports=[*opsets, helper.make_opsetid(domain, 1)], producer_name=model.producer_name
    )
    wrapped.functions.extend(functions)
    wrapped.ir_version = model.ir_version
    return wrapped


def default_opset_of(model: onnx.ModelProto) -> int:
    return next(e.version for e in model.opset_import if e.domain in ("", "ai.onnx"))
