"""hospitrust: trust-aware federated learning across hospitals, on Flower."""

__version__ = "0.1.0"
