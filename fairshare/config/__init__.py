"""fairshare configuration: the ``FairShareConfig`` schema and its loading.

``schema`` holds the pydantic models (the only place config is typed); ``loading`` turns
text into a validated config or a ``ConfigError`` with field paths. The ConfigMap watch
lives in ``reloading`` (an adapter) and is not imported here, so importing this package
never pulls in kubernetes_asyncio, aiohttp or prometheus_client.
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
