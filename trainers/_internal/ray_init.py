"""Connect to Ray: the cluster in RAY_ADDRESS, the one already connected, or a new local one."""

from __future__ import annotations

import os

import ray

#: What to do when a cluster refuses this process for its token (Ray 2.60's token authentication).
AUTH_FIX = (
    "copy the head node's ~/.ray/auth_token to this machine (~/.ray/auth_token, or any file named by "
    "RAY_AUTH_TOKEN_PATH) and set RAY_AUTH_MODE=token, here and for every Prefect worker whose runs join the cluster"
)


def ensure_ray() -> None:
    """Start or join Ray unless this process is already connected.

    A cluster that refuses this process for want of its token raises Ray's ``ConnectionError``
    with the fix added (Ray's own says only that it failed to connect).
    """
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = os.environ.get("RAY_ADDRESS") or None
    try:
        ray.init(address=address, log_to_driver=True, include_dashboard=False if address is None else None)
    except ConnectionError as error:
        if not is_auth_failure(error):
            raise
        raise ConnectionError(
            f"{error}: the cluster wants its authentication token, and this process sent none or another one. "
            f"To fix: {AUTH_FIX}. `python -m trainers.doctor` checks this and more."
        ) from error
    from trainers._internal.worker_output import install

    install()  # worker lines of runs whose output a caller captures go to it, not the terminal


def is_auth_failure(error: BaseException) -> bool:
    """Whether joining a cluster failed because it wants a token this process did not send or got
    wrong: Ray's ``AuthenticationError`` itself, or the ``ConnectionError`` Ray 2.60 raises around
    the GCS's refusal (its cause's text carries the refusal)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ray.exceptions.AuthenticationError):
            return True
        text = str(seen)
        if "Authentication token is missing or incorrect" in text or "AuthenticationError" in text:
            return True
        seen = seen.__cause__ or seen.__context__
    return False
