"""Diagnostics over the attempt log (R8.2-R8.5): what ``jobguard doctor`` and ``app.diagnose()``
report.

One module per check, each a pure function over :class:`~jobguard.models.Attempt`,
:class:`~jobguard.models.Job` and :class:`~jobguard.models.Operation` values:

* :mod:`.overlaps` — one operation run by two deliveries at overlapping times (R8.2);
* :mod:`.durations` — per task p50/p95/p99/max against its visibility timeout and lock TTL (R8.3);
* :mod:`.retries` and :mod:`.poison` — retry spikes and errors that repeat (R8.4);
* :mod:`.audit` — completed operations and the traces they left (R8.5).

:mod:`.snapshot` reads the store (through the ports only) and :mod:`.report` runs every check.
"""

from jobguard.diagnostics.audit import Audit, TaskTraces
from jobguard.diagnostics.durations import Advice, Severity, TaskDurations
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
