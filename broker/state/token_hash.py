"""How token secrets are stored and checked (broker.state.tokens makes the tokens).

Every token onepool makes holds at least 176 random bits (API tokens and node credentials 256,
the join tokens of rented nodes 176), so guessing one, or finding one from its stored hash, is
out of reach whatever the hash costs: a password hash (argon2) guards secrets people choose and
would only make every failed request cost tens of milliseconds of CPU. A secret is stored as

    hmac-sha256$<salt: 32 hex digits>$<HMAC-SHA256(key=salt, message=token): 64 hex digits>

with a fresh random salt per token, and checked with one HMAC (about a microsecond) and a
constant-time compare. Why a per-token salt and not a server-side key: the database alone
already yields nothing usable (the entropy does that), so a key file would add no protection,
and it would be one more secret to copy to every API process on every machine that serves the
same database, and to restore with every backup.

Hashes written before this scheme are argon2 (`$argon2id$...`). They still verify, once, and
the caller then stores the fast hash in their place (`Check.OK_UPGRADE`), so no token stops
working and each costs argon2 once. Until upgraded, a failed request against such a row would
cost an argon2 run: a process-wide budget (`LegacyBudget`) bounds those runs, so a flood
against an old token's id costs a bounded share of one core.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import threading
from collections.abc import Callable
from enum import Enum

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from broker.clock import Clock
from broker.errors import TooManyRequests

SCHEME = "hmac-sha256"
_SALT_BYTES = 16
_LEGACY = PasswordHasher(time_cost=2, memory_cost=19 * 1024, parallelism=1)


class Check(Enum):
    """What checking a token against its stored hash found."""

    BAD = "bad"  # no stored hash, or the token does not match it
    OK = "ok"
    OK_UPGRADE = "ok_upgrade"  # matches an old (argon2) hash: store hash_secret(token) instead


def hash_secret(token: str) -> str:
    """The string to store for `token` (a new random salt each call)."""
    salt = secrets.token_bytes(_SALT_BYTES)
    return f"{SCHEME}${salt.hex()}${_mac(salt, token)}"


def _mac(salt: bytes, token: str) -> str:
    return hmac.new(salt, token.encode(), hashlib.sha256).hexdigest()


def is_legacy(stored: str) -> bool:
    """True for a hash written before the fast scheme (argon2)."""
    return stored.startswith("$argon2")


def check_fast(stored: str, token: str) -> bool:
    """True if `token` matches `stored` (a hash_secret result). Malformed hashes match nothing."""
    scheme, _, rest = stored.partition("$")
    salt_hex, _, mac = rest.partition("$")
    if scheme != SCHEME or len(salt_hex) != 2 * _SALT_BYTES:
        return False
    try:
        salt = bytes.fromhex(salt_hex)
    except ValueError:
        return False
    return hmac.compare_digest(_mac(salt, token), mac)


def check_argon2(stored: str, token: str) -> bool:
    """True if `token` matches an argon2 hash (tens of milliseconds of CPU)."""
    try:
        return bool(_LEGACY.verify(stored, token))
    except (VerificationError, InvalidHashError):
        return False


class LegacyBudget:
    """A token bucket over argon2 verifications in this process: `per_s` a second on average,
    `burst` at once. Thread-safe. A legitimate old token needs one run ever; the bound is for
    floods against ids whose row still holds an argon2 hash."""

    def __init__(self, clock: Clock, per_s: float = 4.0, burst: int = 8) -> None:
        self._clock, self._per_s, self._burst = clock, per_s, float(burst)
        self._tokens, self._t = float(burst), clock.now()
        self._lock = threading.Lock()

    def take(self) -> None:
        """Spend one verification. Raises TooManyRequests (with the seconds to wait) if none
        is left."""
        with self._lock:
            now = self._clock.now()
            self._tokens = min(self._burst, self._tokens + (now - self._t) * self._per_s)
            self._t = now
            if self._tokens < 1.0:
                wait = math.ceil((1.0 - self._tokens) / self._per_s)
                raise TooManyRequests(
                    "too many checks of tokens made before this server's upgrade (their stored "
                    f"hash is slow to check); retry in {wait} s", retry_after_s=wait)
            self._tokens -= 1.0


class Hasher:
    """Checks tokens against stored hashes. `fast` and `slow` are the HMAC and argon2 checks
    (seams: tests count their calls); each slow check is paid from `budget`."""

    def __init__(self, budget: LegacyBudget, fast: Callable[[str, str], bool] = check_fast,
                 slow: Callable[[str, str], bool] = check_argon2) -> None:
        self.budget, self.fast, self.slow = budget, fast, slow

    def check(self, stored: str | None, token: str) -> Check:
        """Check `token` against `stored`. Raises TooManyRequests when an old hash would need
        a slow check and this process's budget for them is spent."""
        if not stored:
            return Check.BAD
        if not is_legacy(stored):
            return Check.OK if self.fast(stored, token) else Check.BAD
        self.budget.take()
        return Check.OK_UPGRADE if self.slow(stored, token) else Check.BAD
