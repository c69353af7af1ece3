"""The hand-written pages carry no verdicts of their own: one judge (``laplace_lab.reporting.results_summary``
with ``laplace_lab.reporting.verdict_rules``) writes every verdict, into ``results/README.md``, the "Reference
numbers" sections of ``results/<table>.md`` and the top README's preset table.

A hand verdict ("matches" in a table cell, "7 of 12 reproduce" in prose) goes stale as soon as the rules or
the runs change, and then contradicts the generated one. The pages scanned (``PAGES``: the experiment
write-ups, ``experiments/README.md``, ``docs/*.md``, ``README.md``) may state measured numbers (ours, theirs,
d ± se, n) and link to the generated verdicts, but not:

- a markdown table cell that is, or ends with, a verdict word (``VERDICT_WORDS``, optionally followed by
  one parenthesis such as "(noise)"), e.g. ``| matches |``, ``| (3): matches |``, ``| differs |`` (``CELL``);
- a count of verdicts, ``N of M [rows] match``, ``N of M reproduce``, ``N of M matches``, ``2 hold``
  (``COUNT``);
- the earlier peer rule as a verdict, "within 2 paired standard errors" (``OLD_RULE``).

A sentence that trips a pattern while stating a measurement is reworded (a comma or a digit's unit breaks
a count phrase); there is no allow-list.

The top README's generated preset table (between ``preset_table.BEGIN`` and ``preset_table.END``) is skipped:
the generator writes it. Statics only: regular expressions over the text.
"""

from __future__ import annotations

import re
from pathlib import Path

from laplace_lab.reporting import preset_table

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted({*(ROOT / "experiments").glob("*/README.md"), ROOT / "experiments" / "README.md",
                *(ROOT / "docs").glob("*.md"), ROOT / "README.md"})
VERDICT_WORDS = r"match(?:es|ed)?|differs?|reproduces?|misses|fails|holds"
# a table cell that is or ends with a verdict word, maybe followed by one parenthesis: "(noise)", "(ours higher)"
CELL = re.compile(rf"(?:^|\W)(?:{VERDICT_WORDS})(?:\s*\([^()]*\))?$", re.I)
# a count of verdicts: "22 of 28 rows match", "7 of 12 reproduce", "19 of 28 matches", "2 hold", "8 peer values
# reproduce" (a number, maybe "of [the] M", at most three words, a verdict verb)
COUNT = re.compile(rf"(?<![\w.-])\d+\s+(?:of\s+(?:the\s+)?\d+\s+)?(?:[a-z'-]+\s+){{0,3}}?"
                   rf"(?:{VERDICT_WORDS}|reproduced?|match|miss|fail|hold)\b", re.I)
# the earlier peer rule, a verdict by itself: "within 2 paired standard errors", "|d| <= 2 se"
OLD_RULE = re.compile(r"within\s+2\s+paired\s+(?:standard\s+errors?|s\.?e\b)|\|d\|\s*<=\s*2\s*se\b", re.I)
# page (relative to the root) -> why its hits are tolerated for now. An entry whose page has no hit left
# fails the test, so the list only shrinks.


def generated_lines(lines: list[str]) -> set[int]:
    """Indices of the lines the generator writes: the top README's preset table, markers included."""
    if preset_table.BEGIN in lines and preset_table.END in lines:
        return set(range(lines.index(preset_table.BEGIN), lines.index(preset_table.END) + 1))
    return set()


def cells(line: str) -> list[str]:
    """The cells of a markdown table row (``| a | b |``), emphasis and code marks stripped; [] otherwise."""
    if not line.lstrip().startswith("|"):
        return []
    return [re.sub(r"[*_`]", "", c).strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def scan(text: str) -> list[tuple[int, str]]:
    """(line number from 1, what was found) of every hand verdict of a page's ``text``; the phrases
    (``COUNT``, ``OLD_RULE``) are found across line breaks, at the line where they start."""
    lines = text.splitlines()
    skip = generated_lines(lines)
    kept = "\n".join("" if i in skip else line for i, line in enumerate(lines))
    hits = [(i + 1, c) for i, line in enumerate(kept.splitlines()) for c in cells(line) if CELL.search(c)]
    hits += [(kept.count("\n", 0, m.start()) + 1, " ".join(m.group(0).split()))
             for pattern in (COUNT, OLD_RULE) for m in pattern.finditer(kept)]
    return sorted(hits)


def hand_verdicts(path: Path) -> list[str]:
    """``file:line: text`` of every hand verdict of ``path`` (see the module docstring)."""
    return [f"{path.relative_to(ROOT)}:{line}: {found!r}" for line, found in scan(path.read_text())]


def test_no_hand_verdicts_in_the_pages():
    """No page outside the generated sections states a verdict or a count of verdicts."""
    hits = [h for p in PAGES for h in hand_verdicts(p)]
    assert not hits, ("hand-written verdicts (state the numbers and link to results/README.md instead):\n"
                      + "\n".join(hits) + f"\n{len(hits)} hit(s)")


def test_the_scan_finds_what_it_should():
    """The patterns catch the stale forms and leave measurements and the generated table alone."""
    caught = ["| yacht | -0.41 | (3): matches |", "| a | matches (noise) |", "| b | **differs** (ours higher) |",
              "22 of 28 rows match the authors' code", "7 of 12 reproduce", "It gave 19 of 28 matches;",
              "Verdicts: 3 reproduce, 9 do not.", "counts 2 hold / 3 within noise", "all 8 peer values\nreproduce",
              "the 'mean' form matches within 2 paired standard errors", "judged (|d| <= 2 se)"]
    passed = ["| yacht | -0.41 ± 0.02 | 0.03 ± 0.01 (n=5) |", "ours minus theirs is 0.03 ± 0.01 over 3 of 5 seeds",
              "see [results/README.md](results/README.md)", "| matches the authors' code | 11 of 40 |",
              "MLP 100-100 and MLP 500-300 differ by 134", "within 2 combined standard errors of the paper"]
    for text in caught:
        assert scan(text), text
    for text in passed:
        assert not scan(text), text
    table = ["intro", preset_table.BEGIN, "| x | y | 8 of 28 match laplace-torch |", preset_table.END]
    assert generated_lines(table) == {1, 2, 3} and not scan("\n".join(table))
