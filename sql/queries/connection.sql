-- Session settings kb pins on every connection it opens (kb/db/database.py configure_connection,
-- design §13), so PGOPTIONS, ALTER ROLE … SET and ALTER DATABASE … SET cannot change kb's behaviour.

-- name: configure_session
-- search_path: the job queue's schema (Procrastinate's unqualified names), then pgvector's schema
-- when the extension lives elsewhere (its type and operators). is_local = %(local)s: this
-- transaction only.
SELECT set_config('search_path', concat_ws(', ', quote_ident(%(job_schema)s), (
           SELECT quote_ident(n.nspname) FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
           WHERE e.extname = 'vector' AND n.nspname <> %(job_schema)s)), %(local)s) AS search_path,
       set_config('TimeZone', 'UTC', %(local)s) AS time_zone,
       set_config('DateStyle', 'ISO, MDY', %(local)s) AS date_style,
       set_config('IntervalStyle', 'postgres', %(local)s) AS interval_style,
       set_config('default_transaction_isolation', 'read committed', %(local)s) AS isolation,
       set_config('default_transaction_read_only', 'off', %(local)s) AS read_only,
       set_config('statement_timeout', '0', %(local)s) AS statement_timeout,
       set_config('lock_timeout', '0', %(local)s) AS lock_timeout,
       set_config('idle_in_transaction_session_timeout', '0', %(local)s) AS idle_timeout,
       -- Postgres 17+ only (NULL before): the index lock's transaction lasts a whole index run.
       (SELECT set_config('transaction_timeout', '0', %(local)s) FROM pg_settings
        WHERE name = 'transaction_timeout') AS transaction_timeout;
