"""Loading torch_renaissance's compiled extension (``torch_renaissance._C``).

Every module that needs the extension calls :func:`extension` (never imports
``_C`` at module level), so that importing the package works, and says what to
do, when the extension was not built.
"""
from __future__ import annotations

from types import ModuleType


def extension() -> ModuleType:
    """The compiled extension ``torch_renaissance._C``.

    Raises:
        ImportError: it was not built; the message says how to build it.
    """
    try:
        from torch_renaissance import _C
    except ImportError as e:  # pragma: no cover - exercised only on broken installs
        raise ImportError(
            "torch_renaissance's compiled extension is missing: build it with "
            "`pip install --no-build-isolation .` (or `make build`)") from e
    return _C
