"""PyTorch/XLA on flowtrain: ``TorchXLAConfig``, as in ``ray.train.torch.xla``.

``TorchTrainer(..., torch_config=TorchXLAConfig())`` joins the workers in an ``xla`` process
group (AWS Trainium/Inferentia ``neuron_cores``, as Ray Train supports). Needs ``torch_xla``
(``TorchXLAMissingError``, an ``ImportError``, says what to install when it is missing).
"""

from trainers.torch.xla.config import TorchXLABackend, TorchXLAConfig, TorchXLAMissingError

__all__ = ["TorchXLABackend", "TorchXLAConfig", "TorchXLAMissingError"]
