"""The federation's keys and certificates: a certificate authority, the SuperLink's TLS certificate,
operators' client certificates and the hospitals' SuperNode key pairs (``certificates``), written
with owner-only permissions. ``hospitrust deploy ca|server-cert|operator-cert|keygen`` run it.
"""
