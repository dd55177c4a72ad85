"""Tests of media_hooks.devtools."""
