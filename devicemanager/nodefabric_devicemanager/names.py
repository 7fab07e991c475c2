"""Kubernetes names as the API server checks them, matched whole.

One definition for the node side: a node name, a domain, a driver name, a claim's namespace and name, a
device name. Always `fullmatch`: `^...$` with `match` also accepts a final newline, which the API server
refuses on every write (a slice for node "n1\\n") and which would end up in a file name or a socket path.
"""

from __future__ import annotations

import re

_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_DNS_LABEL = re.compile(_LABEL, re.ASCII)
_DNS_SUBDOMAIN = re.compile(rf"{_LABEL}(?:\.{_LABEL})*", re.ASCII)
# A uid as the API server mints it (a UUID), or as a test or another implementation might: letters,
# digits and dashes. It names a file on disk, so nothing else passes.
_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,62}", re.ASCII)

DNS_LABEL_MAX = 63
DNS_SUBDOMAIN_MAX = 253


def dns_label(text: str) -> bool:
    """RFC 1123 label: a namespace, a device name in a ResourceSlice (63 characters at most)."""
    return len(text) <= DNS_LABEL_MAX and _DNS_LABEL.fullmatch(text) is not None


def dns_subdomain(text: str, limit: int = DNS_SUBDOMAIN_MAX) -> bool:
    """RFC 1123 subdomain: a node name, most object names, a domain (at most `limit` characters)."""
    return len(text) <= limit and _DNS_SUBDOMAIN.fullmatch(text) is not None


def uid(text: str) -> bool:
    return _UID.fullmatch(text) is not None
