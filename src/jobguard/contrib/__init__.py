"""Integrations with web frameworks and ORMs; each needs its extra (``jobguard[sqlalchemy]``...)."""
