-- Named queries used by the test harness (tests/conftest.py) to clone databases from a template.

-- name: create_database_from_template
CREATE DATABASE {database} TEMPLATE {template};

-- name: create_database
CREATE DATABASE {database};

-- name: terminate_connections
SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE datname = %(database)s AND pid <> pg_backend_pid();

-- name: drop_database
DROP DATABASE IF EXISTS {database};
