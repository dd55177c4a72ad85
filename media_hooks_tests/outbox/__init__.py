"""Tests of media_hooks.outbox."""
