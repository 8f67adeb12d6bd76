"""Merged into data/tokenizer.py (it was split off only for a line limit). Kept as a name only, for the importers
not yet moved to data.tokenizer: pretrained/load.py and pretrained/convert.py. Delete it once they import from
data.tokenizer."""
from data.tokenizer import PREPARE_AGAIN, stored_tokenizer, tokenizer_from_json  # noqa: F401
