"""Diagnostics over the attempt log (G10.2-G10.5): what ``jobguard doctor`` and ``app.diagnose()``
report.

One module per check, each a pure function over :class:`~jobguard.models.Attempt`,
:class:`~jobguard.models.Job` and :class:`~jobguard.models.Operation` values:

* :mod:`.overlaps` — one operation run by two deliveries at overlapping times (G10.2);
* :mod:`.durations` — per task p50/p95/p99/max against its visibility timeout and lock TTL (G10.3);
* :mod:`.resources` — per resource key: lock contention and starvation, overlaps of different
  operations under one lock, and deliveries refused for a stale fence;
* :mod:`.retries`, :mod:`.outages` and :mod:`.poison` — failure spikes, many jobs failing the
  same way at once (an outage), and one job failing the same way again and again;
* :mod:`.crashes` — worker crashes with the same job present at each (a crash loop);
* :mod:`.dedup` — one business operation enqueued as several jobs (unstable dedup keys);
* :mod:`.audit` and :mod:`.completions` — completed operations, the traces they left, and
  completions that did less than usual.

Each check also turns what it found into :class:`~.findings.Finding` values (kind, severity,
task, keys, numbers), which :mod:`.report` collects.

:mod:`.snapshot` reads the store (through the ports only) and :mod:`.report` runs every check.
"""

from jobguard.diagnostics.audit import Audit, TaskTraces
from jobguard.diagnostics.durations import Advice, TaskDurations
from jobguard.diagnostics.findings import Finding, Keys, Kind, Severity
from jobguard.diagnostics.overlaps import Overlap, Run
from jobguard.diagnostics.poison import ErrorGroup
from jobguard.diagnostics.report import Diagnosis, diagnose
from jobguard.diagnostics.retries import TaskRetries
from jobguard.diagnostics.snapshot import Snapshot, read_snapshot

__all__ = [
    "Advice",
    "Audit",
    "Diagnosis",
    "ErrorGroup",
    "Finding",
    "Keys",
    "Kind",
    "Overlap",
    "Run",
    "Severity",
    "Snapshot",
    "TaskDurations",
    "TaskRetries",
    "TaskTraces",
    "diagnose",
    "read_snapshot",
]
