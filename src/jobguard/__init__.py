"""jobguard: background jobs whose side effects happen once, on a queue that delivers at least once.

Start with :class:`App`; see the README and ``docs/`` for the concepts.
"""

from jobguard.app import App
from jobguard.context import Context
from jobguard.core.selection import DeadFilter, DeadPreview, ReplayReport
from jobguard.deadletters import DeadLetterQueue
from jobguard.exceptions import (
    ConfigurationError,
    DuplicateJobError,
    EnqueueError,
    Fatal,
    GuardLost,
    JobGuardError,
    JobStateError,
    KeyTemplateError,
    LeaseLostError,
    LockBusyError,
    NotFoundError,
    PayloadError,
    Retry,
    SchemaVersionError,
    StaleFenceError,
    StepError,
    StepSQLError,
    StoreBrokenError,
    StoreUnavailableError,
    UnknownTaskError,
    WorkerFailedError,
)
from jobguard.hooks import AttemptEvent, HookChain, Hooks
from jobguard.models import (
    Attempt,
    DeadJob,
    Job,
    JobStatus,
    LockGrant,
    Operation,
    OperationStatus,
    Outcome,
)
from jobguard.schedule import Schedule
from jobguard.scheduler import Scheduler
from jobguard.task import Task
from jobguard.worker import Worker

__all__ = [
    "App",
    "Attempt",
    "AttemptEvent",
    "ConfigurationError",
    "Context",
    "DeadFilter",
    "DeadJob",
    "DeadLetterQueue",
    "DeadPreview",
    "DuplicateJobError",
    "EnqueueError",
    "Fatal",
    "GuardLost",
    "HookChain",
    "Hooks",
    "Job",
    "JobGuardError",
    "JobStateError",
    "JobStatus",
    "KeyTemplateError",
    "LeaseLostError",
    "LockBusyError",
    "LockGrant",
    "NotFoundError",
    "Operation",
    "OperationStatus",
    "Outcome",
    "PayloadError",
    "ReplayReport",
    "Retry",
    "Schedule",
    "Scheduler",
    "SchemaVersionError",
    "StaleFenceError",
    "StepError",
    "StepSQLError",
    "StoreBrokenError",
    "StoreUnavailableError",
    "Task",
    "UnknownTaskError",
    "Worker",
    "WorkerFailedError",
]
__version__ = "0.1.0"
