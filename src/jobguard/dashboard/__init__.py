"""``jobguard dashboard``: a server-rendered web view of the store (Starlette + Jinja2).

Pages: the overview (queues, throughput and failures), jobs with filters and each job's attempt
timeline, the operation ledger, the dead letter queue with replay and purge, the doctor's
findings drawn, and the audit trail. Charts are inline SVG; there is no JavaScript at all.
Needs the ``dashboard`` extra. See ``docs/dashboard.md``.
"""
