"""Guard the tasks of other queues (Celery, RQ, Dramatiq) with jobguard: see docs/hosts/."""
