"""Prefect flows that wire flowtrain's tasks into pipelines (ingest -> train -> checkpoints).

Flows only wire: parameters (pydantic models) in, tasks called, a small summary out. They never
import ray; everything Ray happens inside the tasks.
"""
