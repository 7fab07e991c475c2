"""What every vendor-library boundary shares: how it says it could not answer."""

from __future__ import annotations


class LibraryUnavailable(Exception):
    """The vendor library (or the driver behind it) is not there: nothing about the fabric can be asked."""


class LibraryError(Exception):
    """The library is there but failed to answer; the fabric is unknown, not absent."""


def normalize_bus_id(raw: str | bytes) -> str:
    """A library's spelling of a PCI address ("00000000:1B:00.0") in sysfs form ("0000:1b:00.0")."""
    # backslashreplace, not replace: a byte that is not ASCII matches no sysfs address either way, and a
    # U+FFFD must never reach a message that might be published.
    text = raw.decode("ascii", errors="backslashreplace") if isinstance(raw, bytes) else raw
    text = text.strip().strip("\x00").lower()
    parts = text.split(":")
    if len(parts) == 3:
        domain = parts[0].lstrip("0").rjust(4, "0")
        return f"{domain}:{parts[1]}:{parts[2]}"
    if len(parts) == 2:  # no domain: the legacy form
        return f"0000:{text}"
    return text
