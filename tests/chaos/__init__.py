"""The chaos suite (`make chaos`, not part of `make test`): see tests/chaos/run.py."""
