"""The pytest plugin of jobguard (registered through the ``pytest11`` entry point).

Installing jobguard is enough for these fixtures to exist in any test session:

``jobguard_store``
    A temporary, empty store (:class:`~jobguard.testing.TemporaryStore`) on a controlled
    clock: a SQLite file in the test's directory, or, with ``--jobguard-store=postgresql://…``
    (or the ``jobguard_store`` ini option), a schema of its own in that database, dropped
    afterwards. Build the app under test on it: ``App(backend=jobguard_store.backend)``.
``jobguard_clock``
    That store's :class:`~jobguard.testing.ControlledClock`.
``jobguard_faults``
    A function ``jobguard_faults(app)`` giving :class:`~jobguard.faults.Faults` for the app:
    ``run_until_idle()`` and each fault around the app's own handlers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from jobguard.testing import ControlledClock, TemporaryStore

if TYPE_CHECKING:
    from jobguard.app import App
    from jobguard.faults import Faults


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--jobguard-store``: ``sqlite`` (default) or a PostgreSQL database URL."""
    group = parser.getgroup("jobguard")
    group.addoption(
        "--jobguard-store",
        dest="jobguard_store",
        default=None,
        help="store of the jobguard_store fixture: sqlite (default) or a postgresql:// URL",
    )
    parser.addini("jobguard_store", "store of the jobguard_store fixture", default="sqlite")


@pytest.fixture
def jobguard_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TemporaryStore]:
    """A fresh store for this test on a controlled clock (see the module's description)."""
    where = request.config.getoption("jobguard_store") or request.config.getini("jobguard_store")
    store = TemporaryStore.create(str(where), tmp_path)
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def jobguard_clock(jobguard_store: TemporaryStore) -> ControlledClock:
    """The store clock of :func:`jobguard_store` (advance it to expire leases and locks)."""
    return jobguard_store.clock


@pytest.fixture
def jobguard_faults(jobguard_store: TemporaryStore) -> Callable[[App], Faults]:
    """``jobguard_faults(app)``: fault injection around the handlers of ``app``."""
    from jobguard.faults import Faults

    def for_app(app: App) -> Faults:
        return Faults(app, jobguard_store.clock)

    return for_app
