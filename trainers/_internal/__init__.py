"""Trainer internals: worker actors, the worker group, the controller. Not a public API."""
