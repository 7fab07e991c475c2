"""kopf's log records, made to fit our structured logs: one short line per event, only our fields.

kopf's per-object logger attaches its whole OperatorSettings object (about 2 KB once printed) and the
object reference to every record it emits, and our formatters print every attribute a record carries.
Its per-event "Handler ... succeeded" lines repeat, at INFO, what our own line says. So: kopf's object
records keep their message and name the object in one short field, and its routine per-event lines are
only shown at DEBUG. Warnings and errors from kopf are kept.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

OBJECT_LOGGER = "kopf.objects"
_KOPF_FIELDS = ("settings", "k8s_skip", "k8s_ref")


class KopfFields(logging.Filter):
    """Replaces kopf's record attributes with one `object` field ("Devices/n1", "NodeFeature/ns/n1")."""

    def filter(self, record: logging.LogRecord) -> bool:
        ref = getattr(record, "k8s_ref", None)
        for field in _KOPF_FIELDS:
            record.__dict__.pop(field, None)
        if isinstance(ref, Mapping):
            namespace, name = ref.get("namespace"), ref.get("name")
            record.object = (
                f"{ref.get('kind')}/{namespace}/{name}" if namespace else f"{ref.get('kind')}/{name}"
            )
        return True


_FILTER = KopfFields()


def configure(level: int | None = None) -> None:
    """Idempotent. `level`: the level asked for the whole process (default: the root logger's)."""
    root_level = logging.getLogger().getEffectiveLevel() if level is None else level
    objects = logging.getLogger(OBJECT_LOGGER)
    objects.addFilter(_FILTER)  # a logger filter: it runs for kopf's adapters before any handler
    objects.setLevel(logging.DEBUG if root_level <= logging.DEBUG else logging.WARNING)
