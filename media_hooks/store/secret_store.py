"""Signing secrets at rest: encrypted under the operator's key when one is configured, stored
as they are when none is.

``MEDIA_HOOKS_SECRET_KEY`` holds one or more Fernet keys, comma-separated (``media-hooks secrets
generate-key`` makes one). The first key encrypts; every key decrypts, so a key is rotated by
putting the new one first, running ``media-hooks secrets rekey`` (every secret re-encrypted
under it), then dropping the old one. Fernet (the ``cryptography`` package) is authenticated
encryption with versioned, timestamped tokens: a token read under a wrong key fails to open,
never decrypts to garbage.

A secret is stored either as given (``whsec_…``) or as ``fernet:<token>`` (migration 0008 checks
that nothing else is). Encryption happens where a secret is written (``destination add``,
``secrets rekey``) and decryption only where a destination is read for sending
(``destinations.get_destination``). The key itself never appears in a message, a log line, an
exception or Dagster metadata: this module's objects do not show it in their repr either.

Without a key, secrets are stored as they are; once any secret is encrypted, adding one
without the key is refused rather than quietly storing it in the clear.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from media_hooks.core.errors import RuntimeFailure, UserError

ENV = "MEDIA_HOOKS_SECRET_KEY"
SEALED_PREFIX = "fernet:"


class SecretKeyError(RuntimeFailure):
    """Stored secrets cannot be read: no key, or none of the keys opens them (exit 1)."""


def generate_key() -> str:
    return Fernet.generate_key().decode("ascii")


def is_sealed(stored: str) -> bool:
    return stored.startswith(SEALED_PREFIX)


def _parse_keys(raw: str) -> tuple[Fernet, ...]:
    parts = [part.strip() for part in raw.split(",")]
    keys = []
    for number, part in enumerate(parts, start=1):
        try:
            keys.append(Fernet(part))
        except (ValueError, TypeError):
            # Never the value: a key pasted wrong is still most of a key.
            raise UserError(
                f"{ENV}: key {number} of {len(parts)} is not a Fernet key (32 bytes in url-safe "
                "base64; make one with `media-hooks secrets generate-key`)"
            ) from None
    return tuple(keys)


@dataclass(frozen=True)
class SecretBox:
    """The configured keys (none: secrets are stored as they are)."""

    keys: tuple[Fernet, ...] = field(default=(), repr=False)

    @classmethod
    def from_env(cls) -> SecretBox:
        raw = (os.environ.get(ENV) or "").strip()
        return cls(_parse_keys(raw)) if raw else cls()

    @property
    def encrypting(self) -> bool:
        return bool(self.keys)

    def seal(self, secret: str) -> str:
        """How ``secret`` is stored: encrypted under the first key, or as given without one."""
        if not self.keys:
            return secret
        return SEALED_PREFIX + self.keys[0].encrypt(secret.encode("utf-8")).decode("ascii")

    def open(self, stored: str, owner: str) -> str:
        """The secret as given, from how it is stored; ``owner`` names it in errors."""
        if not is_sealed(stored):
            return stored
        if not self.keys:
            raise SecretKeyError(
                f"the signing secrets of {owner} are encrypted, but {ENV} is not set: set it to "
                "the key they were encrypted with"
            )
        try:
            token = stored[len(SEALED_PREFIX) :].encode("ascii")
            return MultiFernet(list(self.keys)).decrypt(token).decode("utf-8")
        except (InvalidToken, UnicodeError):
            raise SecretKeyError(
                f"the signing secrets of {owner} cannot be decrypted with any key in {ENV} (a "
                "wrong key, or an old key removed before `media-hooks secrets rekey` ran: list "
                "it after the new one)"
            ) from None

    def key_number(self, stored: str) -> int | None:
        """Which configured key (1-based) opens ``stored``; None for plaintext or no key."""
        if not is_sealed(stored):
            return None
        token = stored[len(SEALED_PREFIX) :].encode("ascii")
        for number, key in enumerate(self.keys, start=1):
            try:
                key.decrypt(token)
            except InvalidToken:
                continue
            return number
        return None

    def describe(self) -> str:
        """The effective setting, in one line, without any key material."""
        if not self.keys:
            return f"signing secrets at rest: stored as they are ({ENV} is not set)"
        extra = f", {len(self.keys) - 1} older for decrypting" if len(self.keys) > 1 else ""
        return f"signing secrets at rest: encrypted ({ENV}: 1 key encrypting{extra})"
