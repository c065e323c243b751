"""The paper and the README quote experiments/results/ only through experiments/render_results.py: a number
typed by hand, or a results file re-measured without re-rendering, fails here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("render_results", ROOT / "experiments" / "render_results.py")
render_results = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render_results)

DOCUMENTS = ("README.md", "paper/egfuse.md")


@pytest.mark.parametrize("document", DOCUMENTS)
def test_generated_text_matches_the_results_files(document: str):
    text = (ROOT / document).read_text()
    found = 0
    for start, end, body in render_results.sections():
        if start not in text:
            continue
        found += 1
        committed = text.split(start, 1)[1].split(end, 1)[0]
        assert committed == f"\n{body}", f"{document}: the text between {start} and {end} is not what " + (
            "experiments/results/ says: run python experiments/render_results.py"
        )
    assert found, f"{document} quotes no results"


def test_the_papers_figures_are_the_results_plots():
    for name in render_results.FIGURES:
        source, figure = ROOT / "experiments" / "results" / name, ROOT / "paper" / "figures" / name
        assert source.exists() and figure.exists(), name
        assert figure.read_bytes() == source.read_bytes(), f"paper/figures/{name} is stale: re-render"


def test_every_figure_the_paper_shows_exists():
    text = (ROOT / "paper" / "egfuse.md").read_text()
    shown = [part.split(")", 1)[0] for part in text.split("](figures/")[1:]]
    assert shown
    for name in shown:
        assert (ROOT / "paper" / "figures" / name).exists(), name
