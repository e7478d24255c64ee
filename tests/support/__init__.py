"""Shared test support: real worker processes and the apps they run."""
