"""PyTorch/XLA on flowtrain: ``TorchXLAConfig``, as in ``ray.train.torch.xla``.

``TorchTrainer(..., torch_config=TorchXLAConfig())`` joins the workers in an ``xla`` process
group (AWS Trainium/Inferentia ``neuron_cores``, as Ray Train supports). Needs ``torch_xla``.
"""

from trainers.torch.xla.config import TorchXLABackend, TorchXLAConfig

__all__ = ["TorchXLABackend", "TorchXLAConfig"]
