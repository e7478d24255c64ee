"""The store shared by every SQL database: the guard's order of writes, written once."""
