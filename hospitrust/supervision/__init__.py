"""Process supervision at a hospital: the warm launcher that starts each ClientApp behind the
hospital's gate (``launcher``, run as ``python -m hospitrust.supervision.launcher``) and the
supervisor that restarts a SuperNode and its launcher when one exits (``supervisor``).
"""
