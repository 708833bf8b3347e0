"""Postgres (design §1, §4, §12): connections, the embedded server, named queries, migrations,
the publication and the advisory locks.
"""
