//! TLS: client connections and the links between nodes (rustls)
//! ============================================================
//! [`server_config`] builds what a listener needs from PEM files: the node's certificate
//! chain and private key, and, for mutual TLS, the CA whose certificates peers must
//! present. [`client_config`] builds the other side (trusted CA, optional identity). Both
//! use rustls's ring provider and its safe default protocol versions (TLS 1.2 and 1.3).
//! The server's client ports use them directly; the links between nodes use [`LinkTls`].
//!
//! Every error names the file it came from, so a wrong path or a key that does not match
//! its certificate stops the server at start-up with a message an operator can act on.
//!
//! Links between nodes: a tunnel
//! -----------------------------
//! A replication link is one socket shared by several threads: a receiver reads frames
//! while an acknowledger writes, and a primary's flusher writes batches straight into the
//! socket without waiting (`primary::send_without_waiting`). A TLS session is one state
//! machine both directions go through, so it cannot be split across those threads without
//! a lock on every send and receive. [`LinkTls::connect`] and [`LinkTls::accept`] instead
//! do the handshake and hand back one end of a loopback TCP pair; a task on a small runtime
//! of its own (two threads, `ditto-tls`) copies between the other end and the TLS session.
//! The link's code is the same with and without TLS: timeouts, `shutdown`, and the
//! flusher's non-blocking sends all act on a real socket. The cost (one more copy each way
//! through the kernel and a thread hop) is measured in docs/replication.md, "TLS between
//! nodes".
//!
//! The loopback pair is made per link: a listener on 127.0.0.1, port chosen by the
//! kernel, that takes only the connection it made itself (another process that connects
//! in between is dropped) and is closed at once.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("TLS: reading {what} from {path}: {detail}")]
    File { what: &'static str, path: PathBuf, detail: String },
    #[error("TLS: {path} holds no {what}")]
    Empty { what: &'static str, path: PathBuf },
    #[error("TLS: {0}")]
    Setup(String),
}

/// Where a node's TLS material lives (the `tls_*` keys of the config file).
#[derive(Clone, Debug, Default)]
pub struct TlsFiles {
    /// PEM certificate chain presented to peers, leaf first.
    pub cert_file: PathBuf,
    /// PEM private key of the leaf certificate (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// PEM CA certificates that peer certificates must chain to.
    pub ca_cert_file: Option<PathBuf>,
    /// Require clients to present a certificate signed by `ca_cert_file` (mutual TLS).
    pub auth_clients: bool,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let file_err = |detail: String| TlsError::File { what: "certificates", path: path.into(), detail };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_err(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_err(e.to_string()))?;
    if certs.is_empty() {
        return Err(TlsError::Empty { what: "PEM certificate", path: path.into() });
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::Empty { what: "PEM private key", path: path.into() },
        e => TlsError::File { what: "the private key", path: path.into(), detail: e.to_string() },
    })
}

fn roots(path: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in certs(path)? {
        roots.add(c).map_err(|e| TlsError::File {
            what: "CA certificates",
            path: path.into(),
            detail: e.to_string(),
        })?;
    }
    Ok(Arc::new(roots))
}

/// The listener side: our certificate and key, and the client CA when clients must
/// authenticate.
pub fn server_config(f: &TlsFiles) -> Result<Arc<ServerConfig>, TlsError> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Setup(e.to_string()))?;
    let builder = match (&f.ca_cert_file, f.auth_clients) {
        (Some(ca), true) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(roots(ca)?, provider())
                .build()
                .map_err(|e| TlsError::Setup(format!("client verifier from {}: {e}", ca.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
        (None, true) => return Err(TlsError::Setup("tls_auth_clients needs tls_ca_cert_file".into())),
        (_, false) => builder.with_no_client_auth(),
    };
    let chain = certs(&f.cert_file)?;
    let key = key(&f.key_file)?;
    let cfg = builder.with_single_cert(chain, key).map_err(|e| {
        TlsError::Setup(format!("certificate {} with key {}: {e}", f.cert_file.display(), f.key_file.display()))
    })?;
    Ok(Arc::new(cfg))
}

/// The dialing side (a replication link, a test client): trusts `ca_cert_file` and, when
/// `cert_file`/`key_file` are set, presents them.
pub fn client_config(ca_cert_file: &Path, identity: Option<(&Path, &Path)>) -> Result<Arc<ClientConfig>, TlsError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Setup(e.to_string()))?
        .with_root_certificates(roots(ca_cert_file)?);
    let cfg = match identity {
        Some((cert, k)) => builder
            .with_client_auth_cert(certs(cert)?, key(k)?)
            .map_err(|e| TlsError::Setup(format!("client certificate {}: {e}", cert.display())))?,
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(cfg))
}

/// The name a client checks the server's certificate against.
pub fn server_name(host: &str) -> Result<ServerName<'static>, TlsError> {
    ServerName::try_from(host.to_string()).map_err(|e| TlsError::Setup(format!("server name {host:?}: {e}")))
}

/// TLS on the links between nodes (`tls_replication`, `tls_cluster`): mutual, each side
/// showing its node's certificate (`tls_cert_file`, `tls_key_file`) and checking the
/// other's against `tls_ca_cert_file`. A dialing node also checks that the certificate
/// names the host it dialed.
pub struct LinkTls {
    connector: tokio_rustls::TlsConnector,
    acceptor: tokio_rustls::TlsAcceptor,
    handshake: Duration,
}

impl std::fmt::Debug for LinkTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkTls").field("handshake", &self.handshake).finish_non_exhaustive()
    }
}

/// A TLS handshake that failed (not one that timed out): a certificate refused either way,
/// or a peer that closed it (a plaintext port). Asking again changes nothing until a
/// side's settings do.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct HandshakeFailed(String);

/// Whether `e` is a [`HandshakeFailed`].
pub fn is_handshake_failure(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|i| i.is::<HandshakeFailed>())
}

/// After one direction of a tunnel ends, how long the other may still run (a peer's
/// last frames, its close): a silent peer does not hold a tunnel's task for ever.
const LINGER: Duration = Duration::from_secs(5);

fn runtime() -> std::io::Result<&'static tokio::runtime::Runtime> {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    if let Some(rt) = RT.get() {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("ditto-tls")
        .enable_io()
        .enable_time()
        .build()?;
    // Two threads racing here build two; one is kept and the other dropped unused.
    Ok(RT.get_or_init(|| rt))
}

/// See `set_user_timeout`: far above any link's own silence limit (5 s).
const USER_TIMEOUT: Duration = Duration::from_secs(30);

fn set_user_timeout(sock: &TcpStream, d: Duration) -> std::io::Result<()> {
    socket2::SockRef::from(sock).set_tcp_user_timeout(Some(d))
}

/// Has the kernel give a connection up once data sent on it stays unacknowledged for
/// `USER_TIMEOUT` (a peer gone without a FIN, or whose receive window stays shut): a thread
/// blocked writing to it then fails instead of waiting out TCP's retransmissions (some 15
/// minutes). A TLS tunnel sets it on its own socket; a primary sets it on every link's.
pub fn give_up_unacknowledged(sock: &TcpStream) -> std::io::Result<()> {
    set_user_timeout(sock, USER_TIMEOUT)
}

/// A connection between nodes that goes quiet is probed by the kernel after this long,
/// then every `KEEPALIVE_INTERVAL`, and given up after `KEEPALIVE_PROBES` unanswered (or,
/// with TLS, by the user timeout, which takes over from them).
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_PROBES: u32 = 3;

/// Reads from a socket until a deadline: each read waits at most what is left of it, so a
/// peer sending a byte now and then is cut off at the deadline too (a hello on the
/// replication and control ports).
pub struct Until<'a> {
    stream: &'a TcpStream,
    until: Instant,
}

impl<'a> Until<'a> {
    pub fn new(stream: &'a TcpStream, until: Instant) -> Until<'a> {
        Until { stream, until }
    }
}

impl std::io::Read for Until<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        (&mut &*self.stream).read(buf)
    }
}

/// Turns TCP keepalive on for a connection between nodes (or from `ditto cluster`), so a
/// peer that lost its power or its network without a FIN ends a read that waits on it
/// with no timeout of its own (an accepted control connection's frames, a checkpoint
/// streamed to a joining backup) within about a minute, not never.
pub fn keep_alive(sock: &TcpStream) -> std::io::Result<()> {
    let k = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    socket2::SockRef::from(sock).set_tcp_keepalive(&k)
}

/// A connected pair of loopback sockets, both without Nagle's delay: the caller's end and
/// the tunnel's.
fn local_pair() -> std::io::Result<(TcpStream, TcpStream)> {
    let l = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))?;
    let mine = TcpStream::connect(l.local_addr()?)?;
    let from = mine.local_addr()?;
    // Another process may connect between the bind and our connect: only ours is taken,
    // and ours is in the backlog already.
    for _ in 0..16 {
        let (theirs, peer) = l.accept()?;
        if peer == from {
            mine.set_nodelay(true)?;
            theirs.set_nodelay(true)?;
            return Ok((mine, theirs));
        }
    }
    Err(std::io::Error::other("making a TLS tunnel's loopback pair: strangers kept connecting to its port"))
}

/// Whether a connection opens as TLS does (a handshake record, 0x16, of version 3.x,
/// holding a ClientHello, type 1, shorter than 64 KiB), peeked and not read, waiting at
/// most `within` for its first bytes. Each side uses it to say clearly that the other
/// speaks TLS where it does not, or the reverse, rather than fail on a garbled frame.
/// A ditto frame opens with its length and its CRC: of the frames a port reads first
/// (at most 64 KiB), only one of exactly 790 bytes whose CRC's 2nd and 3rd bytes are
/// 1 and 0 opens so (one in 65,536 of those), and is then refused with a TLS error.
pub fn opens_with_tls(sock: &TcpStream, within: Duration) -> std::io::Result<bool> {
    let end = std::time::Instant::now() + within;
    sock.set_read_timeout(Some(within))?;
    // Byte by byte: what a TLS client's first record holds there, if anything.
    let fits = |i: usize, v: u8| match i {
        0 => v == 0x16,
        1 => v == 0x03,
        2 => v <= 4,
        5 => v == 0x01,
        6 => v == 0,
        _ => true,
    };
    let mut b = [0u8; 7];
    loop {
        let n = match sock.peek(&mut b) {
            Ok(n) => n,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return Ok(false)
            }
            Err(e) => return Err(e),
        };
        if n == 0 || !b[..n].iter().enumerate().all(|(i, &v)| fits(i, v)) {
            return Ok(false);
        }
        if n == b.len() {
            return Ok(true);
        }
        if std::time::Instant::now() >= end {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The host part of `host:port` (`[v6]:port` too), as a certificate must name it.
pub fn host_of(addr: &str) -> &str {
    cert_name(addr.rsplit_once(':').map_or(addr, |(h, _)| h))
}

/// A host as a certificate names it: an IPv6 address without its brackets.
pub fn cert_name(host: &str) -> &str {
    host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host)
}

impl LinkTls {
    /// From the node's files; `tls_ca_cert_file` is required, since both sides check.
    pub fn new(files: &TlsFiles, handshake: Duration) -> Result<Arc<Self>, TlsError> {
        let Some(ca) = &files.ca_cert_file else {
            return Err(TlsError::Setup(
                "TLS between nodes needs tls_ca_cert_file: each node checks the other's certificate against it".into(),
            ));
        };
        let server = server_config(&TlsFiles { auth_clients: true, ..files.clone() })?;
        let client = client_config(ca, Some((&files.cert_file, &files.key_file)))?;
        Ok(Arc::new(LinkTls {
            connector: tokio_rustls::TlsConnector::from(client),
            acceptor: tokio_rustls::TlsAcceptor::from(server),
            handshake,
        }))
    }

    /// From a node's certificate, its key and the CA (what `new` reads of its files).
    pub fn from_paths(cert: &Path, key: &Path, ca: &Path, handshake: Duration) -> Result<Arc<Self>, TlsError> {
        let files = TlsFiles {
            cert_file: cert.to_path_buf(),
            key_file: key.to_path_buf(),
            ca_cert_file: Some(ca.to_path_buf()),
            auth_clients: true,
        };
        LinkTls::new(&files, handshake)
    }

    /// TLS to the node at `addr` (host:port) over `sock`, a connection to it; returns the
    /// plaintext end. Fails, saying why, when the handshake fails (a certificate refused
    /// either way, a peer that does not speak TLS) or does not end within the handshake
    /// timeout.
    pub fn connect(&self, sock: TcpStream, addr: &str) -> std::io::Result<TcpStream> {
        self.connect_named(sock, addr, host_of(addr))
    }

    /// How long a handshake is given (`tls_handshake_timeout_s`).
    pub fn handshake(&self) -> Duration {
        self.handshake
    }

    /// As `connect`, the certificate checked against `name` rather than `addr`'s host.
    pub fn connect_named(&self, sock: TcpStream, addr: &str, name: &str) -> std::io::Result<TcpStream> {
        let name = server_name(name).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let connector = self.connector.clone();
        self.tunnel(
            sock,
            format!("TLS to {addr}"),
            self.handshake,
            move |s| async move { connector.connect(name, s).await },
        )
    }

    /// TLS for `sock`, a connection a peer made; returns the plaintext end.
    pub fn accept(&self, sock: TcpStream) -> std::io::Result<TcpStream> {
        self.accept_within(sock, self.handshake)
    }

    /// As `accept`, the handshake given at most `limit` (a port's own deadline).
    pub fn accept_within(&self, sock: TcpStream, limit: Duration) -> std::io::Result<TcpStream> {
        let peer = sock.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "a peer".into());
        let acceptor = self.acceptor.clone();
        self.tunnel(sock, format!("TLS from {peer}"), limit, move |s| async move { acceptor.accept(s).await })
    }

    fn tunnel<F, Fut, S>(
        &self,
        sock: TcpStream,
        what: String,
        limit: Duration,
        handshake: F,
    ) -> std::io::Result<TcpStream>
    where
        F: FnOnce(tokio::net::TcpStream) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = std::io::Result<S>> + Send,
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
    {
        let (outer, inner) = local_pair()?;
        sock.set_nodelay(true)?;
        // A peer gone silent with data unacknowledged: the kernel gives the connection up
        // within this, so a tunnel blocked writing to it ends (without it, after its
        // retransmissions, some 15 minutes), whatever the link's code did meanwhile.
        set_user_timeout(&sock, USER_TIMEOUT)?;
        sock.set_nonblocking(true)?;
        inner.set_nonblocking(true)?;
        let (tx, rx) = std::sync::mpsc::sync_channel::<std::io::Result<()>>(1);
        let said = what.clone();
        runtime()?.spawn(async move {
            let open = async {
                let sock = tokio::net::TcpStream::from_std(sock)?;
                let tls = match tokio::time::timeout(limit, handshake(sock)).await {
                    // (rustls's refusals come as InvalidData, which a backup does not retry; a
                    // peer that closes the handshake, as a plaintext port does, as an end
                    // of file or a reset.)
                    Ok(r) => r.map_err(|e| {
                        let hint = match e.kind() {
                            std::io::ErrorKind::InvalidData => "both sides need TLS on, with certificates of one CA",
                            _ => "the peer closed it: is its port plaintext, or did it refuse this side's certificate (its log says)?",
                        };
                        std::io::Error::new(e.kind(), HandshakeFailed(format!("{said}: handshake failed: {e} ({hint})")))
                    })?,
                    Err(_) => {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("{said}: no handshake within {limit:?}"),
                        ))
                    }
                };
                Ok((tls, tokio::net::TcpStream::from_std(inner)?))
            };
            match open.await {
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
                Ok((tls, inner)) => {
                    if tx.send(Ok(())).is_ok() {
                        pump(tls, inner, &said).await;
                    }
                }
            }
        });
        match rx.recv_timeout(limit + Duration::from_secs(1)) {
            Ok(Ok(())) => Ok(outer),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, format!("{what}: no handshake"))),
        }
    }
}

/// Copies both ways between a TLS session and the tunnel's end of the loopback pair until
/// one way ends, then gives the other [`LINGER`] to end too. Each way's end is passed on
/// (a TLS close_notify one way, a FIN the other), so the link's code sees its peer close.
///
/// An error reading the session (a TLS alert from the peer: under TLS 1.3 a server's
/// refusal of the client's certificate arrives after the client's handshake has ended)
/// is logged, once, naming the link (`what`): the link's code sees only an end of file.
async fn pump<S>(tls: S, inner: tokio::net::TcpStream, what: &str)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
{
    use tokio::io::AsyncWriteExt;
    let (tr, mut tw) = tokio::io::split(tls);
    let (ir, mut iw) = inner.into_split();
    let up = async move {
        let mut ir = tokio::io::BufReader::with_capacity(64 << 10, ir);
        let _ = tokio::io::copy_buf(&mut ir, &mut tw).await;
        let _ = tokio::time::timeout(LINGER, tw.shutdown()).await;
    };
    let down = async move {
        use tokio::io::AsyncBufReadExt;
        let mut tr = tokio::io::BufReader::with_capacity(64 << 10, tr);
        // By hand rather than `copy_buf`, to tell the session's errors (said) from the
        // tunnel end's (the link's code closed it: nothing to say).
        loop {
            let n = match tr.fill_buf().await {
                Ok([]) => break,
                Ok(buf) => {
                    if iw.write_all(buf).await.is_err() {
                        break;
                    }
                    buf.len()
                }
                Err(e) => {
                    tracing::warn!("{what}: the TLS session ended: {e}");
                    break;
                }
            };
            tr.consume(n);
        }
        let _ = iw.shutdown().await;
    };
    tokio::pin!(up, down);
    tokio::select! {
        _ = &mut up => { let _ = tokio::time::timeout(LINGER, down).await; }
        _ = &mut down => { let _ = tokio::time::timeout(LINGER, up).await; }
    }
}

#[cfg(any(test, feature = "pki"))]
pub mod pki {
    //! Certificates made at run time (the tests', `ditto demo`'s nodes'): a CA, a server
    //! certificate for 127.0.0.1 and localhost, and a client certificate, all signed by
    //! the CA. Not for production: each call makes a new CA, with its key on disk beside.
    use std::path::{Path, PathBuf};

    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};

    pub struct Pki {
        pub ca: PathBuf,
        pub server_cert: PathBuf,
        pub server_key: PathBuf,
        pub client_cert: PathBuf,
        pub client_key: PathBuf,
    }

    pub fn make(dir: &Path) -> Pki {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        // Distinct subjects: OpenSSL (redis-cli) takes a leaf whose subject equals its
        // issuer's for self-signed.
        ca_params.distinguished_name.push(DnType::CommonName, "ditto test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let leaf = |names: Vec<String>, stem: &str| {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(names).unwrap();
            params.distinguished_name.push(DnType::CommonName, format!("ditto test {stem}"));
            let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
            let (c, k) = (dir.join(format!("{stem}.crt")), dir.join(format!("{stem}.key")));
            std::fs::write(&c, cert.pem()).unwrap();
            std::fs::write(&k, key.serialize_pem()).unwrap();
            (c, k)
        };
        let (server_cert, server_key) = leaf(vec!["127.0.0.1".into(), "localhost".into()], "server");
        let (client_cert, client_key) = leaf(vec!["client".into()], "client");
        let ca_path = dir.join("ca.crt");
        std::fs::write(&ca_path, ca.pem()).unwrap();
        Pki { ca: ca_path, server_cert, server_key, client_cert, client_key }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Frame, PROTOCOL_VERSION};
    use std::io::{Read, Write};

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (a, l.accept().unwrap().0)
    }

    /// A node's TLS with certificates of a CA made in `dir` (its certificate names
    /// 127.0.0.1 and localhost).
    fn node_link(dir: &Path) -> Arc<LinkTls> {
        let pki = pki::make(dir);
        LinkTls::from_paths(&pki.server_cert, &pki.server_key, &pki.ca, Duration::from_secs(5)).unwrap()
    }

    /// What a dialing node's first bytes look like to `opens_with_tls`.
    fn looks_like_tls(first: &[u8]) -> bool {
        let (mut a, b) = pair();
        a.write_all(first).unwrap();
        opens_with_tls(&b, Duration::from_millis(200)).unwrap()
    }

    #[test]
    fn a_client_hello_opens_with_tls_and_frames_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let link = node_link(dir.path());
        // A real ClientHello, as our dialing side sends it: peeked, then the handshake
        // goes on with nothing consumed, and the tunnel carries bytes both ways.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let dialer = {
            let link = Arc::clone(&link);
            let addr = addr.clone();
            std::thread::spawn(move || {
                let mut s = link.connect(TcpStream::connect(&addr).unwrap(), &addr).unwrap();
                s.write_all(b"ping").unwrap();
                let mut b = [0u8; 4];
                s.read_exact(&mut b).unwrap();
                b
            })
        };
        let (raw, _) = l.accept().unwrap();
        assert!(opens_with_tls(&raw, Duration::from_secs(5)).unwrap(), "a ClientHello");
        let mut s = link.accept(raw).unwrap();
        let mut b = [0u8; 4];
        s.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"ping");
        s.write_all(b"pong").unwrap();
        assert_eq!(&dialer.join().unwrap(), b"pong");
        // Every first frame a port reads: not TLS.
        let hello = |node: &str, proves: Option<crate::proof::Nonce>| Frame::Hello {
            version: PROTOCOL_VERSION,
            epoch: ditto_log::Epoch(7),
            have_ts: ditto_engine::Ts(123),
            node: node.into(),
            learner: false,
            proves,
            database: 0,
            run: 0,
        };
        for f in [hello("127.0.0.1:7001", None), hello("b", Some([0x16; 32])), hello(&"n".repeat(900), None)] {
            assert!(!looks_like_tls(&f.encode()), "{f:?}");
        }
        assert!(!looks_like_tls(b"*1\r\n$4\r\nPING\r\n"), "RESP");
        assert!(!looks_like_tls(&[0x16]), "one byte that could begin either, then nothing");
        assert!(!looks_like_tls(&[]), "nothing");
    }

    #[test]
    fn a_certificate_without_the_dialed_name_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let link = node_link(dir.path());
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let acceptor = {
            let link = Arc::clone(&link);
            std::thread::spawn(move || link.accept(l.accept().unwrap().0).map(|_| ()))
        };
        // The certificate names 127.0.0.1 and localhost, not db-2.example.
        let e = link.connect_named(TcpStream::connect(&addr).unwrap(), &addr, "db-2.example").unwrap_err();
        assert!(is_handshake_failure(&e) && e.to_string().contains("not valid for name \"db-2.example\""), "{e}");
        let e = acceptor.join().unwrap().unwrap_err();
        assert!(is_handshake_failure(&e), "the other side fails too: {e}");
        // A name no certificate can carry.
        let e = link.connect_named(pair().0, &addr, "[::1]").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
    }

    /// A peer that takes the connection and never answers fails the handshake in its time
    /// (a timeout, which may be tried again, not a refusal); and once a tunnel is up, one
    /// side closing its plaintext end is seen by the other as the link's end.
    #[test]
    fn a_silent_peer_times_the_handshake_out_and_a_close_crosses_the_tunnel() {
        let dir = tempfile::tempdir().unwrap();
        let pki = pki::make(dir.path());
        let quick =
            LinkTls::from_paths(&pki.server_cert, &pki.server_key, &pki.ca, Duration::from_millis(300)).unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let t = std::time::Instant::now();
        let e = quick.connect(TcpStream::connect(&addr).unwrap(), &addr).unwrap_err();
        let _silent = l.accept().unwrap();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
        assert!(!is_handshake_failure(&e), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());

        let link = LinkTls::from_paths(&pki.server_cert, &pki.server_key, &pki.ca, Duration::from_secs(5)).unwrap();
        let acceptor = {
            let link = Arc::clone(&link);
            std::thread::spawn(move || link.accept(l.accept().unwrap().0).unwrap())
        };
        let mut near = link.connect(TcpStream::connect(&addr).unwrap(), &addr).unwrap();
        let mut far = acceptor.join().unwrap();
        near.write_all(b"last words").unwrap();
        drop(near);
        far.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut got = Vec::new();
        far.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"last words", "what was sent before the close, then the end");
    }

    #[test]
    fn a_connection_between_nodes_is_probed_when_quiet() {
        let (a, _b) = pair();
        keep_alive(&a).unwrap();
        let s = socket2::SockRef::from(&a);
        assert!(s.keepalive().unwrap());
        assert_eq!(s.tcp_keepalive_time().unwrap(), KEEPALIVE_IDLE);
        assert_eq!(s.tcp_keepalive_interval().unwrap(), KEEPALIVE_INTERVAL);
        assert_eq!(s.tcp_keepalive_retries().unwrap(), KEEPALIVE_PROBES);
        set_user_timeout(&a, USER_TIMEOUT).unwrap();
        assert_eq!(s.tcp_user_timeout().unwrap(), Some(USER_TIMEOUT));
    }

    #[test]
    fn host_of_takes_the_host_of_an_address() {
        assert_eq!(host_of("127.0.0.1:7001"), "127.0.0.1");
        assert_eq!(host_of("db-1.example:7001"), "db-1.example");
        assert_eq!(host_of("[::1]:7001"), "::1");
        assert_eq!(host_of("no-port"), "no-port");
        assert_eq!(cert_name("[::1]"), "::1");
        assert_eq!(cert_name("db-1.example"), "db-1.example");
    }
}
