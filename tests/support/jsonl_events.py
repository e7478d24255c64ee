"""Event logs that handlers in worker processes append to: ``events-<pid>.jsonl`` files in the
store's home directory (:func:`tests.support.stores.home_of`), one ``os.write`` per line, so a
SIGKILL right after an event loses nothing."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from tests.support import stores


def append(url: str, **fields: Any) -> None:
    """Append one event (with the wall time ``t``) to this process's log."""
    home = stores.home_of(url)
    home.mkdir(parents=True, exist_ok=True)
    line = json.dumps({**fields, "t": time.time()}) + "\n"
    fd = os.open(home / f"events-{os.getpid()}.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read_all(url: str) -> list[dict[str, Any]]:
    """Every event of every process, in time order."""
    events: list[dict[str, Any]] = []
    for path in Path(stores.home_of(url)).glob("events-*.jsonl"):
        events.extend(json.loads(line) for line in path.read_text().splitlines())
    return sorted(events, key=lambda event: event["t"])
