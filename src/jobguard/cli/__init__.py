"""The ``jobguard`` command line."""
