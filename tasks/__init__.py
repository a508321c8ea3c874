"""Prefect tasks, one pipeline stage each (ingest, train, checkpoints), with retries and artifacts.

Tasks run in the driver process; training workers never touch Prefect.
"""
