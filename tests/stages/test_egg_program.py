"""The rules replayed from egglog's text are the rules egglog-python makes: the text reads back as it was, a
saturation through it matches the same rules as many times under the same names as one through egglog-python,
and the cache file is keyed, rewritten when unreadable and never needed."""

from __future__ import annotations

import os
import time

import egglog
import onnx_ir as ir
import pytest
from egfuse.rules import FAMILIES, NAMED, rule_names, ruleset_for

from egfuse.analysis.facts import GraphFacts
from egfuse.egraph import egg_cache, egg_program
from egfuse.egraph.egg_program import egg_names, flat_declarations
from egfuse.egraph.lang import Tensor
from egfuse.egraph.perms import perm_table, swap_table
from egfuse.egraph.session import Session
from egfuse.kinds.regions import find_regions
from egfuse.lowering.lower import Lowerer
from egfuse.preparation.shape_inference import infer_shapes
from egfuse.testing import Variant, attention_model


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache folder of the test's own, and nothing remembered in this process."""
    monkeypatch.setenv("EGFUSE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(egg_program, "_MEMORY", {})
    return tmp_path


@pytest.mark.parametrize("families", [(), tuple(FAMILIES)])
def test_the_text_reads_back_as_made_and_names_every_rule(cache, families):
    made = egg_program.make(ruleset_for(families))
    assert made.faithful and egg_program.known(ruleset_for(families)) == (made.base, made.rules)
    rules = made.rules
    assert set(made.rule_names.values()) == set(rules.rule_names.values())
    expected = {n for n in rule_names().values() if n.rsplit(".", 1)[0] not in FAMILIES or n.startswith(families)}
    assert set(rules.rule_names.values()) == expected


def _old_session(ruleset: egglog.Ruleset) -> tuple[egglog.EGraph, dict[str, str], object]:
    """An e-graph loaded as egfuse loaded one before its program was text: through egglog-python."""
    egraph = egglog.EGraph()
    raw = egraph._egraph
    names = egg_names(egraph, egg_program._typed_functions())
    egraph._add_decls(flat_declarations(Tensor))
    sort = egraph._state.type_ref_to_egg(Tensor.__egg_tp__.to_just())
    raw.run_program(*raw.parse_program(f"(constructor egfuse_ref (i64) {sort})"))
    names["ref"] = "egfuse_ref"
    egg_program.run_commands(
        raw,
        [f'(set ({names["perm_then"]} "{a}" "{b}") "{c}")' for a, b, c in perm_table()]
        + [f'(set ({names["swap_last2"]} "{a}") "{b}")' for a, b in swap_table()],
    )
    egraph._add_decls(flat_declarations(ruleset))
    command = egraph._state.run_schedule_to_egg(egglog.run(ruleset).schedule)
    return egraph, names, command


@pytest.mark.parametrize("replayed", [True, False], ids=["replayed", "made"])
@pytest.mark.parametrize(
    "variant",
    [Variant(heads=2, k_layout="transpose_0132", scale="q_mul", causal="trilu"), Variant(heads=2, scale="split_sqrt")],
)
def test_a_saturation_matches_as_through_egglog_python(cache, variant, replayed):
    """Iteration by iteration, the same rules match as often (by their stable names), and the e-graph ends
    the same size: the names egglog gives replayed rewrites (their text) are mapped as egglog-python's were —
    and so are those of the first session, which loads its rules through egglog-python itself."""
    ruleset = ruleset_for(tuple(FAMILIES))
    graph = ir.serde.deserialize_model(infer_shapes(attention_model(variant))).graph
    facts = GraphFacts(graph)
    (region,) = find_regions(graph, facts)

    if replayed:
        egg_program.program(ruleset)
    assert (egg_program.known(ruleset) is not None) == replayed
    session = Session()
    session.register(ruleset)
    assert (session._rule_names_of is egg_program.known(ruleset)[1].rule_names) == replayed
    lowerer = Lowerer(facts, session.names, 18)
    lowerer.lower(region)
    session.add(lowerer.table.commands)

    old, names, command = _old_session(ruleset)
    assert names == session.names
    egg_program.run_commands(old._egraph, lowerer.table.commands)
    stable, decls = rule_names(), old._state.rule_name_to_command_decl

    seen: set[str] = set()
    for _ in range(12):
        new = session.run(ruleset, max_iterations=1, max_enodes=10**6, max_seconds=60.0)
        (output,) = old._egraph.run_program(command)
        matched = {stable[decls[name]]: n for name, n in output.report.num_matches_per_rule.items() if n}
        assert new.rule_matches == matched
        assert session.size() == sum(n for _, n in old.all_function_sizes())
        seen |= set(matched)
        if not output.report.updated:
            break
    assert {"attention", "layout", "scale"} <= {name.split(".")[0] for name in seen}


def test_the_cache_file_is_written_read_and_rewritten_when_broken(cache):
    ruleset = ruleset_for(tuple(FAMILIES))
    made = egg_program.program(ruleset)
    files = sorted(cache.glob("egg-program-*.json"))
    assert len(files) == 1 and egg_cache.source_hash() in files[0].name
    egg_program._MEMORY.clear()
    assert egg_program.program(ruleset) == made  # read back from the file

    files[0].write_text("{not json")
    egg_program._MEMORY.clear()
    assert egg_program.program(ruleset) == made  # made again, and the file with it
    egg_program._MEMORY.clear()
    assert egg_cache.read(files[0], True) == made


def test_no_cache_file_where_the_folder_is_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv("EGFUSE_CACHE_DIR", "")
    monkeypatch.setattr(egg_program, "_MEMORY", {})
    assert egg_cache.cache_folder() is None
    base, rules = egg_program.program(ruleset_for(()))
    assert rules is not None and base.names["ref"] == egg_program.REF
    assert not list(tmp_path.iterdir())


def test_a_file_of_other_sources_is_not_read(cache):
    ruleset = ruleset_for(())
    egg_program.program(ruleset)
    (path,) = cache.glob("egg-program-*.json")
    text = path.read_text().replace(egg_cache.source_hash(), "0" * 32)
    path.write_text(text)
    assert egg_cache.read(path, True) is None


def test_a_ruleset_of_its_own_is_made_once_per_process(cache):
    """A combination ``ruleset_for`` did not make (a test's own) has no families to name a file by."""
    own = egglog.unstable_combine_rulesets(*(r for name, r in NAMED.items() if name != "scale"))
    first = egg_program.program(own)
    assert egg_program.known(own) == first and egg_program.program(own) == first
    assert not any("scale." in name for name in first[1].rule_names.values())
    assert not list(cache.glob("*rules*"))


def test_the_first_session_loads_through_egglog_python_and_the_next_replays(cache):
    """A process whose sources are new to the cache pays what egfuse always paid (the e-graph egglog-python
    loaded is the session's), never that and a replay; the next session replays the text."""
    ruleset = ruleset_for(())
    first = Session()
    first.register(ruleset)
    assert first._rule_names_of and all(name.isdigit() or name[:-2].isdigit() for name in first._rule_names_of)
    second = Session()
    second.register(ruleset)
    assert second._rule_names_of is egg_program.known(ruleset)[1].rule_names
    assert first.names == second.names and first.size() == second.size()


def test_files_of_other_sources_unread_for_a_month_are_pruned(cache):
    stale, recent = cache / "egg-program-old-base.json", cache / "egg-program-newer-base.json"
    for path in (stale, recent):
        path.write_text("{}")
    month = egg_cache._STALE_SECONDS + 60
    os.utime(stale, (time.time() - month, time.time() - month))
    egg_program.program(ruleset_for(()))
    assert not stale.exists() and recent.exists()
    assert [p.name for p in cache.glob(f"egg-program-{egg_cache.source_hash()}-*.json")] == [
        f"egg-program-{egg_cache.source_hash()}-rules-core.json"
    ]
