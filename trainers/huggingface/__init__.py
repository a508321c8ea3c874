"""Hugging Face integrations: ``trainers.huggingface.transformers`` (as ``ray.train.huggingface.transformers``)."""
