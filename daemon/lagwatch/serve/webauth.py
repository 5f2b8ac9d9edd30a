"""Basic auth for the HTTP endpoints: Authorization headers checked against the web config's
bcrypt hashes (config/web.py), in constant work whether the user exists or not."""

from __future__ import annotations

import base64
import hashlib
import hmac
import threading

import bcrypt

from lagwatch.config.web import bcrypt_cost


class BasicAuth:
    """Checks Authorization headers against bcrypt hashes. bcrypt is slow on purpose, so a
    successful check is remembered (as a keyed digest, never the password) for later scrapes.

    An unknown user costs a bcrypt check too, against a decoy hash of the cost of one of
    the real users, chosen by a keyed digest of the name: the same name always takes the
    same time, and with users of different costs the time of a name does not tell whether
    it exists (a cheaper real user looks like any unknown name mapped to its cost)."""

    def __init__(self, users: dict[str, str]) -> None:
        self.users = {u: h.encode() for u, h in users.items()}
        self._key = hashlib.sha256(b"".join(self.users.values()) + b"lagwatch").digest()
        self._good: set[bytes] = set()
        self._lock = threading.Lock()
        self._costs = sorted(bcrypt_cost(h) or 4 for h in users.values())
        self._decoys: dict[int, bytes] = {}  # made on first use: no CPU spent before listening

    @property
    def enabled(self) -> bool:
        return bool(self.users)

    def allows(self, header: str | None) -> bool:
        if not self.users:
            return True
        scheme, _, credentials = (header or "").strip().partition(" ")
        if scheme.lower() != "basic":  # RFC 7235: the scheme is case-insensitive
            return False
        try:
            user, _, password = base64.b64decode(credentials.strip(), validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        hashed = self.users.get(user)
        token = hmac.new(self._key, f"{user}\0{password}".encode(), hashlib.sha256).digest()
        if hashed is not None:
            with self._lock:
                if token in self._good:
                    return True
        # bcrypt reads 72 bytes at most (as Go's and htpasswd's do); bcrypt 5 refuses more.
        secret = password.encode()[:72]
        if hashed is None:
            bcrypt.checkpw(secret, self._decoy_for(user))  # the work of some real user's check
            return False
        if not bcrypt.checkpw(secret, hashed):
            return False
        with self._lock:
            if len(self._good) > 1000:
                self._good.clear()
            self._good.add(token)
        return True

    def _decoy_for(self, user: str) -> bytes:
        pick = hmac.new(self._key, user.encode(errors="replace"), hashlib.sha256).digest()
        cost = self._costs[int.from_bytes(pick[:4], "big") % len(self._costs)]
        with self._lock:
            decoy = self._decoys.get(cost)
        if decoy is None:
            decoy = bcrypt.hashpw(b"lagwatch decoy password", bcrypt.gensalt(rounds=cost))
            with self._lock:
                decoy = self._decoys.setdefault(cost, decoy)
        return decoy
