"""normalize_pandas_for_lightgbm: make a Ray Data shard's pandas frame acceptable to LightGBM."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa


def _nullable_dtype(arrow_type: pa.DataType) -> str | None:
    """The pandas nullable dtype for a numeric or boolean Arrow type, else None."""
    import pyarrow as pa

    if pa.types.is_boolean(arrow_type):
        return "boolean"
    if pa.types.is_floating(arrow_type):
        return f"Float{arrow_type.bit_width}"
    if pa.types.is_signed_integer(arrow_type):
        return f"Int{arrow_type.bit_width}"
    if pa.types.is_unsigned_integer(arrow_type):
        return f"UInt{arrow_type.bit_width}"
    return None


def normalize_pandas_for_lightgbm(df: pd.DataFrame) -> pd.DataFrame:
    """Return ``df`` with its Arrow-backed numeric and boolean columns turned into pandas'
    nullable NumPy dtypes (``int64[pyarrow]`` -> ``Int64``, ``bool[pyarrow]`` -> ``boolean``).

    ``Dataset.to_pandas()`` of Arrow data gives Arrow-backed columns, which ``lightgbm.Dataset``
    refuses; call this on the frame first. Columns that are already NumPy-backed are not
    copied, and other Arrow columns (strings, dates) are left as they are.
    """
    import pandas as pd

    arrow = {column: dtype.pyarrow_dtype for column, dtype in df.dtypes.items() if isinstance(dtype, pd.ArrowDtype)}
    targets = {column: target for column, type_ in arrow.items() if (target := _nullable_dtype(type_)) is not None}
    return df.astype(targets) if targets else df  # copy-on-write (pandas 3): the other columns are not copied
