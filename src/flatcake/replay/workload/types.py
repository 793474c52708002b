"""Small shared type aliases of the replay package."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

IdArray = npt.NDArray[np.int32]
"""Dense block ids (``int32``), one request's blocks in prefix order."""

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
AnyArray = npt.NDArray[Any]
