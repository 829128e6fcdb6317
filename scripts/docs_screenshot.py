"""Open the built documentation site's home page in headless Chromium: screenshot it and check it renders.

    make docs && .venv/bin/python scripts/docs_screenshot.py --site site --out site-home.png

Checks that the page has its title and the navigation's sections (Guides, Reference, Explanations,
Results) once rendered, and that the screenshot is not blank. Needs Chromium (Debian: apt-get install
chromium); exits 2 saying so when it is absent. The tests run it when Chromium is installed.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SECTIONS = ("Getting started", "Guides", "Reference", "Explanations", "Results")
HEADER_RGB = (0x40, 0x51, 0xB5)  # Material's "indigo" primary colour (mkdocs.yml: theme.palette.primary)


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def check_home(site: Path, out: Path, *, width: int = 1280, height: int = 900) -> list[str]:
    """Problems found (empty when the home page renders with its navigation); writes the screenshot to ``out``."""
    browser = find_chromium()
    if browser is None:
        raise FileNotFoundError("no Chromium found: apt-get install chromium (Debian), then run this again")
    page = (site / "index.html").resolve()
    if not page.is_file():
        raise FileNotFoundError(f"{page} does not exist: build the site first (make docs)")
    with tempfile.TemporaryDirectory() as profile:
        flags = [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--user-data-dir={profile}",
            "--hide-scrollbars",
            f"--window-size={width},{height}",
        ]
        dom = subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
        shot = subprocess.run(
            [*flags, f"--screenshot={out.resolve()}", page.as_uri()], capture_output=True, text=True, timeout=120
        )
    problems = []
    if dom.returncode != 0 or shot.returncode != 0 or not out.is_file():
        return [f"chromium failed: {dom.stderr[-500:]} {shot.stderr[-500:]}"]
    html = dom.stdout
    if "<title>diloco" not in html:
        problems.append("the rendered page's title is not the site's (diloco)")
    if 'class="md-tabs' not in html or 'class="md-nav' not in html:
        problems.append("the rendered page has no navigation (md-tabs / md-nav)")
    problems += [f"the navigation lacks {s!r}" for s in SECTIONS if s not in html]
    import matplotlib.image as mpimg
    import numpy as np

    image = (mpimg.imread(out)[..., :3] * 255).astype(np.int16)
    colours = len(np.unique(image.reshape(-1, 3), axis=0))
    if colours < 16:
        problems.append(f"the screenshot has {colours} colours: blank")
    header = image[5:40].reshape(-1, 3)  # the theme's header bar, in its primary colour (indigo) when styled
    share = float(np.mean(np.abs(header - np.array(HEADER_RGB)).sum(axis=1) < 40))
    if share < 0.5:
        problems.append(
            f"the header bar is not drawn in the theme's colour ({share:.0%} of its pixels): "
            f"the stylesheet did not load"
        )
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--site", type=Path, default=Path("site"), help="the built site (default: site)")
    ap.add_argument("--out", type=Path, default=Path("site-home.png"), help="the screenshot (default: site-home.png)")
    args = ap.parse_args()
    try:
        problems = check_home(args.site, args.out)
    except FileNotFoundError as exc:
        print(f"docs_screenshot: {exc}", file=sys.stderr)
        return 2
    for p in problems:
        print(f"docs_screenshot: {p}", file=sys.stderr)
    print(f"{'FAILED' if problems else 'ok'}: {args.out}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
