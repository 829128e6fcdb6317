"""Headless Chromium for the tests that load a page (Debian: apt-get install chromium; those tests skip without it).
The same flags as scripts/docs_screenshot.py."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _flags(browser: str, profile: str, width: int, height: int) -> list[str]:
    return [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        f"--user-data-dir={profile}",
        "--hide-scrollbars",
        f"--window-size={width},{height}",
    ]


def dump_dom(browser: str, url: str, *, width: int = 1280, height: int = 1000, prefix: Sequence[str] = ()) -> str:
    """The page's DOM once loaded (its scripts run, its SVG inline). ``prefix``: what the browser runs under (e.g.
    ``ip netns exec NS``: a browser on another host's network)."""
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run(
            [*prefix, *_flags(browser, profile, width, height), "--dump-dom", url],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0, done.stderr[-1000:]
    return done.stdout


def screenshot(
    browser: str, url: str, out: Path, *, width: int = 1280, height: int = 1000, prefix: Sequence[str] = ()
) -> int:
    """Save the page as PNG to ``out``; returns how many colours it has (a blank page has a handful). ``prefix``: as
    :func:`dump_dom`'s."""
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run(
            [*prefix, *_flags(browser, profile, width, height), f"--screenshot={Path(out).resolve()}", url],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0 and Path(out).is_file(), done.stderr[-1000:]
    import matplotlib.image as mpimg
    import numpy as np

    image = (mpimg.imread(out)[..., :3] * 255).astype(np.int16)
    return len(np.unique(image.reshape(-1, 3), axis=0))
