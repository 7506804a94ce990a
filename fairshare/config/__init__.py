"""fairshare configuration: the ``FairShareConfig`` schema (``schema``, ``fields``) and
its loading (``loading``: text to a validated config, or a ``ConfigError`` with field
paths). The ConfigMap watch, ``reloading``, is an adapter and is not imported here.
"""

from fairshare.config.loading import (
    config_from_mapping,
    dump_default_config,
    load_config_file,
    parse_config,
)
from fairshare.config.schema import FairShareConfig, Tenant

__all__ = [
    "FairShareConfig",
    "Tenant",
    "config_from_mapping",
    "dump_default_config",
    "load_config_file",
    "parse_config",
]
