"""Every error jobguard raises, under one root.

::

    JobGuardError
    ├── ConfigurationError          bad task options, bad URL, unknown backend
    │   ├── SchemaVersionError      the store's schema is not the version this jobguard knows
    │   └── StepError               a step misused: a name reused, a result JSON cannot give back
    ├── EnqueueError                a job was refused at the door; nothing was stored
    │   ├── PayloadError            not JSON, too large, not a mapping
    │   ├── KeyTemplateError        an operation/resource key template that cannot be built stably
    │   └── UnknownTaskError        no task of that name is registered
    ├── NotFoundError               no job / operation / dead job with that id
    ├── DuplicateJobError           a replay would make a second live job for one dedup key
    ├── JobStateError               an operator action does not apply to the job's state
    │   └── JobFinishedError        a cancel of a job that already completed or is dead
    ├── StoreUnavailableError       the database went away or is locked past its timeout (also
    │   │                           under a ``db_step``: its connection lost or timed out)
    │   └── StoreBrokenError        the store cannot be used as it is (retrying will not help)
    ├── StepSQLError                the SQL of a ``db_step`` function failed (wraps the driver's)
    ├── GuardLost                   this worker no longer owns the delivery; its writes are refused
    │   ├── LeaseLostError          the lease token is stale (redelivered, released, finished)
    │   └── StaleFenceError         a newer lock holder exists (its fencing token is older)
    ├── LockBusyError               the resource lock is held by a live owner
    ├── WorkerFailedError           the worker stopped because it could not keep its leases
    ├── RunStopped                  the run was told to stop; raised by ``ctx.step`` and friends
    │   ├── TimeLimitExceeded       it ran past its soft time limit (retried)
    │   └── JobCancelled            an operator cancelled it (not retried)
    └── HandlerDecision             raised by a handler to state what should happen next
        ├── Retry                   retry later (optionally after ``delay_s``)
        └── Fatal                   do not retry; move the job to the dead letter queue

Driver errors (``sqlite3.Error`` and friends) are wrapped at the backend edge, chained with
``from exc``, so callers never need to import a database driver to handle a jobguard condition.
"""

from __future__ import annotations


class JobGuardError(Exception):
    """Root of every error raised by jobguard."""


class ConfigurationError(JobGuardError):
    """A task, app or worker was configured with options that cannot work."""


class SchemaVersionError(ConfigurationError):
    """The store's schema is older or newer than this jobguard; the message says what to run."""


class StepError(ConfigurationError):
    """A step was misused: its name reused in one execution, or a result that would not come
    back exactly on a retry. Raised in the handler; the job is buried at once (every rerun would
    repeat it)."""


class EnqueueError(JobGuardError):
    """A job was refused at enqueue time; nothing was stored."""


class PayloadError(EnqueueError):
    """The job's arguments are not a JSON object of acceptable size."""


class KeyTemplateError(EnqueueError):
    """An operation or resource key could not be built from stable job arguments."""


class UnknownTaskError(EnqueueError):
    """No task with this name is registered on the app."""


class NotFoundError(JobGuardError):
    """The requested job, dead job or operation does not exist."""


class JobStateError(JobGuardError):
    """The job is not in a state the operator action applies to (retry-now of a running or
    finished job); nothing was changed, and the message says what to do instead."""


class DuplicateJobError(JobGuardError):
    """The action would leave two live jobs holding one dedup key (G6, G6.1)."""


class StoreUnavailableError(JobGuardError):
    """The backing store could not be reached or stayed locked past its timeout."""


class StoreBrokenError(StoreUnavailableError):
    """The store cannot be used as it is: read-only, or its file deleted or replaced.

    A worker stops on it instead of retrying, and says why.
    """


class StepSQLError(JobGuardError):
    """A statement of a ``ctx.db_step()`` function failed; the driver's error is ``__cause__``.

    The step's own SQL failed (a constraint, a syntax error, a statement that would end the
    step's transaction); a connection or server failing under the step is a
    :class:`StoreUnavailableError` instead, which is always retried. Nothing of the step
    committed. Raised the same way on every SQL backend, so a handler never
    imports a database driver to recognise it.
    """


class GuardLost(JobGuardError):
    """This worker no longer owns the delivery; the store refused its write."""


class LeaseLostError(GuardLost):
    """The lease token is stale: the job was redelivered, released or finished by someone else."""


class StaleFenceError(GuardLost):
    """A newer lock holder exists for the resource; writes with the older fence are refused."""


class LockBusyError(JobGuardError):
    """The resource lock is held by another live owner."""

    def __init__(self, resource: str) -> None:
        super().__init__(f"resource is busy: {resource}")
        self.resource = resource


class WorkerFailedError(JobGuardError):
    """The worker stopped taking work because a part it relies on (the heartbeat) failed."""


class JobFinishedError(JobStateError):
    """The job already completed or is dead: there is nothing left to cancel."""


class RunStopped(JobGuardError):
    """The run was told to stop; ``ctx.step`` and ``ctx.db_step`` raise it from then on.

    A handler need not catch it: letting it propagate ends the attempt as the stop says.
    """


class TimeLimitExceeded(RunStopped):
    """The run passed its soft time limit: the attempt is recorded as ``timed_out`` and the
    job retried as a transient failure (its recorded steps are kept)."""


class HardTimeLimitExceeded(TimeLimitExceeded):
    """The run passed its hard time limit and its process was killed (process mode): the
    attempt is recorded as ``timed_out`` with this error, and the job retried as a transient
    failure or buried by the task's rules, as for a soft limit."""


class JobCancelled(RunStopped):
    """An operator cancelled the job: the attempt ends and the job is buried as ``cancelled``,
    not retried (it can be replayed like any dead job)."""


class HandlerDecision(JobGuardError):
    """Base for exceptions a handler raises to decide the job's next step explicitly."""


class Retry(HandlerDecision):
    """Ask for the job to be retried, after ``delay_s`` seconds if given (else backoff).

    Args:
        reason: Why the job should be retried; stored with the attempt.
        delay_s: Explicit delay before the next delivery; ``None`` uses the task's backoff.
    """

    def __init__(self, reason: str = "retry requested", *, delay_s: float | None = None) -> None:
        from jobguard.core.checks import optional_seconds  # the checks raise errors defined here

        super().__init__(reason)
        # A bad delay raised in a handler is a ConfigurationError: the job is buried at once,
        # saying why, instead of being stranded until its lease expires.
        self.delay_s = optional_seconds("Retry(delay_s=...)", delay_s)


class Fatal(HandlerDecision):
    """Declare the job unrecoverable: it goes to the dead letter queue without retrying."""
