"""Tests of media_hooks.engine."""
