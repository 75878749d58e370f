"""BENCHMARKS.md and the benchmarks' front door agree: every script of tests/benchmarks/ has
its line in `python -m tests.benchmarks`, and every row a line names is a row of BENCHMARKS.md's
"Today's figures" (by its first cell)."""
import re
from pathlib import Path

from tests.benchmarks.__main__ import GROUPS, listed, listing, scripts

ROOT = Path(__file__).parents[1]


def _rows() -> set[str]:
    text = (ROOT / "BENCHMARKS.md").read_text()
    table = text.split("## Today's figures", 1)[1].split("\n## ", 1)[0]
    return {match.group(1).strip() for match in re.finditer(r"^\| ([^|]+) \|", table, re.M)} - {"question"}


def test_every_benchmark_script_is_listed_once():
    names = [name for _, entries in GROUPS for name, _, _ in entries]
    assert len(names) == len(set(names))
    assert set(names) == scripts()
    assert "Not yet listed" not in listing()


def test_every_row_a_benchmark_feeds_is_in_todays_figures():
    rows = _rows()
    assert "accepted/h, ops6k recipe, H200, session 26" in rows
    for name, (_, fed) in listed().items():
        if fed == "history" or fed.startswith("("):
            continue
        for row in fed.split("; "):
            assert row in rows, (name, row)


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors for a Markdown file's headings (outside code blocks)."""
    found, seen, fenced = set(), {}, False
    for line in path.read_text().splitlines():
        fenced ^= line.startswith("```")
        heading = None if fenced else re.match(r"#{1,6} (.*)", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return found


def test_the_benchmark_pages_links_land():
    for page in (ROOT / "BENCHMARKS.md", ROOT / "docs" / "benchmarks-history.md"):
        text = page.read_text()
        targets = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r"^\[[\w-]+\]: (\S+)$", text, re.M)
        assert targets, page
        for target in targets:
            if "://" in target:
                continue
            file, _, fragment = target.partition("#")
            linked = (page.parent / file).resolve() if file else page
            assert linked.exists(), (page.name, target)
            if fragment:
                assert fragment in _anchors(linked), (page.name, target)
