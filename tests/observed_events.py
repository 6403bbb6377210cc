"""An observer for the `durably observe` test: appends each event to `$DURABLY_TEST_OBSERVED`."""

from __future__ import annotations

import json
import os

from durably import LiveItem


def record(item: LiveItem) -> None:
    event = item.event
    line = {"run_id": getattr(event, "run_id", None), "offset": item.offset, "type": event.type}
    with open(os.environ["DURABLY_TEST_OBSERVED"], "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
