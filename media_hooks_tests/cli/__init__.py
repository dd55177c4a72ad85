"""Tests of media_hooks.cli."""
