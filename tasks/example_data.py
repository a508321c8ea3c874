"""Example data that ships inside an installed package: scikit-learn's breast cancer set as parquet.

    python -m tasks.example_data [folder]     # default ~/flowtrain_data/breast_cancer

writes ``train.parquet`` and ``valid.parquet`` (a seeded, stratified 80/20 split; 30 float
features and an integer ``target``), the files the demo and the example deployments train on.
No download: the rows come from the scikit-learn wheel.
"""

from __future__ import annotations

import os
import sys

DEFAULT_FOLDER = "~/flowtrain_data/breast_cancer"
LABEL = "target"


def write_breast_cancer(folder: str = DEFAULT_FOLDER, *, valid_fraction: float = 0.2, seed: int = 0) -> dict[str, str]:
    """Write the train and valid parquet files into ``folder``; return ``{"train": path, "valid": path}``."""
    try:
        from sklearn.datasets import load_breast_cancer
    except ImportError:
        raise ImportError("the example data comes from scikit-learn: pip install scikit-learn") from None
    import numpy as np

    frame = load_breast_cancer(as_frame=True).frame
    frame.columns = [str(c).replace(" ", "_") for c in frame.columns]  # plain names for --param and SQL-ish tools
    rng = np.random.default_rng(seed)
    valid_rows = []
    for _, group in frame.groupby(LABEL):  # stratified: both splits keep the class balance
        picked = rng.permutation(group.index.to_numpy())[: round(len(group) * valid_fraction)]
        valid_rows.extend(picked.tolist())
    valid = frame.loc[sorted(valid_rows)]
    train = frame.drop(index=valid.index)
    folder = os.path.abspath(os.path.expanduser(folder))
    os.makedirs(folder, exist_ok=True)
    paths = {"train": os.path.join(folder, "train.parquet"), "valid": os.path.join(folder, "valid.parquet")}
    train.reset_index(drop=True).to_parquet(paths["train"])
    valid.reset_index(drop=True).to_parquet(paths["valid"])
    return paths


if __name__ == "__main__":
    written = write_breast_cancer(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_FOLDER)
    for name, path in written.items():
        print(f"{name}: {path}")
