"""The paper as a PDF: ``paper/egfuse.md`` (whose numbers ``experiments/render_results.py`` fills in from
``experiments/results/``) typeset with its figures into ``paper/egfuse.pdf``.

    pip install -e '.[paper]'
    python paper/build_pdf.py            # writes paper/egfuse.pdf
    python paper/build_pdf.py --pages /tmp/pages   # also each page as a PNG, to look at one by one

The PDF's metadata records the SHA-256 of the markdown it was built from, so ``tests/test_paper.py`` can tell a
PDF that no longer matches the paper (rebuild it after rendering the results)."""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

PAPER = Path(__file__).resolve().parent
SOURCE = PAPER / "egfuse.md"
OUTPUT = PAPER / "egfuse.pdf"
SOURCE_MARK = "source-sha256:"

CSS = """
body { font-family: serif; font-size: 10pt; line-height: 1.35; }
h1 { font-size: 18pt; text-align: center; } h2 { font-size: 14pt; margin-top: 14pt; } h3 { font-size: 11.5pt; }
table { border-collapse: collapse; font-size: 7.5pt; margin: 6pt 0; }
th, td { border: 0.5pt solid #888; padding: 1.5pt 3pt; }
th { background: #eee; }
code { font-family: monospace; font-size: 8.5pt; }
pre { font-size: 7.5pt; background: #f6f6f6; padding: 4pt; }
img { width: 100%; }
"""


def source_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def build(source: Path = SOURCE, output: Path = OUTPUT) -> int:
    """Typeset ``source`` into ``output`` (through a temporary file: never half a PDF); its page count."""
    from markdown_pdf import MarkdownPdf, Section

    text = source.read_text()
    pdf = MarkdownPdf(toc_level=2, mode="gfm-like")
    pdf.meta["title"] = "egfuse: attention fusion by equality saturation that survives exporter releases"
    pdf.meta["author"] = "the egfuse developers"
    pdf.meta["subject"] = SOURCE_MARK + source_digest(text)
    pdf.add_section(Section(text, root=str(source.parent), toc=True), user_css=CSS)
    temporary = output.with_name(output.name + ".tmp")
    pdf.save(str(temporary))
    temporary.replace(output)
    import pymupdf

    with pymupdf.open(output) as document:
        return document.page_count


def pages(pdf: Path, folder: Path, dpi: int = 80) -> list[Path]:
    """Each page of ``pdf`` as a PNG in ``folder``."""
    import pymupdf

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    with pymupdf.open(pdf) as document:
        for number, page in enumerate(document, 1):
            path = folder / f"page-{number:02d}.png"
            page.get_pixmap(dpi=dpi).save(path)
            written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=Path, help="also write each page as a PNG into this folder")
    args = parser.parse_args()
    count = build()
    print(f"wrote {OUTPUT.relative_to(PAPER.parent)} ({count} pages)")
    if args.pages:
        print(f"pages: {len(pages(OUTPUT, args.pages))} PNGs in {args.pages}")


if __name__ == "__main__":
    main()
