"""FED-FBD block ownership (Chen & McMillan 2026, arXiv:2606.12679).

- ``blocks``: how a model is cut into functional blocks (ResNet-18: stem, layer1-4, head)
- ``warehouse``: N colors, each a complete model from one version of every block
- ``plan``: which hospitals may write which colors, validated, with a conflict-free schedule
- ``stamps``: sha256 per block version, the trail of writers, the append-only stamp log
- ``training``: a hospital's loss, cross-entropy + lambda x KL to a sibling color
- ``routing``: inference over colors (max-confidence, ensemble, exclusions), detection
- ``unlearn``: a hospital removed by averaging colors it never reached; ``mia``: the audit

The strategy itself is ``hospitrust.strategies.fbd.FBD`` (registry name ``fbd``): it runs on the
server's one round loop (``hospitrust.server_app.loop``) with the round features, its warehouse in
the checkpoint; ``hospitrust.client_app.fbd`` is the ClientApp's ``train.fbd`` handler;
``hospitrust fbd`` is ``hospitrust.cli.fbd``. This package is the block model they share, below the
strategies.
"""
