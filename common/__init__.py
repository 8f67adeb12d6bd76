"""Small pieces shared by `data/` and `training/`: the user-error type and config parsing.

`model/` imports nothing from here: it knows no corpus, no logger and no command line.
"""
from common.errors import UserError

__all__ = ["UserError"]
