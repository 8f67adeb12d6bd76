"""Small pieces shared by `data/` and `training/`: the user-error type and config parsing.

`model/` imports only small helpers from here (the UserError type, common/schema.py's `is_int` and
`is_number`, common/device.py's `torch_version`): it knows no corpus, no logger and no command line.
"""
