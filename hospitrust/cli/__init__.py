"""The ``hospitrust`` command: every subcommand registered in one place (``main``), each command's
module imported only when that command runs, so ``hospitrust --help`` loads neither torch nor Flower.
"""
