"""Tests of media_hooks.http."""
