"""Structured logs: ``jobguard worker --log-json`` prints one JSON line per attempt event."""

from __future__ import annotations

import json
import os
import subprocess

from tests.observability.conftest import APP
from tests.support.observed_app import make_app
from tests.support.procs import REPO_ROOT, clean_env, entry_point


def test_every_attempt_is_one_json_line_with_the_attempt_logs_fields(store_url: str) -> None:
    producer = make_app(store_url)
    for n in range(7):  # n=0, 3: a retry each; n=6: fatal
        producer.enqueue("flaky", {"n": n})
    env = clean_env()
    env["OBSERVED_APP_URL"] = store_url
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run(
        [*entry_point(), "--app", APP, "worker", "--burst", "--log-json", "--worker-id", "w1"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    events = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    ended = {(e["job_id"], e["attempt"]): e for e in events if e["event"] == "attempt.ended"}
    started = {(e["job_id"], e["attempt"]) for e in events if e["event"] == "attempt.started"}

    rows = producer.attempts(limit=1000)
    producer.close()
    # --burst may stop before a retry's backoff is over: compare with what the log holds.
    assert len(rows) == len(ended) == len(started) >= 7
    for row in rows:
        event = ended[(row.job_id, row.attempt)]
        for name in ("task", "queue", "operation_key", "worker_id", "lease_token", "lock_owner",
                     "fence", "outcome", "steps_run", "steps_skipped", "error_type"):  # fmt: skip
            assert event[name] == getattr(row, name), name
    assert {e["outcome"] for e in ended.values()} >= {"completed", "retry", "dead"}
