"""The repository's text stands on its own: no file refers to a path outside the repository, no
text narrates how its work was organised (issue numbers, working sessions), every reference to a
documentation page's section by its title names a section that page has, and the benchmark
page's figures come from recorded measurements that say when, where and how they were made.

Every text file git knows of (tracked, or new and not ignored) is read; binary files are skipped.
The patterns are written so that this module's own source does not match them.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Files larger than this are data, not text anyone reads for references.
MAX_TEXT_BYTES = 2_000_000

#: References to paths outside the repository: the design notes and the style guide kept beside
#: it, a relative path into a sibling ``shared`` folder, and absolute paths of the machines the
#: code was written on.
OUTSIDE_PATHS = {
    "a design or style file outside docs/": re.compile(r"\b(?:DESIGN|STYLE)\.md\b"),
    "a relative path to a sibling shared folder": re.compile(r"\.\./+shared\b"),
    "a shared/ folder beside the repository": re.compile(r"(?<![\w./-])shared/(?:[A-Z]\w*\.md)"),
    "an absolute path of a development machine": re.compile(r"(?<![\w.])/(?:wor[k]|tmp/w[t]-)\w*/"),
}

#: Narration of how the work was organised, where it does not belong: numbered issues and
#: items of a tracker, and working sessions by their ordinal or named from the present one.
ORDINALS = (r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh"
            r"|twelfth|thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth"
            r"|nineteenth|twentieth|(?:twenty|thirty)-(?:first|second|third|fourth|fifth|sixth"
            r"|seventh|eighth|ninth)|thirtieth)")
NARRATION = {
    "a numbered issue": re.compile(r"\b[Ii]ssues? \d+\b"),
    "an issue's items": re.compile(r"\b[Ii]ssue \d+'s\b"),
    "a working session by its ordinal": re.compile(r"\b" + ORDINALS + r" sessions?\b",
                                                   re.IGNORECASE),
    "a working session or round": re.compile(
        r"\b(?:(?:this|last|next|earlier|previous) session|(?:this|last) round)\b", re.IGNORECASE),
}

#: Issue numbers of other projects, which the narration patterns leave alone.
OTHER_PROJECTS_ISSUES = re.compile(
    r"\b(?:CPython|NumPy|numpy|SciPy|scipy|Dask|dask|distributed|xarray|Zarr|zarr|dolphin|JAX"
    r"|jax|jaxlib|GDAL|MintPy|ISCE2?|isce3|SNAP|cholespy|qdldl|pydantic|Numba|numba)(?:'s)?"
    r" issues? \d+")

#: A reference to a documentation page's section by title: ``docs/<page>.md, "Title"`` (with
#: optional backticks, comma or parenthesis between), as comments and docstrings write them.
SECTION_REFERENCE = re.compile(r"docs/([\w/-]+\.md)`{0,2}(?:,\s*|\s+)\(?\"([^\s\"][^\"\n]*)\"")

#: Headings of a Markdown page, outside fenced code.
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$")


def repository_files() -> list[Path]:
    """Every file git knows of in the repository: tracked, or untracked and not ignored."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        check=True, capture_output=True).stdout.decode()
    return sorted({ROOT / name for name in listed.split("\0") if name})


def text_files() -> dict[str, str]:
    """Text of every repository file that is UTF-8 text, by its path relative to the root."""
    texts = {}
    for path in repository_files():
        if not path.is_file() or path.stat().st_size > MAX_TEXT_BYTES:
            continue
        try:
            texts[path.relative_to(ROOT).as_posix()] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
    return texts


@pytest.fixture(scope="module")
def texts() -> dict[str, str]:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the files to read are git's list")
    found = text_files()
    assert "README.md" in found and "docs/design.md" in found, sorted(found)[:20]
    return found


def offences(texts: dict[str, str], patterns: dict[str, re.Pattern]) -> list[str]:
    """``file:line: what (match)`` for every match of ``patterns`` in ``texts``."""
    found = []
    for name, text in texts.items():
        # each pattern over the whole text first (most files match none), then the matching
        # lines alone, with what the other projects' issue numbers leave alone on each
        lines = {text.count("\n", 0, match.start()) for pattern in patterns.values()
                 for match in pattern.finditer(text)}
        if not lines:
            continue
        split = text.split("\n")
        for number in sorted(lines):
            line = split[number]
            allowed = [m.span() for m in OTHER_PROJECTS_ISSUES.finditer(line)]
            for what, pattern in patterns.items():
                for match in pattern.finditer(line):
                    if not any(a <= match.start() < b for a, b in allowed):
                        found.append(f"{name}:{number + 1}: {what} ({match.group(0)!r})")
    return found


def headings(markdown: str) -> list[str]:
    """The page's headings, with their code spans' backticks taken out."""
    titles, fenced = [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (match := HEADING.match(line)):
            titles.append(match.group(1).replace("`", ""))
    return titles


def unwrapped(text: str) -> str:
    """``text`` with its line breaks and the comment leaders after them as single spaces, so a
    reference wrapped over two comment lines reads as one."""
    return re.sub(r"\s*\n\s*(?:#:?\s*)?", " ", text)


def section_references(texts: dict[str, str]) -> list[tuple[str, str, str]]:
    """``(file, page, title)`` of every reference to a page's section by its title."""
    return [(name, page, title) for name, text in texts.items()
            for page, title in SECTION_REFERENCE.findall(unwrapped(text))]


def test_no_file_refers_to_a_path_outside_the_repository(texts):
    found = offences(texts, OUTSIDE_PATHS)
    assert not found, "references outside the repository:\n" + "\n".join(found)


def test_no_file_narrates_how_the_work_was_organised(texts):
    found = offences(texts, NARRATION)
    assert not found, "narration of the work's organisation:\n" + "\n".join(found)


def test_references_to_a_section_name_one_the_page_has(texts):
    references = section_references(texts)
    assert any(page == "design.md" for _, page, _ in references), "no reference to the design"
    missing = []
    for name, page, title in references:
        text = texts.get(f"docs/{page}")
        if text is None:
            missing.append(f"{name}: docs/{page} does not exist")
        elif not any(h.startswith(title) for h in headings(text)):
            missing.append(f"{name}: docs/{page} has no section {title!r}")
    assert not missing, "\n".join(missing)


def test_the_design_page_is_in_the_site_and_the_readme(texts):
    assert re.search(r"^\s*- Design: design\.md$", texts["mkdocs.yml"], re.MULTILINE)
    assert "docs/design.md" in texts["README.md"]


@pytest.mark.parametrize(("line", "what"), [
    ("see ../sha" "red/NOTES.md for the plan", "a relative path to a sibling shared folder"),
    ("as the DESIGN" ".md of the project says", "a design or style file outside docs/"),
    ("read /wor" "k/shared/x.txt first", "an absolute path of a development machine"),
    ("Iss" "ue 12 builds it in four pieces", "a numbered issue"),
    ("measured in the twenty-third sess" "ion", "a working session by its ordinal"),
    ("figures of this sess" "ion", "a working session or round"),
])
def test_the_patterns_catch_what_they_name(line, what):
    assert [f for f in offences({"x": line}, OUTSIDE_PATHS | NARRATION) if what in f]


@pytest.mark.parametrize("line", [
    "the design of docs/design.md, \"Layers\"",
    "dolphin #140 reports the same hang",
    "a crash of a busy process (CPython issues 116008, 131580)",
    "per case the median over rounds of its ratio to that round's read limit",
    "Run ``command`` in its own session (start_new_session=True)",
    "the scene family issue-a: 500 x 500 px",
    "a relative link [Benchmarks](../benchmarks.md)",
    "the path tests/data/shared_pair/ of the real SNAP pair",
])
def test_the_patterns_leave_legitimate_text_alone(line):
    assert not offences({"x": line}, OUTSIDE_PATHS | NARRATION)


def test_a_wrapped_section_reference_is_read_whole():
    text = 'the misclosures (docs/benchmarks.md,\n    # "The network solver\'s choices")'
    assert section_references({"x": text}) == [("x", "benchmarks.md",
                                                 "The network solver's choices")]


def test_every_recorded_benchmark_figure_says_when_where_and_how(texts):
    """Each run in benchmarks/results/*.json carries the date, commit, machine and command it
    was measured with, inherited from its file where the file states them once."""
    import json

    records = {name: json.loads(text) for name, text in texts.items()
               if name.startswith("benchmarks/results/") and name.endswith(".json")}
    assert records, "no recorded benchmark figures"
    fields = ("date", "commit", "machine", "command")
    missing = []
    for name, record in records.items():
        runs = [entry for key in ("runs", "comparisons", "sets") for entry in record.get(key, [])]
        for run in runs or [record]:
            absent = [f for f in fields if not (run.get(f) or record.get(f))]
            if absent:
                missing.append(f"{name}: {run.get('name', run.get('series', ''))} lacks {absent}")
    assert not missing, "\n".join(missing)


@pytest.mark.slow  # draws every figure with matplotlib (12 s)
def test_the_benchmark_page_shows_every_figure_plots_draws(tmp_path, texts):
    """``benchmarks/plots.py`` draws each of its figures from the recorded JSON, and the
    benchmark page shows every one of them."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("plots", ROOT / "benchmarks" / "plots.py")
    plots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plots)
    plots.main(["--out", str(tmp_path)])
    drawn = sorted(p.name for p in tmp_path.glob("*.png"))
    assert len(drawn) == len(plots.FIGURES)
    shown = set(re.findall(r"\(figures/(bench_\w+\.png)\)", texts["docs/benchmarks.md"]))
    assert set(drawn) <= shown, f"drawn, not shown: {sorted(set(drawn) - shown)}"
    assert all((ROOT / "docs" / "figures" / name).exists() for name in drawn)
