"""Loading only the rules that can fire: a rule whose query needs a constructor no term has, and no rule can
build, is left out; one another rule's result enables is kept; and on real exports the pruned ruleset fuses
exactly as the whole one — the same e-graph, the same rule applications, byte for byte the same model."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

import egfuse
from egfuse.egraph import rule_reach
from egfuse.validation.validate import make_feeds

from ..conftest import assert_same_outputs

DATA = Path(__file__).resolve().parent.parent / "data"
CONSTRUCTORS = frozenset({"mul", "add", "tanh", "gelu", "cube", "attend"})
RULES = (
    "(ruleset r)",
    "(rewrite (mul _x _x) (cube _x) :ruleset r)",  # needs mul: present
    "(rewrite (tanh (cube _x)) (gelu _x) :ruleset r)",  # needs tanh: absent, and no rule builds it
    '(rule ((cube _x)) ((union (cube _x) (attend _x _x))) :ruleset r :name "3")',  # cube: built by the first
    "(birewrite (add _a (attend _a _b)) (mul _b _a) :ruleset r)",  # either side: mul is present
)


def test_a_rule_whose_query_can_never_match_is_left_out():
    kept = rule_reach.firing(RULES, CONSTRUCTORS, {"mul"})
    assert RULES[2] not in kept
    assert RULES[0] in kept and RULES[3] in kept, "a rule enabled by another rule's result is kept"
    assert RULES[4] in kept, "a birewrite fires from either side"
    assert kept[0] == "(ruleset r)", "declarations are kept, in order"


def test_with_every_constructor_present_every_rule_is_kept():
    assert rule_reach.firing(RULES, CONSTRUCTORS, set(CONSTRUCTORS)) == list(RULES)


def test_the_reach_kept_with_the_rules_is_what_their_text_says():
    """The program cache keeps each rule's needs and builds beside its text (read off it once); the rules kept
    from that data are the rules kept from the text."""
    reach = rule_reach.analysed(RULES, CONSTRUCTORS)
    assert reach[0] is None and reach[3] == (("cube",), ("attend", "cube"))
    for present in ({"mul"}, {"tanh"}, {"add", "attend"}, set()):
        assert rule_reach.firing(RULES, CONSTRUCTORS, present, reach) == rule_reach.firing(RULES, CONSTRUCTORS, present)


def test_the_cached_program_carries_the_reach_of_its_rules():
    from egfuse.rules import ruleset_for

    from egfuse.egraph import egg_program

    base, rules = egg_program.program(ruleset_for(("ort",)))
    constructors = egg_program.constructor_names(base.names)
    assert rules.reach == rule_reach.analysed(rules.commands, constructors)
    assert sum(r is not None for r in rules.reach) > 500


def test_constructors_are_read_from_calls_not_from_variables_or_strings():
    found = rule_reach.constructors_in(['(let t (mul (add x "tanh") cube))'], CONSTRUCTORS)
    assert found == {"mul", "add"}


@pytest.mark.parametrize("name", ["gpt2_sdpa.dynamo", "llama_sdpa.torchscript", "whisper_encoder_sdpa.dynamo"])
def test_the_pruned_rules_fuse_exactly_as_all_of_them(name, monkeypatch):
    path = DATA / f"{name}.onnx"
    egfuse.fuse(str(path), target="ort")  # a fresh cache loads the rules through egglog-python once, all of them
    pruned = egfuse.fuse(str(path), target="ort")
    monkeypatch.setattr(rule_reach, "firing", lambda commands, constructors, present, reach=None: list(commands))
    whole = egfuse.fuse(str(path), target="ort")
    assert pruned.report.stats["rules_loaded"] < whole.report.stats["rules_loaded"]
    for key in ("enodes_before", "enodes_after", "iterations", "stop_reason", "distinct_regions"):
        assert pruned.report.stats[key] == whole.report.stats[key], key
    assert pruned.report.rules == whole.report.rules
    assert pruned.model.SerializeToString() == whole.model.SerializeToString()
    original = onnx.load(str(path))
    assert pruned.report.validated
    assert_same_outputs(original, pruned.model, make_feeds(original))
