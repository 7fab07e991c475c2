"""What the extender persists on a pod, and reads back: two annotations under `placement.<domain>/`.

- `decision`: the verdict in words, where users look. `kubectl describe pod` prints an annotation whole
  only when each of its lines fits in 140 characters (longer lines are cut with "..."), so the text is
  wrapped. It outlives the pod's Events (one hour) and an extender restart.
- `claim`: on a pod the extender let through, the bucket of its group and when, as compact JSON. A
  restarted extender, or the standby of a new leader, rebuilds the group's bucket and its claims (pods
  let through, not yet bound) from these, so a restart never splits a group.

Only a claim that names the pod's own uid and group counts: a pod spec copied with its annotations into
a new pod (new uid) claims nothing. Nothing here does I/O.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.extender.placement import ANY, Choice

DECISION = "decision"
CLAIM = "claim"
# Lines of the decision text; kubectl describe cuts lines longer than 138 characters after the indent.
LINE = 120
# Event messages and annotation values the extender writes stay short: the API server caps an Event
# message at 1 KiB, and every pod's annotations together at 256 KiB.
MAX_TEXT = 1024
MAX_CLAIM = 4096


@dataclass(frozen=True)
class Claim:
    group: str
    uid: str
    at: float  # seconds since the epoch
    choice: Choice


def keys(config: ExtenderConfig) -> tuple[str, str]:
    """The two annotation keys the extender writes (and may write: the admission policy's list)."""
    return config.annotation_prefix + DECISION, config.annotation_prefix + CLAIM


def timestamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def decision_text(outcome: str, summary: str) -> str:
    """The verdict as `kubectl describe pod` shows it whole: "placed: 8 of 8 pods of group ..."."""
    text = f"{outcome}: {summary}"
    if len(text) > MAX_TEXT:
        text = text[: MAX_TEXT - 3] + "..."
    # A word longer than a line (a 253-character node name) stays whole: the text reads back exactly.
    return "\n".join(textwrap.wrap(text, LINE, break_long_words=False, break_on_hyphens=False))


def summary_of(text: str) -> str:
    """The summary back out of a decision text."""
    _, _, rest = text.partition(": ")
    return rest.replace("\n", " ")


def claim_text(group: str, uid: str, at: float, choice: Choice) -> str:
    body = {
        "group": group,
        "uid": uid,
        "at": timestamp(at),
        "level": choice.level,
        "location": choice.location,
        "homogeneity": dict(choice.homogeneity),
        "enclosing": [list(pair) for pair in choice.enclosing],
    }
    return json.dumps(body, separators=(",", ":"), sort_keys=True)


def _pairs(value: object) -> tuple[tuple[str, str], ...] | None:
    if isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in value.items()
    ):
        return tuple(value.items())
    if isinstance(value, list) and all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) and x for x in p) for p in value
    ):
        return tuple((p[0], p[1]) for p in value)
    return None


def parse_claim(
    annotations: Mapping[str, Any], *, uid: str, group: str | None, config: ExtenderConfig
) -> Claim | None:
    """The pod's claim, or None when it has none the extender wrote for this very pod and group."""
    decision_key, claim_key = keys(config)
    text = annotations.get(claim_key)
    if not isinstance(text, str) or len(text) > MAX_CLAIM or group is None:
        return None
    try:
        body = json.loads(text)
        at = datetime.strptime(body["at"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except (ValueError, TypeError, KeyError, RecursionError):
        return None
    if not isinstance(body, dict) or body.get("uid") != uid or body.get("group") != group:
        return None
    level, location = body.get("level"), body.get("location")
    if level == ANY:
        if location is not None:
            return None
    elif level not in config.level_names or not isinstance(location, str) or not location:
        return None
    homogeneity, enclosing = _pairs(body.get("homogeneity")), _pairs(body.get("enclosing"))
    if homogeneity is None or enclosing is None or any(lv not in config.level_names for lv, _ in enclosing):
        return None
    decided = annotations.get(decision_key)
    summary = summary_of(decided) if isinstance(decided, str) else ""
    return Claim(group, uid, at, Choice(level, location, homogeneity, enclosing, summary))
