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
    paths = [
        ROOT / "README.md",
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "src").rglob("*.py"),
        *(ROOT / "src").rglob("*.json"),
        *(ROOT / "studies").glob("*/README.md"),
    ]
    hits = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in paths
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"issue [0-9]|session [0-9]", line, re.I)
    ]
    assert not hits, "\n".join(hits)


def test_readme_is_a_front_door():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


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
