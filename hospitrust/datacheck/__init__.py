"""A hospital's own data checked against the task before it joins (``check``: class folders, a CSV
manifest or an .npz; what is wrong named without a path a patient could be found by). The command
is ``hospitrust data check`` (:mod:`hospitrust.cli.data`).
"""
