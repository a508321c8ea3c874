"""Ray Train's older AMP helpers, kept so that scripts using them run unchanged: ``accelerate``,
``prepare_optimizer`` and ``backward`` (new code is better served by ``torch.autocast`` and
``torch.amp.GradScaler`` directly). The choice ``accelerate`` makes belongs to one training
session (one worker in one attempt): a restarted worker starts with a fresh one.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch

from trainers import context as _context
from trainers.torch.devices import get_device


class _SessionAmp:
    """What ``accelerate`` chose for one training session: AMP or not, and its gradient scaler."""

    def __init__(self, amp: bool) -> None:
        self.amp = amp
        self.device_type = get_device().type
        self.scaler = torch.amp.GradScaler(self.device_type) if amp else None


# (the TrainContext of the session, its choice): a new attempt or fit() in this process has a new context.
_session: tuple[Any, _SessionAmp] | None = None


@functools.cache  # once per process
def _warn_once() -> None:
    warnings.warn(
        "trainers.torch.accelerate, prepare_optimizer and backward are kept for Ray Train scripts "
        "(Ray deprecated them); prefer torch.autocast with torch.amp.GradScaler in new code.",
        DeprecationWarning,
        stacklevel=3,
    )


def current_amp(create: bool = True) -> _SessionAmp | None:
    """This session's AMP choice; the first call without ``accelerate`` fixes it to "no AMP".

    Outside a training worker there is no session: returns None (and fixes nothing).
    """
    global _session
    current = _context._current
    if current is None:
        return None
    if _session is not None and _session[0] is current:
        return _session[1]
    if not create:
        return None
    _session = (current, _SessionAmp(amp=False))
    return _session[1]


def accelerate(amp: bool = False) -> None:
    """Turn on automatic mixed precision for this worker's training (``amp=True``).

    Call it once, at the top of the training function, before ``prepare_model``,
    ``prepare_data_loader``, ``prepare_optimizer`` and ``backward``: they follow the choice made
    here. With AMP the model's forward runs under ``torch.autocast`` on the worker's device
    (float16 on GPUs, bfloat16 on CPUs), and the loss is scaled by a ``GradScaler``.

    Raises:
        TypeError: ``amp`` is not a bool.
        RuntimeError: called outside a training function, twice, or after one of the helpers
            above already fixed the choice.
    """
    global _session
    _warn_once()
    if not isinstance(amp, bool):
        raise TypeError(f"accelerate(amp={amp!r}): amp must be True or False.")
    current = _context._current
    if current is None:
        raise RuntimeError("accelerate() works only inside train_loop_per_worker, while a trainer's fit() runs.")
    if current_amp(create=False) is not None:
        raise RuntimeError(
            "accelerate() was already called in this worker, or came after prepare_model, "
            "prepare_data_loader, prepare_optimizer or backward: call it once, before all of them."
        )
    _session = (current, _SessionAmp(amp=amp))


class _AutocastForward:
    """The model's own forward, run under ``torch.autocast`` on the worker's device.

    Pickling it (``torch.save(model)``) stores the plain forward: a loaded model is not tied to
    this worker's AMP setting.
    """

    def __init__(self, forward: Callable[..., Any], device_type: str) -> None:
        self._forward = forward
        self._device_type = device_type

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=self._device_type):
            return self._forward(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_plain, (self._forward,))


def _plain(forward: Callable[..., Any]) -> Callable[..., Any]:
    return forward


def autocast_model(model: torch.nn.Module) -> torch.nn.Module:
    """Run ``model``'s forward under autocast when this session uses AMP (prepare_model calls it)."""
    choice = current_amp()
    if choice is not None and choice.amp and not isinstance(model.forward, _AutocastForward):
        model.forward = _AutocastForward(model.forward, choice.device_type)
    return model


def _wrapped_attribute(name: str) -> Any:
    """A property that reads and writes ``name`` (an attribute or method) of the wrapped ``self.optimizer``."""
    return property(
        lambda self: getattr(self.optimizer, name), lambda self, value: setattr(self.optimizer, name, value)
    )


class _ScaledOptimizer(torch.optim.Optimizer):
    """An optimizer whose ``step`` goes through this session's ``GradScaler`` (when AMP is on).

    Everything else (``param_groups``, ``state``, ``state_dict``, ``zero_grad``, ...) is the
    wrapped optimizer's, so LR schedulers and checkpoints see the original.
    """

    # Deliberately no super().__init__: all state lives in the wrapped optimizer.
    def __init__(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None) -> None:
        self.optimizer = optimizer
        self.scaler = scaler

    state = _wrapped_attribute("state")
    param_groups = _wrapped_attribute("param_groups")
    defaults = _wrapped_attribute("defaults")
    add_param_group = _wrapped_attribute("add_param_group")
    load_state_dict = _wrapped_attribute("load_state_dict")
    state_dict = _wrapped_attribute("state_dict")
    zero_grad = _wrapped_attribute("zero_grad")

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        if self.scaler is None:
            return self.optimizer.step(closure)
        # The scaler unscales the gradients, skips the step when they overflowed, then adapts the scale.
        result = self.scaler.step(self.optimizer, closure) if closure is not None else self.scaler.step(self.optimizer)
        self.scaler.update()
        return result

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.optimizer!r}, amp={self.scaler is not None})"


def prepare_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that, after ``accelerate(amp=True)``, its step unscales the gradients.

    Use the returned optimizer in place of yours; without AMP it steps exactly as yours does.
    """
    _warn_once()
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"prepare_optimizer(optimizer={optimizer!r}): pass a torch.optim.Optimizer.")
    choice = current_amp()
    return _ScaledOptimizer(optimizer, choice.scaler if choice is not None else None)


def backward(tensor: torch.Tensor) -> None:
    """Back-propagate ``tensor`` (the loss); after ``accelerate(amp=True)`` it is scaled first.

    Use it in place of ``loss.backward()`` together with ``prepare_optimizer``.
    """
    _warn_once()
    choice = current_amp()
    if choice is not None and choice.scaler is not None:
        choice.scaler.scale(tensor).backward()
    else:
        tensor.backward()


__all__ = ["accelerate", "backward", "prepare_optimizer"]
