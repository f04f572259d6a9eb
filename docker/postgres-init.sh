#!/bin/bash
# Run once by the postgres image's entrypoint (/docker-entrypoint-initdb.d), on an empty data volume:
# Airflow's metadata database and tidewater's lock database (TIDEWATER_POSTGRES_DSN), each owned by a
# role of its own with the password docker-compose.yml passes in. The databases' owners may create
# tables in them (Airflow's schema, tidewater_locks); nothing else is granted.
set -e
: "${AIRFLOW_DB_PASSWORD:?set AIRFLOW_DB_PASSWORD}" "${LOCKS_DB_PASSWORD:?set LOCKS_DB_PASSWORD}"
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
  -v airflow_password="$AIRFLOW_DB_PASSWORD" -v locks_password="$LOCKS_DB_PASSWORD" <<'SQL'
CREATE ROLE airflow LOGIN PASSWORD :'airflow_password';
CREATE DATABASE airflow OWNER airflow;
CREATE ROLE tidewater LOGIN PASSWORD :'locks_password';
CREATE DATABASE tidewater OWNER tidewater;
SQL
