"""What the extender writes on a pod: the `placement.<domain>/decision` annotation, a copy of the verdict
for `kubectl describe pod`. Nothing a pod carries is read back as placement state: anyone who can create
pods can write any annotation, so a group's bucket and the pods let through live in the extender's own
memory (book.py), and an admitted group's nodes in its PlacementGroup, which only nodefabric writes.

`kubectl describe pod` prints an annotation whole only when each of its lines fits in 140 characters
(longer lines are cut with "..."), so the text is wrapped. Nothing here does I/O.
"""

from __future__ import annotations

import textwrap

from nodefabric_devicemanager import vocabulary
from nodefabric_operator.extender.config import ExtenderConfig

DECISION = vocabulary.DECISION
# Lines of the decision text; kubectl describe cuts lines longer than 138 characters after the indent.
LINE = 120
# Event messages and annotation values the extender writes stay short: the API server caps an Event
# message at 1 KiB, and every pod's annotations together at 256 KiB.
MAX_TEXT = 1024


def key(config: ExtenderConfig) -> str:
    """The one annotation the extender writes (and may write: the admission policy's list)."""
    return config.annotation_prefix + DECISION


def decision_text(outcome: str, summary: str) -> str:
    """The verdict as `kubectl describe pod` shows it whole: "placed: 8 of 8 pods of group ...". A summary
    that already opens with its outcome ("never fits: ...") is not prefixed twice."""
    words = outcome.replace("-", " ")
    text = summary if summary.startswith(f"{words}:") else f"{outcome}: {summary}"
    if len(text) > MAX_TEXT:
        text = text[: MAX_TEXT - 3] + "..."
    # A word longer than a line (a 253-character node name) stays whole.
    return "\n".join(textwrap.wrap(text, LINE, break_long_words=False, break_on_hyphens=False))
