"""The language and the rules as egglog's own program text, made once and kept on disk.

Why: egglog-python builds a ruleset's commands in Python — every rule's body run, its declarations gathered
through runtime protocol checks (``typing._get_protocol_attrs``), each term converted — before egglog compiles
them: 0.43 s of every process's first search whatever the model's size (of a 2-layer BERT's 0.75 s). egglog
prints every command it runs, and replaying that text costs only egglog's own parsing and compiling (0.12 s for
the ~540 rules). So the first e-graph is loaded through egglog-python, as before (and used as it is: a process
that finds no text pays what it always paid, not that and a replay), its commands' text kept; every later one
replays that text: in this process from memory, in the next from a file in the user's cache folder
(``$EGFUSE_CACHE_DIR``, else ``$XDG_CACHE_HOME/egfuse``, else ``~/.cache/egfuse``; ``EGFUSE_CACHE_DIR=""``: no
file, the text is made once a process). The file's name holds a hash of egglog's version and of every source of
egfuse and its rules, and the rule families: any edit to a rule, the language or egglog makes a new file, never
a stale program. What the Python side needs besides the
commands comes with them: the egglog names of the language's functions, the Tensor sort, the command that runs
the ruleset once, what an e-graph's size counts, and the stable name (``masks.12``) of each rule by the name
egglog gives it when replayed.

The rules are the same rules: the text is egglog's own printing of the commands egglog-python made, and it must
read back as the same commands (printed again, the same text) before it is used or kept.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import egglog
from egglog import bindings
from egglog.declarations import Declarations

from egfuse.egraph import egg_cache, lang, rule_reach, term_facts
from egfuse.egraph.egg_cache import Base, Rules
from egfuse.egraph.perms import perm_table, swap_table

_BATCH_CHARS = 1000
REF = "egfuse_ref"
"""The constructor of a graph value's own e-class (by id): declared in egglog text, not through egglog-python."""
_FACTS = ("scalar_of", "rank_of", "dtype_of", "dim_of", "perm_then", "swap_last2", "is_weight", "finite",
          "head_invariant", "heads_of", "last_dim", "halves_repeat", "per_feature")  # fmt: skip
_RULE_NAME = re.compile(r':name "((?:[^"\\]|\\.)*)"\)?$')
_NOT_DECLARATIONS = ("(print-size", "(push", "(pop", "(run-schedule", "(run ", "(check")
"""Commands a recording also holds that declare nothing (sizes read, runs): not part of a program."""


_FLAT_DECLS: dict[int, tuple[object, Declarations]] = {}


def flat_declarations(*objects: object) -> Declarations:
    """The declarations of typed objects (a ruleset, the language's constructors) merged once, by identity.
    egglog-python gathers them anew on every ``_add_decls`` — through runtime protocol checks, tens of
    thousands of calls, about half a second an e-graph — though they never change."""
    key = hash(tuple(id(o) for o in objects))
    if key not in _FLAT_DECLS:
        _FLAT_DECLS[key] = (objects, Declarations.create(*objects))  # the objects kept: their ids stay theirs
    return _FLAT_DECLS[key][1]


def egg_names(egraph: egglog.EGraph, fns: dict[str, object]) -> dict[str, str]:
    """The egglog-level names of typed constructors/functions, registering them with ``egraph``."""
    egraph._add_decls(flat_declarations(*fns.values()))  # once: each call re-merges every declaration
    return {name: egraph._state.callable_ref_to_egg(fn.__egg_ref__)[0] for name, fn in fns.items()}


def split_commands(text: str) -> list[str]:
    """egglog program text → its top-level commands (balanced parentheses; strings and comments skipped)."""
    commands: list[str] = []
    depth, start, i, n = 0, 0, 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c == ";" and depth == 0:
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif c == "(":
            if depth == 0:
                start = i
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                commands.append(text[start : i + 1])
        i += 1
    if depth:
        raise ValueError("unbalanced egglog program text")
    return commands


def run_commands(raw: bindings.EGraph, commands: tuple[str, ...] | list[str]) -> None:
    """Parse and run commands in batches of about :data:`_BATCH_CHARS` characters: egglog's parser is quadratic
    in one program's length (the rules one by one take 0.11 s, 64 at a time 0.6 s)."""
    batch: list[str] = []
    size = 0
    for command in commands:
        if batch and size + len(command) > _BATCH_CHARS:
            raw.run_program(*raw.parse_program("\n".join(batch)))
            batch, size = [], 0
        batch.append(command)
        size += len(command)
    if batch:
        raw.run_program(*raw.parse_program("\n".join(batch)))


# --- making a program through egglog-python ----------------------------------------------------------------
def _typed_functions() -> dict[str, object]:
    functions = dict(constructors())
    functions.update({fact: getattr(term_facts, fact) for fact in _FACTS})
    return functions


def _declarations(texts: list[str]) -> list[str]:
    return [c for c in texts if not c.startswith(_NOT_DECLARATIONS)]


class _Recorder:
    """Stands in for egglog's e-graph while egglog-python loads it: every command run is kept as egglog prints
    it (what ``EGraph(record=True).commands()`` would hold, without recording all the e-graph's later terms)."""

    def __init__(self, real: bindings.EGraph) -> None:
        self.real, self.texts = real, []

    def run_program(self, *commands, **kwargs):
        self.texts.extend(str(c) for c in commands)
        return self.real.run_program(*commands, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.real, name)


@dataclass
class Made:
    """An e-graph loaded through egglog-python with the language (and a ruleset) and nothing else — as egfuse
    always loaded one — and the program text of what was loaded."""

    egraph: egglog.EGraph
    base: Base
    rules: Rules | None
    rule_names: dict[str, str]
    """This e-graph's rule names (egglog-python's: "38", "38=>") → stable names."""
    faithful: bool
    """The text reads back as the same commands (parsed and printed again): only then is it replayed."""


def make(ruleset: egglog.Ruleset | None = None) -> Made:
    """Load an e-graph through egglog-python, keeping the text of its commands; a faithful text is remembered
    (and written to the cache file) for every later e-graph to replay."""
    egraph = egglog.EGraph()
    raw = egraph._egraph
    recorder = _Recorder(raw)
    egraph._state.egraph = recorder  # type: ignore[assignment]
    try:
        names = egg_names(egraph, _typed_functions())
        egraph._add_decls(flat_declarations(lang.Tensor))
        sort = egraph._state.type_ref_to_egg(lang.Tensor.__egg_tp__.to_just())
        raw.run_program(*raw.parse_program(f"(constructor {REF} (i64) {sort})"))
        names["ref"] = REF
        table = [f'(set ({names["perm_then"]} "{a}" "{b}") "{c}")' for a, b, c in perm_table()]
        table += [f'(set ({names["swap_last2"]} "{a}") "{b}")' for a, b in swap_table()]
        run_commands(raw, table)
        base_size = len(recorder.texts)
        base_sized = _sized(egraph)
        run = None
        if ruleset is not None:
            egraph._add_decls(flat_declarations(ruleset))
            run = egraph._state.run_schedule_to_egg(egglog.run(ruleset).schedule)  # registers the rules
    finally:
        egraph._state.egraph = raw
    language, rest = _declarations(recorder.texts[:base_size]), _declarations(recorder.texts[base_size:])
    base = Base((*language, f"(constructor {REF} (i64) {sort})", *table), names, sort, base_sized)
    rules, own_names = None, {}
    if ruleset is not None:
        from egfuse.rules import rule_names  # the rules import the language, as this module does: no cycle

        decls = egraph._state.rule_name_to_command_decl
        stable = rule_names()
        commands = tuple(rest)
        replayed = _replayed_names(commands, list(decls))
        named = {text: stable[decls[egg]] for text, egg in replayed.items() if decls[egg] in stable}
        reach = rule_reach.analysed(commands, constructor_names(names))
        rules = Rules(commands, str(run), named, _sized(egraph), reach)
        own_names = {egg: stable[decl] for egg, decl in decls.items() if decl in stable}
    made = Made(egraph, base, rules, own_names, _reads_back(base, rules))
    if made.faithful:
        _remember(ruleset, base, rules)
    return made


def _replayed_names(commands: tuple[str, ...], made: list[str]) -> dict[str, str]:
    """egglog's name of each rule once its text is replayed → the name egglog-python gave it (in order: one a
    rewrite or rule, two a birewrite, ``N=>`` and ``N<=``). egglog-python names rewrites by a counter, which
    egglog's printing of a rewrite leaves out: read back, a rewrite is named by its own text with its double
    quotes made single (a birewrite by that and ``=>``/``<=``); a rule keeps its ``:name``."""
    replayed: list[str] = []
    for command in commands:
        kind = command[1 : command.find(" ")]
        if kind == "rewrite":
            replayed.append(command.replace('"', "'"))
        elif kind == "birewrite":
            replayed += [command.replace('"', "'") + "=>", command.replace('"', "'") + "<="]
        elif kind == "rule":
            name = _RULE_NAME.search(command)
            replayed.append(name.group(1) if name else command)
    if len(replayed) != len(made):
        raise RuntimeError(f"{len(replayed)} rules in egglog's text, {len(made)} made")
    for text, egg in zip(replayed, made, strict=True):
        if not text.startswith("(") and text != egg:
            raise RuntimeError(f"rule {egg!r} read back as {text!r}")
    return dict(zip(replayed, made, strict=True))


def _sized(egraph: egglog.EGraph) -> frozenset[str]:
    """What ``egraph.all_function_sizes()`` counts: the egglog functions egglog-python declared."""
    return frozenset(name for name, refs in egraph._state.egg_fn_to_callable_refs.items() if refs)


def _reads_back(base: Base, rules: Rules | None) -> bool:
    """Every command parses back to itself (printed again, the same text): what is replayed is what
    egglog-python made. (Parsing alone: egglog types a command when it runs it, and a replay that did not
    type-check would fail loudly, not differ.)"""
    parser = bindings.EGraph()
    try:
        for text in [*base.commands, *(rules.commands if rules else ()), *((rules.run,) if rules else ())]:
            (command,) = parser.parse_program(text)
            if str(command) != text:
                return False
    except Exception:  # egglog's printing did not read back: this program is not replayed
        return False
    return True


# --- the cache ------------------------------------------------------------------------------------------------
_MEMORY: dict[object, tuple[Base, Rules | None]] = {}
_KEEP: list[object] = []  # rulesets keyed by identity stay alive, so their ids stay theirs


def _key(ruleset: egglog.Ruleset | None) -> tuple[object, tuple[str, ...] | None, bool]:
    """The memory key, the families (None: the base, or a ruleset of no known families) and whether a file
    may hold it."""
    from egfuse.rules import families_of

    if ruleset is None:
        return ("families", None), None, True
    families = families_of(ruleset)
    if families is None:
        return ("id", id(ruleset)), None, False
    return ("families", families), families, True


def known(ruleset: egglog.Ruleset | None = None) -> tuple[Base, Rules | None] | None:
    """The base and ``ruleset``'s commands as replayable text, from memory or the cache file; None where they
    were never made (here, or by any process since the sources last changed). A ruleset
    :func:`egfuse.rules.ruleset_for` made is kept on disk by its families; any other (a test's own
    combination) in memory only."""
    key, families, on_disk = _key(ruleset)
    found = _MEMORY.get(key)
    if found is None and on_disk:
        path = egg_cache.path_for(families, ruleset is None)
        found = egg_cache.read(path, ruleset is not None) if path is not None else None
        if found is not None:
            _MEMORY[key] = found
    return found


def program(ruleset: egglog.Ruleset | None = None) -> tuple[Base, Rules | None]:
    """The base and ``ruleset``'s commands as text: :func:`known`, or :func:`make` (the e-graph it loaded
    dropped)."""
    found = known(ruleset)
    if found is None:
        made = make(ruleset)
        if not made.faithful:  # never seen (egglog 13.2 prints what it reads)
            raise RuntimeError("egglog's printing of the rules does not read back as the same commands")
        found = made.base, made.rules
    return found


def _remember(ruleset: egglog.Ruleset | None, base: Base, rules: Rules | None) -> None:
    key, families, on_disk = _key(ruleset)
    if key[0] == "id":
        _KEEP.append(ruleset)
    _MEMORY[key] = (base, rules)
    if ruleset is not None:
        _MEMORY.setdefault(("families", None), (base, None))
    path = egg_cache.path_for(families, ruleset is None) if on_disk else None
    if path is not None:
        egg_cache.write(path, base, rules)


def constructor_names(names: dict[str, str]) -> frozenset[str]:
    """The egglog names of the language's constructors, ``names`` a base's (Python name → egglog name): what
    :mod:`~egfuse.egraph.rule_reach` reads terms and rules by."""
    return frozenset(names[n] for n in constructors() if n in names) | {REF}


@functools.cache
def constructors() -> dict[str, object]:
    """The language's constructors by name: :class:`~egfuse.egraph.lang.Tensor`'s in declaration order, then those
    rule families declare for their own region kinds (:data:`egfuse.rules.CONSTRUCTORS`)."""
    from egfuse.rules import CONSTRUCTORS  # the rules import the language, as this module does: no cycle

    decls = lang.Tensor.__egg_decls__
    (cls,) = (c for ident, c in decls._classes.items() if str(ident).endswith(".Tensor"))
    return {**{name: getattr(lang.Tensor, name) for name in cls.class_methods}, **CONSTRUCTORS}
