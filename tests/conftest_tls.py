"""A real TLS Kafka endpoint for tests: stunnel in front of a local tansu broker.

tansu 0.6.0 has no working TLS listener of its own (its command line refuses
``--cert`` with ``--key``), so TLS is terminated by ``stunnel`` (Debian's
``stunnel4``, installed by .ci/run) and forwarded to a plain tansu listener on
loopback. The broker *advertises* the stunnel port: Kafka clients connect to
the advertised address from the metadata, so every connection after the
bootstrap goes through TLS too.

:func:`make_pki` makes, with the ``openssl`` command line, a CA, a server
certificate for 127.0.0.1 / localhost, a client certificate whose key is
encrypted, a second (unrelated) CA and a server certificate for another name.
"""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

from streamsvi.io.broker import BrokerError, LocalBroker, _can_connect, free_port, stop_process

from tests.conftest import require_tool

#: Password of the client's encrypted private key (client.key).
CLIENT_KEY_PASSWORD = "client-key-pw-5b1e"


def _openssl(*args, cwd):
    proc = subprocess.run([require_tool("openssl"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed:\n{proc.stderr}")


def _ca(d: Path, name: str):
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)


def _leaf(d: Path, name: str, ca: str, cn: str, san: str | None, usage: str):
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=d)
    ext = ["basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature",
           f"extendedKeyUsage={usage}", "subjectKeyIdentifier=hash", "authorityKeyIdentifier=keyid"]
    if san:
        ext.append(f"subjectAltName={san}")
    (d / f"{name}.ext").write_text("\n".join(ext) + "\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)


def make_pki(d: Path) -> dict:
    """Certificates and keys in ``d``; returns their paths by role."""
    d.mkdir(parents=True, exist_ok=True)
    _ca(d, "ca")
    _ca(d, "other-ca")
    _leaf(d, "server", "ca", "localhost", "IP:127.0.0.1,DNS:localhost", "serverAuth")
    _leaf(d, "elsewhere", "ca", "elsewhere.invalid", "DNS:elsewhere.invalid", "serverAuth")
    _leaf(d, "client-plain", "ca", "streamsvi-client", None, "clientAuth")
    # the client's key, encrypted (the daemon reads its password from ssl_password_env/_file)
    _openssl("pkey", "-in", "client-plain.key", "-aes256", "-passout", f"pass:{CLIENT_KEY_PASSWORD}",
             "-out", "client.key", cwd=d)
    return {"ca": d / "ca.pem", "other_ca": d / "other-ca.pem",
            "server_cert": d / "server.pem", "server_key": d / "server.key",
            "elsewhere_cert": d / "elsewhere.pem", "elsewhere_key": d / "elsewhere.key",
            "client_cert": d / "client-plain.pem", "client_key": d / "client.key"}


def start_stunnel(workdir: Path, port: int, connect: str, cert, key, extra=()):
    """stunnel taking TLS on 127.0.0.1:``port`` in front of ``connect`` (logging to
    ``workdir/stunnel.log``). Returns ``(process, None)`` once the port accepts
    connections, or ``(None, why)`` if it did not within 10 s (then it is stopped)."""
    log = workdir / "stunnel.log"
    conf = workdir / "stunnel.conf"
    conf.write_text("\n".join(["foreground = yes", "pid =", "debug = 5", f"output = {log}", "[kafka]",
                               f"accept = 127.0.0.1:{port}", f"connect = {connect}", f"cert = {cert}",
                               f"key = {key}", *extra]) + "\n")
    proc = subprocess.Popen([require_tool("stunnel4"), str(conf)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and proc.poll() is None:
        if _can_connect(port):
            return proc, None
        time.sleep(0.02)
    why = (f"stunnel did not accept connections on 127.0.0.1:{port} (exit code {proc.poll()}); its "
           f"log:\n{log.read_text(errors='replace')[-2000:] if log.exists() else ''}")
    stop_process(proc)
    return None, why


class TlsBroker:
    """A tansu broker reachable only through TLS (stunnel), as a context manager.

    Parameters
    ----------
    workdir : Path
        Where stunnel's config and both logs go.
    cert, key : Path
        The server certificate and key stunnel presents.
    client_ca : Path, optional
        Require client certificates signed by this CA (mutual TLS).

    Attributes
    ----------
    bootstrap : str
        ``"127.0.0.1:PORT"`` of the TLS endpoint (also what the broker advertises).
    plain_bootstrap : str
        The broker's own plain listener (for checks that bypass TLS).
    """

    def __init__(self, workdir: Path, cert: Path, key: Path, client_ca: Path | None = None):
        self.workdir, self.cert, self.key, self.client_ca = Path(workdir), cert, key, client_ca
        self.broker: LocalBroker | None = None
        self.stunnel: subprocess.Popen | None = None
        self.port: int | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def plain_bootstrap(self) -> str:
        return self.broker.bootstrap

    def stunnel_log(self) -> str:
        p = self.workdir / "stunnel.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def __enter__(self) -> "TlsBroker":
        require_tool("stunnel4")            # skipped (or failed under CI) before anything starts
        self.workdir.mkdir(parents=True, exist_ok=True)
        last = None
        for _ in range(3):      # a picked port can be taken before stunnel binds it
            self.port = free_port()
            self.broker = LocalBroker(log_dir=self.workdir,
                                      advertised_url=f"tcp://127.0.0.1:{self.port}").start()
            extra = ([] if self.client_ca is None else
                     ["verifyChain = yes", "requireCert = yes", f"CAfile = {self.client_ca}"])
            self.stunnel, last = start_stunnel(self.workdir, self.port, self.broker.bootstrap,
                                               self.cert, self.key, extra)
            if self.stunnel is not None:
                return self
            self.__exit__()
        raise BrokerError(last)

    def __exit__(self, *exc):
        proc, self.stunnel = self.stunnel, None
        stop_process(proc)
        if self.broker is not None:
            self.broker.stop()
            self.broker = None
