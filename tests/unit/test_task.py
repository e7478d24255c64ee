"""Unit tests of task registration and enqueue validation in ``jobguard.task`` (G4.1, G6, G7).

Everything here is decided before the store is touched: ``build_spec`` does no I/O, so these
tests build specs directly and, where a test enqueues, check that a refusal stored nothing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from jobguard import App, ConfigurationError, Context, KeyTemplateError, PayloadError
from jobguard.task import CallOptions, Task, check_queue_name, encode_payload

MIB = 1024 * 1024


@pytest.fixture
def offline_app(tmp_path: Path) -> App:
    """An app whose store is never opened by the tests that use it (build_spec is pure)."""
    return App(f"sqlite:///{tmp_path / 'never-opened.db'}")


def register(app: App, **options: Any) -> Task:
    """A task ``charge(ctx, order_id, note="")`` with the given decorator options."""

    @app.task(name="tests.charge", **options)
    def charge(ctx: Context, order_id: int, note: str = "") -> None:
        """Charge an order."""

    return charge


# -- queue names --------------------------------------------------------------------------------


@pytest.mark.parametrize("queue", ["default", "mail", "Slow_2", "a-b", "q" * 64])
def test_plain_identifiers_are_valid_queue_names(queue: str) -> None:
    """: letters, digits, ``_`` and ``-``, starting with a letter."""
    assert check_queue_name(queue) == queue


@pytest.mark.parametrize(
    "queue", ["", " ", "1st", "_private", "a b", "a.b", "a/b", "q;drop", "ünï", "q" * 65]
)
def test_queue_names_that_are_not_plain_identifiers_are_refused_everywhere(
    offline_app: App, queue: str
) -> None:
    """: at registration, per call, and in per-queue settings."""
    with pytest.raises(ConfigurationError, match="plain identifier"):
        check_queue_name(queue)
    with pytest.raises(ConfigurationError):
        register(offline_app, queue=queue)
    task = register(App(offline_app.url))
    with pytest.raises(ConfigurationError):
        task.build_spec({"order_id": 1}, CallOptions(queue=queue))
    with pytest.raises(ConfigurationError):
        App(offline_app.url, queue_visibility_timeouts_s={queue: 5.0})


# -- payloads -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", [object(), {1, 2}, b"bytes", math.nan, math.inf, Path("x"), 1 + 2j]
)
def test_arguments_that_are_not_plain_json_are_refused(offline_app: App, value: object) -> None:
    """: non-JSON (and NaN/Infinity, which JSON lacks) never reach the store."""
    task = register(offline_app)
    with pytest.raises(PayloadError, match="JSON"):
        task.build_spec({"order_id": 1, "note": value}, CallOptions())


def test_payload_is_canonical_json_so_equal_arguments_give_equal_payloads() -> None:
    """G4.1: key order does not change the payload (stable across producers)."""
    assert encode_payload({"b": 1, "a": [1, {"d": 2, "c": 3}]}, MIB) == encode_payload(
        {"a": [1, {"c": 3, "d": 2}], "b": 1}, MIB
    )


def test_the_default_payload_limit_is_one_mib_inclusive(offline_app: App) -> None:
    """: exactly 1 MiB is accepted, one byte more is refused."""
    assert offline_app.max_payload_bytes == MIB
    task = register(offline_app)
    overhead = len(json.dumps({"note": "", "order_id": 1}, separators=(",", ":")))
    at_limit = "x" * (MIB - overhead)
    spec = task.build_spec({"order_id": 1, "note": at_limit}, CallOptions())
    assert len(spec.payload.encode()) == MIB
    with pytest.raises(PayloadError, match=f"limit is {MIB} bytes"):
        task.build_spec({"order_id": 1, "note": at_limit + "x"}, CallOptions())


def test_the_payload_limit_counts_utf8_bytes_not_characters(tmp_path: Path) -> None:
    """: a limit in bytes means multi-byte text fills it sooner."""
    app = App(f"sqlite:///{tmp_path / 'x.db'}", max_payload_bytes=64)
    task = register(app)
    task.build_spec({"order_id": 1, "note": "a" * 30}, CallOptions())
    with pytest.raises(PayloadError):
        task.build_spec({"order_id": 1, "note": "é" * 30}, CallOptions())  # 60 bytes of text
    with pytest.raises(ConfigurationError):
        App(app.url, max_payload_bytes=0)


def test_arguments_that_do_not_fit_the_handler_are_refused(offline_app: App) -> None:
    """: a missing or unknown argument fails at enqueue, not in a worker."""
    task = register(offline_app)
    with pytest.raises(PayloadError, match="do not match"):
        task.build_spec({}, CallOptions())
    with pytest.raises(PayloadError, match="do not match"):
        task.build_spec({"order_id": 1, "coupon": "X"}, CallOptions())


def test_a_refused_enqueue_stores_nothing(app: App) -> None:
    """: validation happens before the store is written."""
    task = register(app, operation_key="charge:{order_id}")
    with pytest.raises(PayloadError):
        task.enqueue(order_id=1, note=object())
    with pytest.raises(KeyTemplateError):
        task.enqueue(order_id=1.5)
    assert sum(app.counts().values()) == 0


# -- key templates (G4.1) -----------------------------------------------------------------------


def test_a_key_template_naming_an_argument_the_handler_lacks_fails_at_registration(
    offline_app: App,
) -> None:
    """``operation_key="order:{orderid}"`` is a typo caught when the task is defined."""
    with pytest.raises(ConfigurationError, match="orderid"):
        register(offline_app, operation_key="charge:{orderid}")
    with pytest.raises(ConfigurationError, match="orderid"):
        register(App(offline_app.url), resource_key="order:{orderid}")


def test_a_key_template_with_a_format_spec_fails_at_registration(offline_app: App) -> None:
    """G4.1: ``{order_id:05d}`` would tie the key to formatting; refused up front."""
    with pytest.raises(KeyTemplateError):
        register(offline_app, operation_key="charge:{order_id:05d}")


def test_unstable_key_parts_are_refused_at_enqueue_not_at_run_time(tmp_path: Path) -> None:
    """A float, None, list or dict argument in a key is an enqueue error."""
    app = App(f"sqlite:///{tmp_path / 'x.db'}")

    @app.task(name="tests.ship", operation_key="ship:{ref}", resource_key="box:{ref}")
    def ship(ctx: Context, ref: Any) -> None: ...

    for unstable in (1.5, None, [1], {"a": 1}):
        with pytest.raises(KeyTemplateError, match="ref"):
            ship.build_spec({"ref": unstable}, CallOptions())
    spec = ship.build_spec({"ref": 7}, CallOptions())
    assert (spec.operation_key, spec.resource_key) == ("ship:7", "box:7")


def test_a_template_over_kwargs_needing_a_missing_argument_fails_at_enqueue(
    offline_app: App,
) -> None:
    """G4.1: with ``**kwargs`` the check moves to enqueue, still before anything is stored."""

    @offline_app.task(name="tests.any", operation_key="any:{order_id}")
    def anything(ctx: Context, **kwargs: Any) -> None: ...

    with pytest.raises(KeyTemplateError, match="order_id"):
        anything.build_spec({"other": 1}, CallOptions())
    assert anything.build_spec({"order_id": 3}, CallOptions()).operation_key == "any:3"


def test_per_call_keys_replace_the_templates(offline_app: App) -> None:
    """G4.1, G6.1: ``.options(operation_key=..., dedup_key=...)`` wins over the templates."""
    task = register(offline_app, operation_key="charge:{order_id}", resource_key="o:{order_id}")
    spec = task.build_spec(
        {"order_id": 1},
        CallOptions(operation_key="manual:1", resource_key="r:1", dedup_key="click:1"),
    )
    assert (spec.operation_key, spec.resource_key, spec.dedup_key) == ("manual:1", "r:1", "click:1")
    assert spec.lock_ttl_s == task.lock_ttl_s


# -- options never clash with task arguments (the task API) ------------------------------


def test_options_never_clash_with_task_arguments_of_the_same_names(app: App) -> None:
    """A task may take ``queue``, ``priority``, ``delay_s``, ``dedup_key`` or even
    ``self`` as arguments; they go to the payload, and per-call options stay separate."""

    @app.task(name="tests.clash", queue="default")
    def clash(
        ctx: Context,
        self: int,
        queue: str,
        priority: int,
        delay_s: float,
        dedup_key: str,
        options: str,
    ) -> None: ...

    arguments = {
        "self": 1,
        "queue": "not a queue name",
        "priority": 99,
        "delay_s": 3600.0,
        "dedup_key": "d",
        "options": "o",
    }
    plain = clash.enqueue(**arguments)
    assert (plain.queue, plain.priority, plain.dedup_key) == ("default", 0, None)
    assert plain.run_at == plain.created_at
    assert json.loads(plain.payload) == arguments

    bound = clash.options(queue="other", priority=5, dedup_key="k").enqueue(**arguments)
    assert (bound.queue, bound.priority, bound.dedup_key) == ("other", 5, "k")
    assert json.loads(bound.payload) == arguments

    by_name = app.enqueue("tests.clash", arguments, priority=2)
    assert (by_name.queue, by_name.priority) == ("default", 2)
    assert json.loads(by_name.payload) == arguments


def test_per_call_priority_queue_and_delay_are_applied(offline_app: App) -> None:
    """``.options(delay_s=, priority=, queue=, dedup_window_s=)`` reach the spec."""
    task = register(offline_app, priority=1, dedup_window_s=30.0)
    spec = task.build_spec(
        {"order_id": 1}, CallOptions(delay_s=5.0, priority=7, queue="slow", dedup_window_s=60.0)
    )
    assert (spec.delay_s, spec.priority, spec.queue, spec.dedup_window_s) == (5.0, 7, "slow", 60.0)
    default = task.build_spec({"order_id": 1}, CallOptions())
    assert (default.priority, default.queue, default.dedup_window_s) == (1, "default", 30.0)


@pytest.mark.parametrize("options", [{"delay_s": -1.0}, {"dedup_window_s": -1.0}])
def test_negative_delays_and_windows_are_refused(options: dict[str, float]) -> None:
    """G6.2: a negative time is a bug in the caller, reported where the option is given."""
    with pytest.raises(ConfigurationError, match=next(iter(options))):
        CallOptions(**options)


# -- registration -------------------------------------------------------------------------------


def test_a_task_name_registered_twice_is_refused(offline_app: App) -> None:
    """Two handlers under one name would make deliveries ambiguous."""
    register(offline_app)
    with pytest.raises(ConfigurationError, match="registered twice"):
        register(offline_app)


@pytest.mark.parametrize(
    "options",
    [
        {"visibility_timeout_s": 0},
        {"lock_ttl_s": -1},
        {"max_attempts": 0},
        {"backoff_base_s": -1},
        {"poison_threshold": 1},
        {"max_defer_s": -1},
        {"dedup_window_s": -1},
    ],
)
def test_task_options_that_cannot_work_are_configuration_errors(
    offline_app: App, options: dict[str, Any]
) -> None:
    """G2, G3, G7: a zero lease, negative TTL or no attempts is refused when the task is defined."""
    with pytest.raises(ConfigurationError):
        register(offline_app, **options)


def test_a_handler_without_a_context_parameter_is_refused(offline_app: App) -> None:
    """The pipeline always passes ``ctx`` first; a handler that cannot take it is a bug."""
    with pytest.raises(ConfigurationError, match="ctx"):
        offline_app.task(name="tests.noctx")(lambda: None)


def test_the_task_visibility_timeout_falls_back_to_the_queue_setting(tmp_path: Path) -> None:
    """G2.3: a task without its own timeout takes its queue's, else the 30 s default."""
    app = App(f"sqlite:///{tmp_path / 'x.db'}", queue_visibility_timeouts_s={"slow": 300.0})
    task = register(app, queue="slow")
    assert task.build_spec({"order_id": 1}, CallOptions()).visibility_timeout_s == 300.0
    assert task.build_spec({"order_id": 1}, CallOptions(queue="fast")).visibility_timeout_s == 30.0
