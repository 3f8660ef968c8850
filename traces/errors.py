"""The base exception of memplan; every package derives its own from it.

The CLI catches `MemplanError` only and prints it as one line (exit code 2).
Anything else is an internal bug and stays a loud traceback.
"""


class MemplanError(Exception):
    """Bad input or an impossible request, reported to the user in one line."""


class TraceError(MemplanError):
    """A malformed trace or workload; the message names the exact location."""
