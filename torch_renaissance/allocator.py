"""The old home of installation and configuration, kept so that existing
imports keep working (``from torch_renaissance.allocator import install``).

Its contents moved, one concept per module:

* :mod:`torch_renaissance.config` - the configuration keys (one table with
  C++), ``TORCH_RENAISSANCE_CONF``, :class:`Config`, :func:`make_config`,
  :func:`parse_conf`;
* :mod:`torch_renaissance.installer` - :func:`install`, the installed
  configuration and the arena of a device;
* :mod:`torch_renaissance.extension` - loading the compiled extension.
"""
from __future__ import annotations

from torch_renaissance.config import (  # noqa: F401
    BOOL_WORDS,
    ENV_VAR,
    Config,
    keys,
    make_config,
    parse_conf,
)
from torch_renaissance.extension import extension  # noqa: F401
from torch_renaissance.installer import (  # noqa: F401
    _installed,
    active_arena,
    get_arena,
    install,
    installed_config,
    installed_device,
    is_installed,
    resolve_device,
)

_BOOL = BOOL_WORDS  # old private name
_ext = extension    # old private name
