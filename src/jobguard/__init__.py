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
    HardTimeLimitExceeded,
    JobCancelled,
    JobFinishedError,
    JobGuardError,
    JobStateError,
    KeyTemplateError,
    LeaseLostError,
    LockBusyError,
    NotFoundError,
    PayloadError,
    Retry,
    RunStopped,
    SchemaVersionError,
    StaleFenceError,
    StepError,
    StepSQLError,
    StoreBrokenError,
    StoreUnavailableError,
    TimeLimitExceeded,
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
from jobguard.supervisor import ProcessWorker
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
    "HardTimeLimitExceeded",
    "HookChain",
    "Hooks",
    "Job",
    "JobCancelled",
    "JobFinishedError",
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
    "ProcessWorker",
    "ReplayReport",
    "Retry",
    "RunStopped",
    "Schedule",
    "Scheduler",
    "SchemaVersionError",
    "StaleFenceError",
    "StepError",
    "StepSQLError",
    "StoreBrokenError",
    "StoreUnavailableError",
    "Task",
    "TimeLimitExceeded",
    "UnknownTaskError",
    "Worker",
    "WorkerFailedError",
]
__version__ = "0.1.0"
