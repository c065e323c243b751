"""The paper and the README quote experiments/results/ only through experiments/render_results.py: a number
typed by hand, or a results file re-measured without re-rendering, fails here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("render_results", ROOT / "experiments" / "render_results.py")
render_results = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render_results)


@pytest.mark.parametrize("document", render_results.DOCUMENTS)
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


def test_the_pdf_holds_every_section_and_figure(tmp_path: Path):
    """``paper/build_pdf.py`` typesets the whole paper: every section heading is in the PDF's text, and it holds
    an image for every figure the paper shows (a broken image path, or a section the converter dropped, fails)."""
    pymupdf = pytest.importorskip("pymupdf", reason="the PDF build needs the dev extra (markdown-pdf)")
    spec = importlib.util.spec_from_file_location("build_pdf", ROOT / "paper" / "build_pdf.py")
    build_pdf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_pdf)
    output = tmp_path / "egfuse.pdf"
    pages = build_pdf.build(output=output)
    text = (ROOT / "paper" / "egfuse.md").read_text()
    headings = [line.lstrip("#").strip() for line in text.splitlines() if line.startswith("## ")]
    figures = text.count("](figures/")
    with pymupdf.open(output) as document:
        assert document.metadata["subject"] == build_pdf.SOURCE_MARK + build_pdf.source_digest(text)
        typeset = " ".join(" ".join(page.get_text().split()) for page in document)
        images = sum(len(page.get_images()) for page in document)
    assert pages >= 4
    assert headings and all(h in typeset for h in headings), [h for h in headings if h not in typeset]
    assert images >= figures > 0
