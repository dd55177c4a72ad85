"""Tests of media_hooks.observe."""
