"""The user's error: what the command line prints as one line, and every other exception as a bug.

:class:`ConfigError` is raised for everything that is the user's to fix (a bad setting, a run folder that
holds another run, a device this machine lacks, an unknown codec name), with a message that names the
bad value and the fix. It is a ``ValueError``, so code that caught ``ValueError`` still catches it. The
CLI prints a ``ConfigError`` as ``diloco COMMAND: error: MESSAGE`` (exit 2); any other exception escaping
a command is a bug: its traceback is printed with a line asking for a report (exit 1).
"""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """Something the user must fix; the message names the bad value and the fix."""
