"""Operating hospitrust: the command line, simulation, deployment, data checks, the in-process grid."""
