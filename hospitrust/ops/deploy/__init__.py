"""``hospitrust deploy ...``: the operator's and the hospitals' side of a real federation.

Operator (runs the SuperLink):

- ``deploy ca``            a certificate authority (``ca.crt``, ``ca.key``)
- ``deploy server-cert``   the SuperLink's TLS certificate, with the host names and IPs it is reached by
- ``deploy operator-cert`` an operator's client certificate (the Control API's credential)
- ``deploy superlink``     ``flower-superlink`` on 127.0.0.1 with TLS, SuperNode authentication, a persistent
                           database and no runtime dependency installation, behind the nginx gateway that
                           publishes the Fleet API to hospitals and the Control API to operators only
- ``deploy connection``    the ``[superlink.NAME]`` entry in ``$FLWR_HOME/config.toml`` for ``flwr`` (and the
                           operator's local tunnel it goes through)
- ``deploy tunnel``        run that tunnel
- ``deploy register``      ``flwr supernode register`` for each hospital's public key
- ``deploy status``        wait for a run and exit 0 only if it ended ``finished:completed``
- ``deploy hospitals``     the federation's hospitals by name: online or offline, last seen, data, runs

Hospital (runs a SuperNode):

- ``deploy keygen``        the hospital's SuperNode key pair (the private key never leaves the hospital)
- ``deploy supernode``     ``hospitrust data check``, then ``flower-supernode`` with TLS and the key

``gateway`` and ``tunnel`` the nginx configurations; ``superlink`` and ``supernode`` their commands;
``gate``, ``approval``, ``policy`` and ``audit`` what a hospital lets run. Keys and certificates are
``hospitrust.pki``'s, the launcher and the supervisor ``hospitrust.supervision``'s, the handlers and
parsers ``hospitrust.cli.deploy``'s. Waiting for health, runs and nodes is ``hospitrust.ops.flwr``'s.
"""

from hospitrust.errors import DeployError
from hospitrust.pki.certificates import create_ca, create_operator_cert, create_server_cert, create_supernode_keys
from hospitrust.ops.deploy.superlink import DEFAULT_PORT, flwr_home, superlink_command, write_connection
from hospitrust.ops.deploy.supernode import node_config_string, supernode_command, toml_string
from hospitrust.ops.flwr import COMPLETED, online_nodes, run_status, wait_for_run, wait_healthy

__all__ = [
    "COMPLETED", "DEFAULT_PORT", "DeployError", "create_ca", "create_operator_cert", "create_server_cert", "create_supernode_keys", "flwr_home",
    "node_config_string", "online_nodes", "run_status", "superlink_command", "supernode_command", "toml_string",
    "wait_for_run", "wait_healthy", "write_connection",
]
