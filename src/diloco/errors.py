"""The user's error: what the command line prints as one line, and every other exception as a bug.

:class:`ConfigError` is raised for everything that is the user's to fix (a bad setting, a run folder that
holds another run, a device this machine lacks, an unknown codec name), with a message that names the
bad value and the fix. It is a ``ValueError``, so code that caught ``ValueError`` still catches it. The
CLI prints a ``ConfigError`` as ``diloco COMMAND: error: MESSAGE`` (exit 2). :class:`RunError` marks a
run that failed for a reason outside the code (a peer process died, a collective timed out, the syncer went
away): its traceback is printed as it always was (exit 1). Any other exception escaping a command is a bug:
its traceback is printed with a line asking for a report (exit 1).
"""

from __future__ import annotations

__all__ = ["ConfigError", "RunError"]


class ConfigError(ValueError):
    """Something the user must fix; the message names the bad value and the fix."""


class RunError(RuntimeError):
    """A run that failed for a reason outside the code (a dead peer, a timeout); not the user's setting, not a bug."""
