"""docs/architecture.md against the code: its invariants are the ones the code cites, and its links resolve.

The page promises that ``grep -rn "invariant N" watchcache`` finds every line relying on invariant N.
So every invariant on the page must be cited at least once in the product, and every citation
("invariant 3", "invariants 7 and 11", "Invariant 14.") must name an invariant the page states;
a renumbering or a dropped invariant fails here instead of leaving comments pointing nowhere.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
CITATION = re.compile(r"\binvariants? (\d+(?:(?:, | and | or )\d+)*)", re.IGNORECASE)


def page_invariants(text: str) -> list[int]:
    """The numbers of the ``## Invariants`` section's list items (``N. **Title.** ...``)."""
    section = text.split("\n## Invariants\n", 1)[1].split("\n## ", 1)[0]
    return [int(n) for n in re.findall(r"^(\d+)\. \*\*", section, re.MULTILINE)]


def citations(root: Path) -> dict[int, list[str]]:
    """Invariant number -> the places (file:line) in the product that cite it."""
    found: dict[int, list[str]] = defaultdict(list)
    for path in sorted((root / "watchcache").rglob("*")):
        if path.suffix not in (".py", ".proto") or path.name.endswith("_pb2.py"):
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            for m in CITATION.finditer(line):
                for n in re.findall(r"\d+", m.group(1)):
                    found[int(n)].append(f"{path.relative_to(root)}:{lineno}")
    return found


def test_the_page_numbers_its_invariants_one_by_one() -> None:
    numbers = page_invariants(PAGE.read_text())
    assert numbers == list(range(1, len(numbers) + 1)), numbers
    assert len(numbers) >= 10, "the Invariants section was not found or lost its items"


def test_every_invariant_is_cited_and_every_citation_names_one() -> None:
    stated = set(page_invariants(PAGE.read_text()))
    cited = citations(ROOT)
    uncited = sorted(stated - set(cited))
    assert not uncited, f"invariants on docs/architecture.md cited nowhere in watchcache/: {uncited}"
    unknown = {n: places for n, places in cited.items() if n not in stated}
    assert not unknown, f"citations of invariants the page does not state: {unknown}"


def test_the_citation_pattern_reads_lists_of_numbers() -> None:
    line = "kept here (invariants 7 and 11); see invariant 3, and Invariants 1, 2 or 4."
    numbers = [int(n) for m in CITATION.finditer(line) for n in re.findall(r"\d+", m.group(1))]
    assert numbers == [7, 11, 3, 1, 2, 4]


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in path.read_text().splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    """A moved section leaves no dangling link: each relative link's file exists, and its #anchor is a heading."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path) if path else page
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in _anchors(dest)):
            broken.append(target)
    assert not broken, broken
