"""Per-call enqueue options are validated, never silently dropped (G6.1)."""

from __future__ import annotations

import pytest

from jobguard import App, Context, KeyTemplateError


@pytest.mark.parametrize("option", ["dedup_key", "operation_key", "resource_key"])
def test_an_empty_per_call_key_is_refused_instead_of_ignored(app: App, option: str) -> None:
    """An empty key would silently turn dedup or idempotency off; it must be an error."""

    @app.task()
    def charge(ctx: Context, order_id: int) -> None: ...

    with pytest.raises(KeyTemplateError):
        charge.options(**{option: ""}).enqueue(order_id=1)
    assert app.jobs() == []
