"""Registers the three test tiers' markers and fixtures (see horovod.testing.fixtures)."""

pytest_plugins = ["horovod.testing.fixtures"]
