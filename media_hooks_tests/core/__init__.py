"""Tests of media_hooks.core."""
