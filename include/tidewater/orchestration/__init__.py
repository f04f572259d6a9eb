"""Airflow-facing orchestration: the local Airflow deployment, stream supervision, DAG task bodies."""
