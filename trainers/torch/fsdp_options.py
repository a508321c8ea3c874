"""``prepare_model(parallel_strategy="fsdp", parallel_strategy_kwargs=...)``: FSDP1-style options on FSDP2.

Ray Train wraps the model in torch's ``FullyShardedDataParallel`` (FSDP1), so its users pass that
class's arguments. flowtrain shards with ``fully_shard`` (FSDP2, which also runs on CPU over gloo).
Each FSDP1 argument is translated here to what FSDP2 does with the same intent; an argument (or
value) FSDP2 cannot honour is refused with a message naming it and what to do instead, rather
than silently ignored. ``fully_shard``'s own keyword arguments are accepted as they are.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

#: fully_shard's own keyword arguments, passed through unchanged.
FSDP2_KWARGS = ("mesh", "reshard_after_forward", "shard_placement_fn", "mp_policy", "offload_policy", "ignored_params")
#: FullyShardedDataParallel's (FSDP1) keyword arguments that are translated.
FSDP1_KWARGS = (
    "process_group",
    "sharding_strategy",
    "cpu_offload",
    "auto_wrap_policy",
    "backward_prefetch",
    "mixed_precision",
    "ignored_modules",
    "param_init_fn",
    "device_id",
    "sync_module_states",
    "forward_prefetch",
    "limit_all_gathers",
    "use_orig_params",
    "ignored_states",
    "device_mesh",
)
# Arguments that set the same thing (an FSDP1 one and an FSDP2 one, or two FSDP1 ones): giving both is ambiguous.
_SAME_SETTING = (
    ("process_group", "mesh"),
    ("device_mesh", "mesh"),
    ("process_group", "device_mesh"),
    ("sharding_strategy", "reshard_after_forward"),
    ("cpu_offload", "offload_policy"),
    ("mixed_precision", "mp_policy"),
    ("ignored_modules", "ignored_params"),
    ("ignored_states", "ignored_params"),
)


@dataclasses.dataclass
class FSDPPlan:
    """How ``prepare_model`` shards a model: ``fully_shard``'s arguments and the steps around it."""

    #: Keyword arguments for every ``fully_shard`` call.
    fully_shard_kwargs: dict[str, Any]
    #: FSDP1-style policy: called as ``policy(module=m, recurse=False, nonwrapped_numel=n)``;
    #: True gives submodule ``m`` its own ``fully_shard`` (the root always gets one).
    auto_wrap_policy: Callable[..., bool] | None = None
    #: Copy rank 0's parameters and buffers to every rank before sharding.
    sync_module_states: bool = False
    #: Prefetch the next sharded module's parameters during the forward pass.
    forward_prefetch: bool = False
    #: FSDP1's sharding strategy when it needs a 2-D (replicate, shard) mesh: "NO_SHARD",
    #: "HYBRID_SHARD" or "_HYBRID_SHARD_ZERO2"; the mesh is built on the workers.
    hybrid: str | None = None


def _error(name: str, value: Any, why: str) -> ValueError:
    return ValueError(
        f"prepare_model(parallel_strategy='fsdp', parallel_strategy_kwargs={{{name!r}: {value!r}}}): {why}"
    )


def _enum_name(name: str, value: Any, enum: type[Enum]) -> str:
    """The member name of an FSDP1 enum given as the enum or as its name."""
    if isinstance(value, enum):
        return value.name
    if isinstance(value, str) and value in enum.__members__:
        return value
    raise _error(name, value, f"must be one of {', '.join(enum.__name__ + '.' + m for m in enum.__members__)}.")


def plan_fsdp(kwargs: dict[str, Any], device: torch.device) -> FSDPPlan:
    """Translate ``parallel_strategy_kwargs`` for ``parallel_strategy="fsdp"`` into an :class:`FSDPPlan`.

    Raises ``ValueError`` naming any argument that is unknown, conflicts with another, or has
    no FSDP2 equivalent (with what to do instead). Runs before the model is touched.
    """
    from torch.distributed.fsdp import BackwardPrefetch, CPUOffloadPolicy, MixedPrecisionPolicy, ShardingStrategy

    unknown = sorted(set(kwargs) - set(FSDP2_KWARGS) - set(FSDP1_KWARGS))
    if unknown:
        raise ValueError(
            f"prepare_model(parallel_strategy='fsdp'): unknown parallel_strategy_kwargs {', '.join(map(repr, unknown))}. "
            f"Accepted: fully_shard's {', '.join(FSDP2_KWARGS)}, or FullyShardedDataParallel's "
            f"{', '.join(FSDP1_KWARGS)}."
        )
    for old, new in _SAME_SETTING:
        if old in kwargs and new in kwargs:
            raise _error(old, kwargs[old], f"sets the same thing as {new!r}, which is also given: pass one of them.")

    plan = FSDPPlan({name: kwargs[name] for name in FSDP2_KWARGS if name in kwargs})
    shard = plan.fully_shard_kwargs

    group = kwargs.get("process_group")
    if group is not None:
        if isinstance(group, tuple):
            raise _error(
                "process_group",
                group,
                "a (intra-node, inter-node) pair of groups has no fully_shard form: pass "
                "device_mesh=init_device_mesh(device_type, (num_replicas, shard_size), "
                "mesh_dim_names=('replicate', 'shard')) instead.",
            )
        from torch.distributed.device_mesh import DeviceMesh

        shard["mesh"] = DeviceMesh.from_group(group, device.type)
    if kwargs.get("device_mesh") is not None:
        shard["mesh"] = kwargs["device_mesh"]

    if kwargs.get("sharding_strategy") is not None:
        strategy = _enum_name("sharding_strategy", kwargs["sharding_strategy"], ShardingStrategy)
        # FULL_SHARD frees gathered parameters after forward; SHARD_GRAD_OP keeps them until backward.
        shard["reshard_after_forward"] = strategy not in ("SHARD_GRAD_OP", "_HYBRID_SHARD_ZERO2")
        if strategy in ("NO_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
            mesh = shard.get("mesh")
            if mesh is not None and mesh.ndim != 2:
                raise _error(
                    "sharding_strategy",
                    kwargs["sharding_strategy"],
                    "needs a 2-D (replicate, shard) device_mesh; the mesh given has "
                    f"{mesh.ndim} dimension(s). Pass a 2-D device_mesh or leave it out.",
                )
            if mesh is None:
                plan.hybrid = strategy

    if getattr(kwargs.get("cpu_offload"), "offload_params", False):
        shard["offload_policy"] = CPUOffloadPolicy(pin_memory=device.type == "cuda")

    precision = kwargs.get("mixed_precision")
    if precision is not None:
        if precision.buffer_dtype is not None:
            raise _error(
                "mixed_precision",
                precision,
                "buffer_dtype has no FSDP2 equivalent (fully_shard leaves buffers alone): cast the "
                "buffers yourself, e.g. model.my_buffer = model.my_buffer.to(dtype), and leave buffer_dtype unset.",
            )
        if precision.keep_low_precision_grads:
            raise _error(
                "mixed_precision",
                precision,
                "keep_low_precision_grads=True has no FSDP2 equivalent: gradients are reduced in "
                "reduce_dtype and kept in the parameters' dtype. Leave it False.",
            )
        shard["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=precision.param_dtype,
            reduce_dtype=precision.reduce_dtype,
            cast_forward_inputs=precision.cast_forward_inputs or precision.cast_root_forward_inputs,
        )

    ignored = [m for key in ("ignored_modules", "ignored_states") for m in (kwargs.get(key) or ())]
    if ignored:
        shard["ignored_params"] = {
            p for item in ignored for p in (item.parameters() if isinstance(item, torch.nn.Module) else [item])
        }

    if kwargs.get("param_init_fn") is not None:
        raise _error(
            "param_init_fn",
            kwargs["param_init_fn"],
            "fully_shard has no init hook: build the model on the meta device, call prepare_model, "
            "then model.to_empty(device=trainers.torch.get_device()) and initialise the parameters yourself.",
        )
    device_id = kwargs.get("device_id")
    if device_id is not None:
        wanted = torch.device(device.type, device_id) if isinstance(device_id, int) else torch.device(device_id)
        if wanted.type != device.type or (
            wanted.index is not None and device.index is not None and wanted.index != device.index
        ):
            raise _error(
                "device_id",
                device_id,
                f"this worker trains on {device}; prepare_model moves the model there itself. Leave device_id out.",
            )
    prefetch = kwargs.get("backward_prefetch", BackwardPrefetch.BACKWARD_PRE)
    if prefetch is None or _enum_name("backward_prefetch", prefetch, BackwardPrefetch) != "BACKWARD_PRE":
        raise _error(
            "backward_prefetch",
            prefetch,
            "FSDP2 always prefetches the next module's parameters before the current gradient "
            "computation (BackwardPrefetch.BACKWARD_PRE); other choices have no equivalent. Leave it out.",
        )
    # FSDP1 switches whose only FSDP2 value is their default, True.
    for name, why in (
        ("limit_all_gathers", "FSDP2 always bounds the memory of in-flight all-gathers; it cannot be turned off."),
        ("use_orig_params", "FSDP2 always exposes the original parameters (as DTensor shards), never flat ones."),
    ):
        if kwargs.get(name, True) is not True:
            raise _error(name, kwargs[name], f"{why} Leave it out.")
    policy = kwargs.get("auto_wrap_policy")
    if policy is not None and not callable(policy) and not hasattr(policy, "_run_policy"):
        raise _error(
            "auto_wrap_policy",
            policy,
            "must be an FSDP1 wrap policy: a function policy(module, recurse, nonwrapped_numel) -> bool, "
            "or a torch.distributed.fsdp.wrap.ModuleWrapPolicy / CustomPolicy.",
        )
    plan.auto_wrap_policy = policy
    plan.sync_module_states = bool(kwargs.get("sync_module_states", False))
    plan.forward_prefetch = bool(kwargs.get("forward_prefetch", False))
    return plan


def _hybrid_mesh(strategy: str, device: torch.device) -> Any:
    """The 2-D (replicate, shard) mesh FSDP1's NO_SHARD and HYBRID_SHARD strategies mean."""
    from torch.distributed.device_mesh import init_device_mesh

    from trainers.context import get_context

    context = get_context()
    world, local = context.get_world_size(), context.get_local_world_size()
    if strategy == "NO_SHARD":
        shape = (world, 1)  # every rank keeps the whole model: plain data parallelism
    else:
        if world % local:
            raise ValueError(
                f"prepare_model(parallel_strategy='fsdp', sharding_strategy={strategy}): needs the same number of "
                f"workers on every node ({world} workers, {local} on this node). Pass a 2-D device_mesh instead."
            )
        shape = (world // local, local)  # shard within a node, replicate across nodes
    return init_device_mesh(device.type, shape, mesh_dim_names=("replicate", "shard"))


def apply_fsdp(model: torch.nn.Module, plan: FSDPPlan, device: torch.device) -> torch.nn.Module:
    """Shard ``model`` in place as ``plan`` says (submodules chosen by the policy first, then the root)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    kwargs = dict(plan.fully_shard_kwargs)
    if plan.hybrid is not None:
        kwargs["mesh"] = _hybrid_mesh(plan.hybrid, device)
    if plan.sync_module_states:
        with torch.no_grad():
            for tensor in [*model.parameters(), *model.buffers()]:
                dist.broadcast(tensor.data, src=0)
    sharded: list[FSDPModule] = []
    policy = plan.auto_wrap_policy
    if policy is not None and hasattr(policy, "_run_policy"):
        # FSDP1's policy objects (ModuleWrapPolicy, CustomPolicy) name their modules themselves.
        targets = policy._run_policy(model, set(), {})
        if any(extra for extra in targets.values()):
            raise ValueError(
                "prepare_model(parallel_strategy='fsdp'): the auto_wrap_policy gives some modules FSDP1 "
                "arguments of their own, which fully_shard cannot take per module; return True instead of a dict."
            )
        for module in reversed(list(model.modules())):
            if module is not model and module in targets:
                sharded.append(fully_shard(module, **kwargs))
    elif policy is not None:
        done: set[torch.nn.Parameter] = set()
        # A plain FSDP1 policy function, asked children first as FSDP1 does: a parent counts only
        # the parameters its sharded children do not already hold.
        for module in reversed(list(model.modules())):
            if module is model:
                continue
            remaining = [p for p in module.parameters() if p not in done]
            if remaining and policy(module=module, recurse=False, nonwrapped_numel=sum(p.numel() for p in remaining)):
                sharded.append(fully_shard(module, **kwargs))
                done.update(remaining)
    fully_shard(model, **kwargs)
    if plan.forward_prefetch:
        # Modules run in registration order here; each fetches the next one's shards ahead.
        for current, following in itertools.pairwise(reversed(sharded)):
            current.set_modules_to_forward_prefetch([following])
    return model
