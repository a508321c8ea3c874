"""Side-by-side benchmarks: flowtrain vs ray.train vs raw torch.distributed (see README.md here)."""
