"""attngpt's test suite: tests/ROOM/test_FILE*.py test ROOM/FILE.py (docs/architecture.md)."""
