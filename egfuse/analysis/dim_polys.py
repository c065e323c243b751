"""Dims that add, as polynomials: the normal form that makes two spellings of one size compare equal.

A dim's text such as ``s0*(s1//10) - s0`` (a convolution's output length times the batch, written differently by
shape inference and by the exporter) is read as a polynomial over atoms — symbols, and floor quotients or calls
kept whole — with its terms in a fixed order, and written back as text. :class:`egfuse.analysis.dims.Dim` carries that
text as one symbol; this module is the algebra behind it (products, sums, exact division), on plain
``(coef, syms)`` pairs so it needs nothing of ``Dim`` itself.
"""

from __future__ import annotations

import ast
import functools

Poly = dict[tuple[str, ...], int]  # sorted atoms of a term → its coefficient


def is_sum(sym: str) -> bool:
    return " + " in sym or " - " in sym or sym.startswith("-")


def poly_of(coef: int, syms: tuple[str, ...]) -> Poly:
    """The polynomial of the monomial ``coef · syms``, each symbol that holds a sum's normal form expanded."""
    poly: Poly = {(): coef}
    for sym in syms:
        factor = parse_poly(sym) if is_sum(sym) else None
        poly = poly_mul(poly, factor if factor is not None else {(sym,): 1})
    return poly


def poly_mul(a: Poly, b: Poly) -> Poly:
    out: Poly = {}
    for ta, ca in a.items():
        for tb, cb in b.items():
            term = tuple(sorted(ta + tb))
            out[term] = out.get(term, 0) + ca * cb
    return out


def poly_div(a: Poly, b: Poly) -> Poly | None:
    """Exact quotient ``a / b`` of two polynomials, or ``None`` where ``b`` does not divide ``a`` — long division
    under a graded order (the leading term of a product is the product of the leading terms, so an exact
    quotient shows itself term by term): ``(8·past + 8·new)·B·4 / (8·past + 8·new)`` is ``4·B``, the folded
    batch of a cache's keys reshaped with -1."""
    atoms = sorted({s for term in (*a, *b) for s in term})

    def order(term: tuple[str, ...]) -> tuple:
        return (len(term), tuple(term.count(atom) for atom in atoms))

    divisor = {t: c for t, c in b.items() if c}
    remainder = {t: c for t, c in a.items() if c}
    if not divisor:
        return None
    lead = max(divisor, key=order)
    quotient: Poly = {}
    while remainder:
        term = max(remainder, key=order)
        rest = list(term)
        for atom in lead:
            if atom not in rest:
                return None
            rest.remove(atom)
        if remainder[term] % divisor[lead]:
            return None
        q_term, q_coef = tuple(sorted(rest)), remainder[term] // divisor[lead]
        quotient[q_term] = quotient.get(q_term, 0) + q_coef
        for t, c in divisor.items():
            product_term = tuple(sorted(q_term + t))
            remainder[product_term] = remainder.get(product_term, 0) - q_coef * c
            if not remainder[product_term]:
                del remainder[product_term]
    return quotient


def term_text(term: tuple[str, ...], coef: int) -> str:
    if not term:
        return str(coef)
    return "*".join(term) if coef == 1 else f"{coef}*" + "*".join(term)


def normal_form(poly: Poly) -> tuple[int, tuple[str, ...]]:
    """``poly`` as a monomial's ``(coef, syms)``: itself where it has one term, else ``(1, (text,))`` with the
    terms written in a fixed order (most atoms first, then by atom)."""
    terms = sorted(((t, c) for t, c in poly.items() if c), key=lambda tc: (-len(tc[0]), tc[0]))
    if not terms:
        return 0, ()
    if len(terms) == 1:
        term, coef = terms[0]
        return coef, term
    text = term_text(*terms[0])
    for term, coef in terms[1:]:
        text += f" - {term_text(term, -coef)}" if coef < 0 else f" + {term_text(term, coef)}"
    return 1, (text,)


@functools.lru_cache(maxsize=4096)
def parse_poly(text: str) -> Poly | None:
    """A dim's text as a polynomial (``+ - *`` and integers over names; a floor quotient, ``/`` or a call is one
    atom written from its operands' normal forms); ``None`` where the text is no such expression."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None

    def walk(node: ast.AST) -> Poly | None:
        if isinstance(node, ast.Name):
            return {(node.id,): 1}
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return {(): node.value}
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = walk(node.operand)
            return None if inner is None else {t: -c for t, c in inner.items()}
        if isinstance(node, ast.BinOp):
            a, b = walk(node.left), walk(node.right)
            if a is None or b is None:
                return None
            if isinstance(node.op, ast.Mult):
                return poly_mul(a, b)
            if isinstance(node.op, ast.Add | ast.Sub):
                sign = 1 if isinstance(node.op, ast.Add) else -1
                out = dict(a)
                for t, c in b.items():
                    out[t] = out.get(t, 0) + sign * c
                return out
            if isinstance(node.op, ast.Pow):
                return _power(a, b)
            if isinstance(node.op, ast.FloorDiv):
                return _floor_quotient(a, b)
            op = {ast.Div: "/", ast.Mod: "%"}.get(type(node.op))
            if op is None:
                return None
            atom = f"({_atom_text(a)}){op}({_atom_text(b)})"
            return {(atom,): 1}
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
            args = [walk(arg) for arg in node.args]
            if any(arg is None for arg in args):
                return None
            return {(f"{node.func.id}(" + ", ".join(_atom_text(arg) for arg in args) + ")",): 1}  # type: ignore[arg-type]
        return None

    return walk(tree)


def _power(base: Poly, exponent: Poly) -> Poly | None:
    """``base ** n`` for a small non-negative integer n (torch writes a squared length so)."""
    n = exponent.get((), 0) if set(exponent) <= {()} else None
    if n is None or not 0 <= n <= 8:
        return None
    out: Poly = {(): 1}
    for _ in range(n):
        out = poly_mul(out, base)
    return out


def _floor_quotient(a: Poly, b: Poly) -> Poly:
    """``a // b`` in a normal form, so two spellings of one length compare equal: an exact quotient is the
    quotient (``(4·B·L²) // (4·L·L)`` is B: a Reshape's -1 over a folded batch); by a positive integer d, the
    whole multiples of d in the constant term move out, ``(x + q·d + r) // d = (x + r) // d + q`` with
    0 ≤ r < d, and terms all divisible by d divide exactly — ``(x − 1)//2 + 1`` and ``(x + 1)//2`` (a strided
    convolution's output length, written two ways) are one dim."""
    a = {t: c for t, c in a.items() if c}
    b = {t: c for t, c in b.items() if c}
    if b and set(b) != {()}:
        exact = poly_div(a, b)
        if exact is not None:
            return exact
    d = b.get((), 0) if set(b) <= {()} else 0
    if d <= 0:
        return {(f"({_atom_text(a)})//({_atom_text(b)})",): 1}
    constant = a.get((), 0)
    whole, rest = divmod(constant, d)
    terms = {t: c for t, c in a.items() if t != ()}
    if all(c % d == 0 for c in terms.values()):
        out = {t: c // d for t, c in terms.items()}  # (d·x + rest) // d = x, as 0 ≤ rest < d
    else:
        inner = dict(terms)
        if rest:
            inner[()] = rest
        out = {(f"({_atom_text(inner)})//({d})",): 1}
    if whole:
        out[()] = out.get((), 0) + whole
    return out


def _atom_text(poly: Poly) -> str:
    coef, syms = normal_form(poly)
    return term_text(syms, coef)
