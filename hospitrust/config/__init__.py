"""The run config and the node config, validated at the edge, once.

``run`` composes the run config from the components' Options (a section per component, named
after it); ``node`` the node config; ``legacy`` the old flat keys and their new names;
``reference`` generates pyproject's run-config tables and the config reference from the Options.
"""

from hospitrust.errors import ConfigError
from hospitrust.config.node import NodeConfig, memoised_node_config, parse_node_config
from hospitrust.config.run import (DATA_DIR_ENV, CoreOptions, RunConfig, memoised_run_config, parse_run_config,
                                   run_config_defaults)

__all__ = ["ConfigError", "CoreOptions", "DATA_DIR_ENV", "NodeConfig", "RunConfig", "memoised_node_config",
           "memoised_run_config", "parse_node_config", "parse_run_config", "run_config_defaults"]
