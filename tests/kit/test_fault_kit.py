"""The pytest plugin's fault fixtures, run in real inner pytest sessions (pytester): each fault
mode FAILS a deliberately non-idempotent handler and PASSES a correctly guarded one, on SQLite
and PostgreSQL. The inner sessions find the plugin through its entry point alone."""

from __future__ import annotations

import pytest

from tests.support import pg

INNER = """
import pytest
from jobguard import App

MODE = {mode!r}
SAFE = {safe!r}


@pytest.fixture
def shop(jobguard_store, tmp_path):
    app = App(backend=jobguard_store.backend)
    outbox = tmp_path / "outbox.txt"  # an external system: a payments API, a mail server
    outbox.touch()
    table = f'"{{jobguard_store.schema}}".charges' if jobguard_store.schema else "charges"
    mark = "?" if jobguard_store.schema is None else "%s"
    with jobguard_store.connect() as conn:
        conn.execute(f"CREATE TABLE {{table}} (order_id INTEGER)")

    def call_api(order_id):
        with outbox.open("a") as out:
            out.write(f"charge {{order_id}}\\n")

    def record(conn, order_id):
        conn.execute(f"INSERT INTO {{table}} (order_id) VALUES ({{mark}})", (order_id,))
        return order_id

    keys = dict(operation_key="charge:{{order_id}}", resource_key="order:{{order_id}}")

    insert = (f"INSERT INTO {{table}} (order_id) VALUES ({{mark}})", (7,))
    if SAFE and MODE == "drop_writes":
        @app.task(name="charge", **keys)
        def charge(ctx, order_id):
            ctx.db_writes("charge", [insert])
            ctx.step("receipt", lambda: "sent")
    elif SAFE:
        @app.task(name="charge", **keys)
        def charge(ctx, order_id):
            ctx.db_step("charge", record, order_id)
            ctx.step("receipt", lambda: "sent")
    elif MODE == "drop_writes":
        @app.task(name="charge", **keys)
        def charge(ctx, order_id):
            call_api(order_id)  # before the step, outside its transaction: a retry repeats it
            ctx.db_writes("charge", [insert])
    elif MODE in ("twice", "redeliver"):
        @app.task(name="charge")  # no operation key: every delivery charges again
        def charge(ctx, order_id):
            call_api(order_id)
    elif MODE == "crash":
        @app.task(name="charge", **keys)
        def charge(ctx, order_id):
            call_api(order_id)  # not a step: a rerun after the crash repeats it
            ctx.step("receipt", lambda: "sent")
    elif MODE == "lease":
        @app.task(name="charge", **keys)
        def charge(ctx, order_id):
            ctx.step("quote", lambda: 10)
            call_api(order_id)  # unguarded: a stale delivery still calls it
    else:
        @app.task(name="charge", **keys)
        def charge(ctx, order_id):
            # the effect leaves the step's transaction: a rolled-back step has still charged
            ctx.db_step("charge", lambda conn, oid: call_api(oid) or oid, order_id)

    def effects():
        with jobguard_store.connect() as conn:
            rows = conn.execute(f"SELECT count(*) FROM {{table}}").fetchone()[0]
        return rows + len(outbox.read_text().splitlines())

    yield app, charge, effects
    app.close()


def test_charge_is_duplicate_safe(shop, jobguard_faults):
    app, charge, effects = shop
    faults = jobguard_faults(app)
    if MODE == "crash":
        faults.crash_after_step(charge, {{"order_id": 7}}, step=1, effects=effects)
    elif MODE == "twice":
        faults.run_twice_concurrently(charge, {{"order_id": 7}}, effects=effects)
    elif MODE == "lease":
        faults.lease_expires_mid_handler(charge, {{"order_id": 7}}, after_step=1, effects=effects)
    elif MODE == "redeliver":
        faults.redeliver_after_completion(charge, {{"order_id": 7}}, effects=effects)
    elif MODE == "drop_writes":
        faults.drop_connection_in_db_writes(charge, {{"order_id": 7}}, step=1, effects=effects)
    else:
        faults.drop_connection_in_db_step(charge, {{"order_id": 7}}, step=1, effects=effects)
"""

MODES = ("crash", "twice", "lease", "redeliver", "drop", "drop_writes")
# Other plugins installed beside jobguard's that the inner sessions have no use for: loading
# them (hypothesis above all) is most of an inner session's start-up. jobguard's own plugin is
# still found through its entry point alone.
UNUSED_PLUGINS = ("-p", "no:hypothesispytest", "-p", "no:anyio")


@pytest.fixture(params=["sqlite", "postgres"])
def kit_store(request: pytest.FixtureRequest) -> str:
    return "sqlite" if request.param == "sqlite" else pg.session_database()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("safe", [True, False], ids=["guarded", "unguarded"])
def test_each_fault_fails_an_unguarded_handler_and_passes_a_guarded_one(
    pytester: pytest.Pytester, kit_store: str, mode: str, safe: bool
) -> None:
    pytester.makepyfile(test_shop=INNER.format(mode=mode, safe=safe))
    result = pytester.runpytest_subprocess(
        f"--jobguard-store={kit_store}", "-p", "no:cacheprovider", *UNUSED_PLUGINS
    )
    if safe:
        result.assert_outcomes(passed=1)
    else:
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(["*DuplicateEffects*one run's are 1*"])
