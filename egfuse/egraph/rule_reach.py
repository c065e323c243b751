"""Which rules can ever fire on a set of terms: the rules an e-graph needs loaded, read off their egglog text.

Why: loading the rules costs egglog about 0.2 ms a rule (0.12 s for ~550, a third of a small model's whole
run, paid by every process), and every iteration matches every loaded rule. A rule matches only where every
constructor its query names (its left side and conditions) has an e-node, and e-nodes come only from the
lowered terms or from rule actions. So, from the constructors the lowering wrote, the constructors any rule
could build are found to a fixpoint, and a rule whose query needs one that can never exist is left out: the
saturated e-graph is the same, rule for rule (an over-approximation: a rule kept may still never match).
Facts (``scalar_of``, ``rank_of`` …) and relations are not constructors and never decide.

Reading what each rule needs off its text costs 25 ms for ~590 rules, paid by every process's first search; the
result depends only on the text, so it is kept beside the text in the program cache
(:attr:`egfuse.egraph.egg_cache.Rules.reach`, made by :func:`analysed`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_CALL = re.compile(r"\(([^\s()\"]+)")
_RULE_HEAD = re.compile(r"\((rewrite|birewrite|rule)\s")


@dataclass(frozen=True)
class _Rule:
    command: str
    needs: frozenset[str]
    """Constructors every match needs (both directions' for a birewrite: either may fire)."""
    builds: frozenset[str]


def is_rule(command: str) -> bool:
    """A rewrite, birewrite or rule (not a ruleset's declaration, nor any other)."""
    return _RULE_HEAD.match(command) is not None


def constructors_in(commands: Iterable[str], constructors: frozenset[str]) -> set[str]:
    """The constructors (egglog names) ``commands`` call."""
    found: set[str] = set()
    for command in commands:
        found.update(name for name in _CALL.findall(command) if name in constructors)
    return found


Reach = tuple[tuple[tuple[str, ...], tuple[str, ...]] | None, ...]
"""Per command, in order: None for a declaration, else a rule's (needs, builds) — what :func:`analysed` reads."""


def analysed(commands: tuple[str, ...], constructors: frozenset[str]) -> Reach:
    """Each command's (needs, builds), sorted (None: not a rule): what :func:`firing` decides by, as data the
    program cache keeps."""
    found = _analysed(commands, constructors)
    return tuple(
        (tuple(sorted(found[c].needs)), tuple(sorted(found[c].builds))) if c in found else None for c in commands
    )


def firing(
    commands: tuple[str, ...], constructors: frozenset[str], present: set[str], reach: Reach | None = None
) -> list[str]:
    """``commands`` without the rules that can never fire on terms made of ``present`` (and of what rules
    build from them); every other command (declarations, rulesets) kept, in order. ``reach``: the commands'
    :func:`analysed` (read off their text where None)."""
    if reach is None:
        rules = _analysed(commands, constructors)
    else:
        rules = {c: _Rule(c, frozenset(r[0]), frozenset(r[1])) for c, r in zip(commands, reach, strict=True) if r}
    reachable = set(present)
    changed = True
    while changed:
        changed = False
        for rule in rules.values():
            if rule.needs <= reachable and not rule.builds <= reachable:
                reachable |= rule.builds
                changed = True
    return [c for c in commands if c not in rules or rules[c].needs <= reachable]


_ANALYSED: dict[tuple[int, frozenset[str]], tuple[tuple[str, ...], dict[str, _Rule]]] = {}


def _analysed(commands: tuple[str, ...], constructors: frozenset[str]) -> dict[str, _Rule]:
    key = (id(commands), constructors)
    found = _ANALYSED.get(key)
    if found is None or found[0] is not commands:
        found = _ANALYSED[key] = (commands, {c: _rule(c, constructors) for c in commands if is_rule(c)})
    return found[1]


def _rule(command: str, constructors: frozenset[str]) -> _Rule:
    parts = _parse(command)
    head = parts[0]
    if head == "rule":
        query, actions = parts[1], parts[2]
        return _Rule(command, _called(query, constructors), _called(actions, constructors))
    lhs, rhs = parts[1], parts[2]
    conditions = parts[parts.index(":when") + 1] if ":when" in parts else []
    left, right = _called(lhs, constructors), _called(rhs, constructors)
    when = _called(conditions, constructors)
    if head == "birewrite":  # fires where either side's constructors exist
        return _Rule(command, (left & right) | when, left | right)
    return _Rule(command, left | when, right)


def _called(expr: object, constructors: frozenset[str]) -> frozenset[str]:
    found: set[str] = set()
    stack = [expr]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            if item and isinstance(item[0], str) and item[0] in constructors:
                found.add(item[0])
            stack.extend(item)
    return frozenset(found)


_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|[()]|[^\s()"]+')


def _parse(text: str) -> list:
    """An egglog command as nested lists of atoms (strings kept whole, with their quotes)."""
    stack: list[list] = [[]]
    for token in _TOKEN.findall(text):
        if token == "(":
            stack.append([])
        elif token == ")":
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append(token)
    return stack[0][0]
