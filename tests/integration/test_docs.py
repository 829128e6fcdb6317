"""The documentation site builds strictly, its reference covers every key, and no page names work items."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from diloco.cli import COMMANDS
from diloco.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
MKDOCS = Path(sys.executable).with_name("mkdocs")
#: how our own work items read in text: a numbered issue or session, "the issue's ...", "in the same session"
WORK_ITEMS = re.compile(
    r"\bissue [0-9#]|\bthe issue's|\bsession [0-9]|\bsame session\b|\bwork items?\b|\bworktree", re.I
)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """`make docs`' build (strict) into a temporary folder."""
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def test_the_reference_lists_every_config_key(site):
    html = (site / "reference" / "config" / "index.html").read_text()
    listed = re.findall(r"<tr>\s*<td><code>(\w+)</code></td>", html)
    assert listed == [f.name for f in fields(TrainConfig)]


def test_the_cli_reference_has_every_command(site):
    html = (site / "reference" / "cli" / "index.html").read_text()
    for name in COMMANDS:
        assert f"diloco {name}" in html and "usage: diloco" in html


def test_the_api_reference_resolves_the_public_classes(site):
    html = (site / "reference" / "api" / "index.html").read_text()
    for name in (
        "diloco.algorithm.streaming.StreamingDiLoCo",
        "diloco.train.trainer.train_model",
        "diloco.distributed.launch.setup_communicators",
    ):
        assert f'id="{name}"' in html, name


def test_every_page_in_docs_is_in_the_navigation(site):
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    nav = set(re.findall(r"^\s+- (?:[^:\n]+: )?([\w/.-]+\.md)$", (ROOT / "mkdocs.yml").read_text(), re.M))
    assert pages == nav


def test_no_user_facing_text_names_internal_work_items():
    """What a user reads (the README, CONTRIBUTING, the docs, the package, the scripts and studies they run, and
    the studies' READMEs) names no work item of ours: no "issue 15", "the issue's figures", "session 3", "in the
    same session", "work item" or "worktree"."""
    paths = [
        ROOT / "README.md",
        ROOT / "CONTRIBUTING.md",
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "src").rglob("*.py"),
        *(ROOT / "src").rglob("*.json"),
        *(ROOT / "studies").glob("*/README.md"),
        *[p for d in ("benchmarks", "examples", "scripts", "studies") for p in (ROOT / d).rglob("*.py")],
    ]
    hits = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in paths
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if WORK_ITEMS.search(line)
    ]
    assert not hits, "\n".join(hits)


def test_readme_is_a_front_door():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_the_work_item_pattern_sees_what_it_must_and_passes_ordinary_words():
    for text in ("issue 47", "Issue 15's loss targets", "the issue's figures", "in the same session", "work item"):
        assert WORK_ITEMS.search(text), text
    for text in ("matched by issue order", "a method's session", "torchrun starts workers in their own sessions"):
        assert not WORK_ITEMS.search(text), text


def _feature_bullets(text: str) -> list[str]:
    """The bulleted features list: every line from the first ``- **`` bullet to the blank line ending it."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("- **"))
    end = next(i for i in range(start, len(lines)) if not lines[i].strip())
    return lines[start:end]


def test_the_docs_home_page_lists_the_readmes_features_word_for_word():
    readme = _feature_bullets((ROOT / "README.md").read_text())
    home = _feature_bullets((ROOT / "docs" / "index.md").read_text())
    titles = re.findall(r"^- \*\*(.+?)\*\*", "\n".join(readme), re.M)
    assert {"Decoupled DiLoCo", "Pretrained in, trained out", "Fewer bits"} <= set(titles)
    for title in titles:
        assert f"**{title}**" in "\n".join(home), f"docs/index.md does not name {title!r}"
    assert home == readme, "docs/index.md's features list differs from the README's: copy the README's"


def _table_rows(text: str, heading: str) -> list[list[str]]:
    """The cells of the first table after ``heading``, header and separator left out."""
    rows, seen = [], False
    for line in text[text.index(heading) :].splitlines()[1:]:
        if line.startswith("|"):
            seen = True
            rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
        elif seen:
            break
    return rows[2:]


def test_the_readmes_results_are_one_short_line_each_and_every_one_is_in_full_in_the_docs():
    readme = _table_rows((ROOT / "README.md").read_text(), "## Results")
    full = _table_rows((ROOT / "docs" / "results" / "index.md").read_text(), "# Headline results")
    assert len(readme) >= 20 and all(len(r) == 4 for r in readme)
    long = [f"{r[0]}: {len(r[1])} characters" for r in readme if len(r[0]) > 45 or len(r[1]) > 90]
    assert not long, "README results rows longer than one short line (move the detail to docs/results/):\n" + "\n".join(
        long
    )
    missing = sorted({r[0] for r in readme} - {r[0] for r in full})
    assert not missing, f"README results rows with no row of the same name in docs/results/index.md: {missing}"


def test_the_readme_gives_the_suites_count_and_time_with_its_machine():
    tests = (ROOT / "README.md").read_text().split("## Tests", 1)[1]
    line = re.search(
        r"^`make test` ran [0-9,]+ tests .* of tests .*on a fresh clone \(CPU: (.+), ([0-9]+) cores\); "
        r"counts and times vary with the machine and its load\.$",
        tests,
        re.M,
    )
    assert line, "the README's Tests section lacks the line with the suite's count, time and machine"
    assert line.group(1).strip() and int(line.group(2)) >= 1


def test_the_home_page_renders_with_its_navigation_in_a_browser(site, tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_screenshot", ROOT / "scripts" / "docs_screenshot.py")
    shot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shot)
    if shot.find_chromium() is None:
        pytest.skip("no Chromium here (apt-get install chromium); scripts/docs_screenshot.py needs it")
    assert shot.check_home(site, tmp_path / "home.png") == []


def test_every_docs_page_the_code_and_readmes_name_exists():
    """Error messages, help texts and READMEs point at documentation pages: each must exist."""
    paths = [
        ROOT / "README.md",
        ROOT / "Makefile",
        *(ROOT / "studies").glob("*/README.md"),
        *[p for d in ("src", "benchmarks", "examples", "scripts", "studies") for p in (ROOT / d).rglob("*.py")],
        *(ROOT / "src").rglob("*.json"),
    ]
    missing = []
    for p in paths:
        text = p.read_text()
        named = set(re.findall(r"\bdocs/[\w/.-]+?\.md\b", text))
        if p.suffix == ".md":  # relative Markdown links and images of a README
            named |= {
                str((p.parent / t).resolve().relative_to(ROOT))
                for t in re.findall(r"\]\((?!https?:|#|mailto:)([^)#\s]+)", text)
                if (p.parent / t).resolve().is_relative_to(ROOT)
            }
        missing += [f"{p.relative_to(ROOT)} names {n}" for n in sorted(named) if not (ROOT / n).exists()]
    assert not missing, "\n".join(missing)
