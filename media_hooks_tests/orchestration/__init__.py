"""Tests of media_hooks.orchestration."""
