"""Serving TLS: the server ``SSLContext`` (TLS 1.2 minimum, ECDHE + AEAD ciphers) and
``CertReloader``, which swaps a rotated certificate into new handshakes without a restart
(a half-written rotation keeps the last good pair). The apps hand
``CertReloader.context`` to aiohttp themselves.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fairshare.tls.certs import read_not_after

__all__ = [
    "CIPHERS_TLS12",
    "CertReloader",
    "server_ssl_context",
]

log = logging.getLogger(__name__)

#: OpenSSL cipher string for TLS 1.2: forward secrecy (ECDHE) and AEAD (GCM, ChaCha20) only.
#: TLS 1.3 suites are configured apart by OpenSSL and are all AEAD already.
CIPHERS_TLS12 = "ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL:!eNULL"


# --------------------------------------------------------------------------- server contexts


def server_ssl_context(
    cert_file: str | os.PathLike[str],
    key_file: str | os.PathLike[str],
    *,
    client_ca: str | os.PathLike[str] | None = None,
) -> ssl.SSLContext:
    """A server ``SSLContext`` loaded with the certificate chain and key.

    TLS 1.2 minimum; TLS 1.2 ciphers limited to ``CIPHERS_TLS12`` (ECDHE + AEAD); no TLS
    compression (CRIME); server cipher preference; no session tickets (they would outlive
    a rotated key; session IDs still resume). Raises ``ssl.SSLError``/``OSError`` for
    unreadable or mismatched files.

    With ``client_ca`` the server asks every client for a certificate and verifies one
    that is offered against that CA (``CERT_OPTIONAL``: a bad certificate fails the
    handshake, no certificate is let through). OpenSSL checks a client certificate's
    extended key usage for ``clientAuth`` on the server side. The apps then refuse every
    path but the probes and metrics to a connection without a verified peer certificate
    (see ``webhook.app``), so kubelet probes and Prometheus need no certificate.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(CIPHERS_TLS12)
    context.options |= (
        ssl.OP_NO_COMPRESSION
        | ssl.OP_CIPHER_SERVER_PREFERENCE
        | ssl.OP_SINGLE_ECDH_USE
        | ssl.OP_NO_TICKET
    )
    context.load_cert_chain(os.fspath(cert_file), os.fspath(key_file))
    if client_ca is not None:
        context.verify_mode = ssl.CERT_OPTIONAL
        context.load_verify_locations(cafile=os.fspath(client_ca))
    return context


_Stamp = tuple[tuple[int, int, int, int], ...]


class CertReloader:
    """Serve the current certificate of a rotating pair of files without restarting.

    Give ``context`` to the server once. Its ``sni_callback`` runs in every handshake
    (with or without SNI) and points the connection at the newest good context, so new
    connections get the new certificate while open ones finish on the old.

    ``maybe_reload()`` checks the files' (device, inode, size, mtime); the app calls it
    periodically (``run()`` is such a loop). Kubelet rotates a mounted Secret by swapping a
    symlink, which changes the inode; ``stat`` follows the link. If the new files do not
    load (half-written, key and certificate from different rotations) the last good
    context stays, the error is logged, kept in ``last_error`` and passed to ``on_error``
    (e.g. to count it). The stamp still advances, so a broken pair is reported once, and
    the next write is tried again.

    The constructor raises if the *initial* files are unusable: fail fast at startup.

    ``client_ca`` (optional) is the CA that client certificates are verified against; it is
    part of every context loaded, including reloaded ones (the ``sni_callback`` switch
    moves a connection to the new context's trust store), and a change of that file
    reloads too.
    """

    def __init__(
        self,
        cert_file: str | os.PathLike[str],
        key_file: str | os.PathLike[str],
        *,
        on_error: Callable[[Exception], None] | None = None,
        client_ca: str | os.PathLike[str] | None = None,
        on_reload: Callable[[dt.datetime], None] | None = None,
    ) -> None:
        self._cert_file = Path(cert_file)
        self._on_reload = on_reload
        self._key_file = Path(key_file)
        self._client_ca = Path(client_ca) if client_ca is not None else None
        self._on_error = on_error
        self._stamp = self._read_stamp()
        self._front = server_ssl_context(self._cert_file, self._key_file, client_ca=self._client_ca)
        self._front.sni_callback = self._select
        self._current = self._front
        self._not_after = read_not_after(self._cert_file)
        self.reloads = 0
        self.last_error: Exception | None = None

    @property
    def context(self) -> ssl.SSLContext:
        """The context to hand to the server; it stays the same object across reloads."""
        return self._front

    @property
    def current(self) -> ssl.SSLContext:
        """The context new handshakes are switched to (the last good one loaded)."""
        return self._current

    @property
    def not_after(self) -> dt.datetime:
        """Expiry (UTC) of the certificate being served, e.g. for an expiry gauge."""
        return self._not_after

    def maybe_reload(self) -> bool:
        """Reload if the files changed; True if a new certificate is now being served."""
        try:
            stamp = self._read_stamp()
        except OSError as error:  # a file is missing for a moment during rotation
            self._report(error)
            return False
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            fresh = server_ssl_context(self._cert_file, self._key_file, client_ca=self._client_ca)
            not_after = read_not_after(self._cert_file)
        except (OSError, ssl.SSLError, ValueError) as error:
            self._report(error)
            return False
        self._current, self._not_after = fresh, not_after
        self.reloads += 1
        self.last_error = None
        log.info("TLS certificate reloaded from %s (expires %s)", self._cert_file, not_after)
        if self._on_reload is not None:
            self._on_reload(not_after)
        return True

    async def run(self, *, interval: float = 10.0) -> None:
        """Call ``maybe_reload`` every ``interval`` seconds until cancelled."""
        while True:
            await asyncio.sleep(interval)
            self.maybe_reload()

    def _select(self, connection: Any, server_name: str | None, context: ssl.SSLContext) -> None:
        # Called by OpenSSL during the ClientHello; returning None continues the handshake.
        current = self._current
        if current is not context:
            connection.context = current

    @property
    def requires_client_cert(self) -> bool:
        """True when client certificates are verified (``client_ca`` was given)."""
        return self._client_ca is not None

    def _read_stamp(self) -> _Stamp:
        files = (self._cert_file, self._key_file, self._client_ca)
        stats = tuple(os.stat(f) for f in files if f is not None)
        return tuple((s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns) for s in stats)

    def _report(self, error: Exception) -> None:
        self.last_error = error
        log.warning(
            "TLS reload from %s failed, keeping the old certificate: %s", self._cert_file, error
        )
        if self._on_error is not None:
            self._on_error(error)
