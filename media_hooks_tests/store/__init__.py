"""Tests of media_hooks.store."""
