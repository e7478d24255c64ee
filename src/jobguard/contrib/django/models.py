"""No Django models: jobguard's tables are its own schema, made by its migrations.

The module exists so Django sends this app ``post_migrate`` (apps.py migrates the store then).
"""
