"""Small pieces shared by `data/` and `training/`: the user-error type and config parsing.

`model/` imports only two small helpers from here (common/schema.py's `is_int`, common/device.py's
`torch_version`): it knows no corpus, no logger and no command line.
"""
from common.errors import UserError

__all__ = ["UserError"]
