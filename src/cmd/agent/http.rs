//! Bounded HTTP/1.1 server for the `agent` command: Prometheus `/metrics`,
//! `/healthz`, and `/debug/pprof/profile?seconds=N` (which takes N seconds).
//!
//! Hand-rolled on `std::net` and `httparse` instead of tiny_http because
//! tiny_http 0.12's accept thread hands each connection to a TaskPool that
//! spawns a new thread whenever none is idle, so a storm of concurrent
//! connections (or slow profile requests piling up) makes unbounded threads.
//! Here the threads (`workers` + one accept thread) and the queue of accepted
//! connections are fixed; what does not fit is refused with 503 at once.
//!
//! Deliberately small: one request per connection (`Connection: close`),
//! GET and HEAD only, no request bodies, no keep-alive, no chunked encoding.

use std::collections::VecDeque;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Header fields accepted in one request head; more is answered with 431.
const MAX_HEADERS: usize = 64;
/// Write budget for the 503s sent from the accept thread, which must not stall.
const REFUSE_WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long refused sockets are kept open (at most `PARKED_MAX` of them) so
/// that a request arriving after the 503 does not turn the close into an RST
/// that can destroy the 503 before the client reads it.
const PARKED_LINGER: Duration = Duration::from_secs(2);
const PARKED_MAX: usize = 64;
const PARKED_SWEEP_EVERY: Duration = Duration::from_millis(50);
/// Same idea for workers after an error answer: read and discard what the
/// client still sends, bounded in time and bytes.
const WORKER_LINGER: Duration = Duration::from_millis(500);
const WORKER_LINGER_BYTES: usize = 64 * 1024;
/// Idle workers re-check the stop flag this often; only matters when stop()
/// could not wake the accept thread (see `Server::shutdown_and_join`).
const WORKER_POLL: Duration = Duration::from_millis(200);
/// stop(): budget for waking the accept thread and for it to exit.
const WAKE_TIMEOUT: Duration = Duration::from_secs(1);
const ACCEPT_EXIT_WAIT: Duration = Duration::from_secs(1);

/// A parsed request head. There is never a body.
#[derive(Debug, Clone)]
pub struct Request {
    /// `GET` or `HEAD`.
    pub method: String,
    /// The target's path, not decoded, without the query.
    pub path: String,
    /// Query parameters in order, percent-decoded, duplicates kept.
    pub query: Vec<(String, String)>,
    /// Header fields in order; names lower-cased.
    pub headers: Vec<(String, String)>,
    pub peer: SocketAddr,
}

impl Request {
    /// The first value of query parameter `name`.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The first value of header `name`, in any case.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// What a handler answers. `Content-Length` and `Connection` are added by the
/// server (handler headers of those names, or with CR/LF, are dropped).
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn new(status: u16, content_type: &str, body: impl Into<Vec<u8>>) -> Response {
        Response {
            status,
            headers: vec![("Content-Type".to_owned(), content_type.to_owned())],
            body: body.into(),
        }
    }

    /// A `text/plain; charset=utf-8` response of `msg` and a newline.
    pub fn text(status: u16, msg: &str) -> Response {
        let mut body = String::with_capacity(msg.len() + 1);
        body.push_str(msg);
        body.push('\n');
        Response::new(status, "text/plain; charset=utf-8", body)
    }

    /// Adds a header (does not replace one of the same name).
    pub fn with_header(mut self, name: &str, value: &str) -> Response {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }
}

/// Answers requests; called on worker threads, possibly concurrently, and may
/// take long (a profile): that only occupies its own worker.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, req: &Request) -> Response;
}

#[derive(Debug, Clone)]
pub struct Limits {
    /// Threads answering requests (at least 1 is used).
    pub workers: usize,
    /// Accepted connections waiting for a worker (at least 1 is used); when
    /// full, new connections get 503.
    pub queue: usize,
    /// Largest request head (request line and header fields) in bytes.
    pub max_head_bytes: usize,
    /// The whole request head must arrive within this, else 408.
    pub read_timeout: Duration,
    /// The whole response must be written within this, else the connection is dropped.
    pub write_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            workers: 8,
            queue: 64,
            max_head_bytes: 8192,
            read_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(30),
        }
    }
}

/// Counters for the agent's own metrics.
#[derive(Debug, Default)]
pub struct Stats {
    /// Requests a worker answered, any status (bad and unauthorized included).
    pub requests: AtomicU64,
    /// Connections refused with 503: queue full, or still queued at stop.
    pub busy: AtomicU64,
    /// Requests refused as invalid: 400, 405, 408, 413, 431.
    pub bad: AtomicU64,
    /// Requests refused with 401 (missing or wrong bearer token).
    pub unauthorized: AtomicU64,
}

/// A running server; stopped by `stop()` or on drop.
pub struct Server {
    addr: SocketAddr,
    shutdown: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    workers: Vec<JoinHandle<()>>,
}

/// What the workers share.
struct Shared {
    handler: Arc<dyn Handler>,
    limits: Limits,
    token: Option<String>,
    stats: Arc<Stats>,
    shutdown: Arc<AtomicBool>,
}

struct Conn {
    stream: TcpStream,
    peer: SocketAddr,
}

impl Server {
    /// Serves on `listener` with a fixed pool of `limits.workers` threads fed by a bounded queue of `limits.queue` accepted connections.
    pub fn start(
        listener: TcpListener,
        handler: Arc<dyn Handler>,
        limits: Limits,
        token: Option<String>,
        stats: Arc<Stats>,
    ) -> io::Result<Server> {
        // An empty token would let "Authorization: Bearer " through: surely a mistake.
        if token.as_deref() == Some("") {
            return Err(io::Error::new(
                ErrorKind::InvalidInput,
                "empty bearer token: give a non-empty token, or none to serve without one",
            ));
        }
        // A nonblocking listener would make the accept loop spin.
        listener.set_nonblocking(false)?;
        let addr = listener.local_addr()?;
        let nworkers = limits.workers.max(1);
        let (tx, rx) = mpsc::sync_channel::<Conn>(limits.queue.max(1));
        let rx = Arc::new(Mutex::new(rx));
        let shutdown = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared {
            handler,
            limits,
            token,
            stats,
            shutdown: Arc::clone(&shutdown),
        });
        // From here on, an early return drops `server`, which joins what was started.
        let mut server = Server {
            addr,
            shutdown,
            accept: None,
            workers: Vec::with_capacity(nworkers),
        };
        // Thread names carry the port so `ps -L` (and the tests) can tell servers apart.
        let port = addr.port();
        for i in 0..nworkers {
            let (rx, shared) = (Arc::clone(&rx), Arc::clone(&shared));
            let spawned = thread::Builder::new()
                .name(format!("http{port}-w{i}"))
                .spawn(move || worker_loop(&rx, &shared));
            match spawned {
                Ok(handle) => server.workers.push(handle),
                Err(e) => {
                    // Disconnects the queue so the started workers exit at once.
                    drop(tx);
                    return Err(e);
                }
            }
        }
        let accept_shared = Arc::clone(&shared);
        server.accept = Some(
            thread::Builder::new()
                .name(format!("http{port}-a"))
                .spawn(move || accept_loop(&listener, &tx, &accept_shared))?,
        );
        Ok(server)
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, lets workers finish the request in hand, joins all threads.
    /// Connections still queued are answered 503. Waits as long as the
    /// slowest request in hand (a profile takes its N seconds).
    pub fn stop(mut self) {
        self.shutdown_and_join();
    }

    fn shutdown_and_join(&mut self) {
        self.shutdown.store(true, Ordering::SeqCst);
        if let Some(accept) = self.accept.take() {
            // accept() blocks; a connection to ourselves wakes it to see the flag.
            let _ = TcpStream::connect_timeout(&wake_addr(self.addr), WAKE_TIMEOUT);
            let waited = Instant::now();
            while !accept.is_finished() && waited.elapsed() < ACCEPT_EXIT_WAIT {
                thread::sleep(Duration::from_millis(5));
            }
            if accept.is_finished() {
                let _ = accept.join();
            }
            // Otherwise it could not be woken (loopback filtered?): leave it
            // detached, it exits at its next connection. The workers do not
            // wait for it, they poll the flag.
        }
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown_and_join();
    }
}

/// Where to connect to reach `addr` from this host (an unspecified bind
/// address is not connectable everywhere; its loopback is).
fn wake_addr(addr: SocketAddr) -> SocketAddr {
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, addr.port())
}

fn accept_loop(listener: &TcpListener, tx: &SyncSender<Conn>, shared: &Shared) {
    let mut parked: VecDeque<(TcpStream, Instant)> = VecDeque::new();
    let mut last_sweep = Instant::now();
    loop {
        let accepted = listener.accept();
        if shared.shutdown.load(Ordering::SeqCst) {
            break;
        }
        if last_sweep.elapsed() >= PARKED_SWEEP_EVERY {
            parked.retain_mut(|(s, since)| since.elapsed() < PARKED_LINGER && !drain_available(s));
            last_sweep = Instant::now();
        }
        match accepted {
            Ok((stream, peer)) => match tx.try_send(Conn { stream, peer }) {
                Ok(()) => {}
                Err(TrySendError::Full(mut conn)) => {
                    shared.stats.busy.fetch_add(1, Ordering::Relaxed);
                    refuse(&mut conn.stream, &busy_response(&shared.limits));
                    if parked.len() >= PARKED_MAX {
                        parked.pop_front();
                    }
                    if conn.stream.set_nonblocking(true).is_ok() {
                        parked.push_back((conn.stream, Instant::now()));
                    }
                }
                // All workers gone: nothing left to serve with.
                Err(TrySendError::Disconnected(_)) => break,
            },
            Err(e) => match e.kind() {
                ErrorKind::ConnectionAborted
                | ErrorKind::ConnectionReset
                | ErrorKind::Interrupted => {}
                // Out of descriptors or memory: back off instead of spinning.
                _ => thread::sleep(Duration::from_millis(50)),
            },
        }
    }
}

fn busy_response(limits: &Limits) -> Response {
    Response::text(
        503,
        &format!(
            "server busy: all {} workers and the queue of {} connections are taken; retry in a second",
            limits.workers.max(1),
            limits.queue.max(1)
        ),
    )
    .with_header("Retry-After", "1")
}

/// Answers `resp` without reading the request, quickly: for refusals.
fn refuse(stream: &mut TcpStream, resp: &Response) {
    // What the client already sent is read first: closing with unread input
    // makes the kernel send RST, which can destroy the answer in flight.
    drain_available(stream);
    if stream.set_nonblocking(false).is_err() {
        return;
    }
    let _ = send(stream, resp, false, Instant::now() + REFUSE_WRITE_TIMEOUT);
    let _ = stream.shutdown(Shutdown::Write);
}

/// Reads and discards what is available without blocking; true when the
/// peer is done (EOF or error), so the socket can be closed.
fn drain_available(stream: &mut TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return true;
    }
    let mut sink = [0u8; 4096];
    for _ in 0..16 {
        match stream.read(&mut sink) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return true,
        }
    }
    false
}

fn worker_loop(rx: &Mutex<Receiver<Conn>>, shared: &Shared) {
    loop {
        let next = {
            // Nothing panics while holding the lock, but a poisoned queue is still usable.
            let rx = rx.lock().unwrap_or_else(PoisonError::into_inner);
            if shared.shutdown.load(Ordering::SeqCst) {
                // Queued connections are not in hand yet: refuse rather than
                // start requests that may take seconds.
                let left: Vec<Conn> = rx.try_iter().collect();
                drop(rx);
                for mut conn in left {
                    refuse_stopping(&mut conn.stream, shared);
                }
                return;
            }
            rx.recv_timeout(WORKER_POLL)
        };
        match next {
            Ok(mut conn) if shared.shutdown.load(Ordering::SeqCst) => {
                refuse_stopping(&mut conn.stream, shared)
            }
            Ok(conn) => serve(conn, shared),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

fn refuse_stopping(stream: &mut TcpStream, shared: &Shared) {
    shared.stats.busy.fetch_add(1, Ordering::Relaxed);
    let resp = Response::text(503, "server stopping; retry once the agent is back")
        .with_header("Retry-After", "1");
    refuse(stream, &resp);
}

/// Why no request head could be read.
enum HeadError {
    /// Closed or failed before a byte arrived, or a socket error: nobody to answer.
    Gone,
    /// Closed after part of a head.
    Incomplete,
    TooLarge,
    TooManyHeaders,
    Timeout,
    Malformed,
}

fn serve(conn: Conn, shared: &Shared) {
    let Conn { mut stream, peer } = conn;
    let limits = &shared.limits;
    let stats = &shared.stats;
    let head = read_head(
        &mut stream,
        limits.max_head_bytes,
        Instant::now() + limits.read_timeout,
    );
    let head = match head {
        Ok(head) => head,
        Err(HeadError::Gone) => return,
        Err(e) => {
            stats.requests.fetch_add(1, Ordering::Relaxed);
            stats.bad.fetch_add(1, Ordering::Relaxed);
            reject(&mut stream, &head_error_response(e, limits), false, limits);
            return;
        }
    };
    stats.requests.fetch_add(1, Ordering::Relaxed);
    let head_only = head.starts_with(b"HEAD ");
    let req = match parse_request(&head, peer) {
        Ok(req) => req,
        Err(resp) => {
            stats.bad.fetch_add(1, Ordering::Relaxed);
            reject(&mut stream, &resp, head_only, limits);
            return;
        }
    };
    let resp = if !authorized(&req, shared.token.as_deref()) {
        stats.unauthorized.fetch_add(1, Ordering::Relaxed);
        Response::text(
            401,
            "missing or wrong bearer token; send the agent's token as 'Authorization: Bearer <token>'",
        )
        .with_header("WWW-Authenticate", "Bearer")
    } else {
        // A panicking handler must not take the worker with it (with
        // panic=unwind; a panic=abort build ends the process regardless).
        match panic::catch_unwind(AssertUnwindSafe(|| shared.handler.handle(&req))) {
            Ok(resp) => resp,
            Err(_) => Response::text(
                500,
                &format!(
                    "internal error: the handler for {:?} panicked; see the agent's stderr and report it",
                    req.path
                ),
            ),
        }
    };
    let _ = send(
        &mut stream,
        &resp,
        head_only,
        Instant::now() + limits.write_timeout,
    );
    let _ = stream.shutdown(Shutdown::Write);
}

/// Answers an invalid request, then reads what the client still sends for a
/// moment so that closing does not reset the connection under the answer.
fn reject(stream: &mut TcpStream, resp: &Response, head_only: bool, limits: &Limits) {
    if send(
        stream,
        resp,
        head_only,
        Instant::now() + limits.write_timeout,
    )
    .is_err()
    {
        return;
    }
    let _ = stream.shutdown(Shutdown::Write);
    let deadline = Instant::now() + WORKER_LINGER;
    let mut sink = [0u8; 4096];
    let mut total = 0;
    while total < WORKER_LINGER_BYTES {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return;
        }
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => return,
            Ok(n) => total += n,
        }
    }
}

fn head_error_response(e: HeadError, limits: &Limits) -> Response {
    match e {
        HeadError::TooLarge => Response::text(
            431,
            &format!(
                "request head larger than {} bytes; shorten the URL and header fields",
                limits.max_head_bytes
            ),
        ),
        HeadError::TooManyHeaders => Response::text(
            431,
            &format!("more than {MAX_HEADERS} header fields; send fewer header fields"),
        ),
        HeadError::Timeout => Response::text(
            408,
            &format!(
                "request head not received within {:?}; send the whole request at once",
                limits.read_timeout
            ),
        ),
        HeadError::Incomplete => Response::text(
            400,
            "connection closed inside the request head; end the head with an empty line",
        ),
        HeadError::Malformed | HeadError::Gone => malformed(),
    }
}

fn malformed() -> Response {
    Response::text(
        400,
        "malformed request; send an HTTP/1.1 request such as 'GET /metrics HTTP/1.1'",
    )
}

/// Reads up to the end of the request head, within `max` bytes and by
/// `deadline` (for the whole head, so a trickling client cannot hold a
/// worker for longer than that). Bytes after the head are dropped.
fn read_head(stream: &mut TcpStream, max: usize, deadline: Instant) -> Result<Vec<u8>, HeadError> {
    let mut buf = Vec::with_capacity(max.min(4096));
    let mut chunk = [0u8; 2048];
    loop {
        let room = max.saturating_sub(buf.len());
        if room == 0 {
            return Err(HeadError::TooLarge);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(HeadError::Timeout);
        }
        if stream.set_read_timeout(Some(left)).is_err() {
            return Err(HeadError::Gone);
        }
        let want = room.min(chunk.len());
        match stream.read(&mut chunk[..want]) {
            Ok(0) if buf.is_empty() => return Err(HeadError::Gone),
            Ok(0) => return Err(HeadError::Incomplete),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(HeadError::Timeout)
            }
            Err(_) => return Err(HeadError::Gone),
        }
        // Parsing as bytes arrive answers garbage at once instead of after a timeout.
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        match httparse::Request::new(&mut headers).parse(&buf) {
            Ok(httparse::Status::Complete(n)) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Ok(httparse::Status::Partial) => {}
            Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooManyHeaders),
            Err(_) => return Err(HeadError::Malformed),
        }
    }
}

/// Turns a complete head into a `Request`, or the answer refusing it.
fn parse_request(head: &[u8], peer: SocketAddr) -> Result<Request, Response> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut fields);
    if !matches!(parsed.parse(head), Ok(httparse::Status::Complete(_))) {
        return Err(malformed());
    }
    let method = parsed.method.unwrap_or("");
    if method != "GET" && method != "HEAD" {
        return Err(Response::text(
            405,
            &format!("method {method:?} not allowed; use GET or HEAD"),
        )
        .with_header("Allow", "GET, HEAD"));
    }
    let headers: Vec<(String, String)> = parsed
        .headers
        .iter()
        .map(|h| {
            let value = String::from_utf8_lossy(h.value).trim().to_owned();
            (h.name.to_ascii_lowercase(), value)
        })
        .collect();
    for (name, value) in &headers {
        let has_body = match name.as_str() {
            "transfer-encoding" => true,
            "content-length" => match value.parse::<u64>() {
                Ok(len) => len > 0,
                Err(_) => {
                    return Err(Response::text(
                        400,
                        &format!("invalid Content-Length {value:?}; send none"),
                    ))
                }
            },
            _ => false,
        };
        if has_body {
            return Err(Response::text(
                413,
                "request bodies are not accepted; send a GET without a body",
            ));
        }
    }
    let target = origin_form(parsed.path.unwrap_or(""));
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    if !path.starts_with('/') {
        return Err(Response::text(
            400,
            &format!("request target {path:?} is not a path; request e.g. /metrics"),
        ));
    }
    Ok(Request {
        method: method.to_owned(),
        path: path.to_owned(),
        query: parse_query(query)?,
        headers,
        peer,
    })
}

/// `http://host/p?q` (absolute form, sent to proxies) to `/p?q`.
fn origin_form(target: &str) -> &str {
    let lower = target.get(..8).unwrap_or(target).to_ascii_lowercase();
    let rest = if lower.starts_with("http://") {
        &target[7..]
    } else if lower.starts_with("https://") {
        &target[8..]
    } else {
        return target;
    };
    rest.find('/').map_or("/", |i| &rest[i..])
}

fn parse_query(query: &str) -> Result<Vec<(String, String)>, Response> {
    let mut out = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (raw_name, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
        let name = percent_decode(raw_name).ok_or_else(|| bad_param(raw_name))?;
        let value = percent_decode(raw_value).ok_or_else(|| bad_param(&name))?;
        out.push((name, value));
    }
    Ok(out)
}

fn bad_param(name: &str) -> Response {
    // Debug formatting keeps the client's text on one line.
    let name: String = name.chars().take(64).collect();
    Response::text(
        400,
        &format!(
            "bad percent-encoding in query parameter {name:?}; escape bytes as %XX of UTF-8 text"
        ),
    )
}

/// Decodes `application/x-www-form-urlencoded` text: `+` is a space, `%XX` a
/// byte; None for a bad escape or a result that is not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'+' => out.push(b' '),
            b'%' => {
                let hi = hex_digit(*bytes.get(i + 1)?)?;
                let lo = hex_digit(*bytes.get(i + 2)?)?;
                out.push(hi << 4 | lo);
                i += 2;
            }
            _ => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// With a token, everything but `/healthz` (for liveness probes that hold no
/// secrets) needs `Authorization: Bearer <token>`.
fn authorized(req: &Request, token: Option<&str>) -> bool {
    let Some(token) = token else {
        return true;
    };
    if req.path == "/healthz" {
        return true;
    }
    let Some((scheme, given)) = req.header("authorization").and_then(|v| v.split_once(' ')) else {
        return false;
    };
    scheme.eq_ignore_ascii_case("bearer") && ct_eq(given.trim_start().as_bytes(), token.as_bytes())
}

/// Compares without stopping at the first difference, so response timing
/// does not reveal how much of a guessed token was right (only its length).
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // Keeps the optimizer from turning the fold back into an early exit.
    std::hint::black_box(diff) == 0
}

fn send(
    stream: &mut TcpStream,
    resp: &Response,
    head_only: bool,
    deadline: Instant,
) -> io::Result<()> {
    // One buffer, so Nagle never holds a small body back behind the head.
    let mut out = response_head(resp).into_bytes();
    if !head_only {
        out.extend_from_slice(&resp.body);
    }
    write_all_by(stream, &out, deadline)?;
    stream.flush()
}

fn response_head(resp: &Response) -> String {
    let status = if (100..=999).contains(&resp.status) {
        resp.status
    } else {
        500
    };
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Length: {}\r\nConnection: close\r\n",
        reason(status),
        resp.body.len()
    );
    for (name, value) in &resp.headers {
        // Framing is ours, and CR/LF in a field would split the response.
        let framing = ["content-length", "connection", "transfer-encoding"]
            .iter()
            .any(|f| name.eq_ignore_ascii_case(f));
        let broken = name.is_empty()
            || name
                .bytes()
                .chain(value.bytes())
                .any(|b| b == b'\r' || b == b'\n');
        if framing || broken {
            continue;
        }
        head.push_str(name);
        head.push_str(": ");
        head.push_str(value);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    head
}

/// Writes all of `buf` by `deadline`; a per-call timeout alone would let a
/// slow reader hold the worker for as long as it keeps taking a few bytes.
fn write_all_by(stream: &mut TcpStream, mut buf: &[u8], deadline: Instant) -> io::Result<()> {
    while !buf.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ErrorKind::TimedOut.into());
        }
        stream.set_write_timeout(Some(left))?;
        match stream.write(buf) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => buf = buf.get(n..).unwrap_or_default(),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        206 => "Partial Content",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        416 => "Range Not Satisfiable",
        422 => "Unprocessable Content",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct FnHandler<F>(F);

    impl<F: Fn(&Request) -> Response + Send + Sync + 'static> Handler for FnHandler<F> {
        fn handle(&self, req: &Request) -> Response {
            (self.0)(req)
        }
    }

    fn start_with(
        limits: Limits,
        token: Option<&str>,
        f: impl Fn(&Request) -> Response + Send + Sync + 'static,
    ) -> (Server, Arc<Stats>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let stats = Arc::new(Stats::default());
        let server = Server::start(
            listener,
            Arc::new(FnHandler(f)),
            limits,
            token.map(str::to_owned),
            Arc::clone(&stats),
        )
        .unwrap();
        (server, stats)
    }

    fn ok_handler() -> impl Fn(&Request) -> Response + Send + Sync + 'static {
        |req: &Request| Response::text(200, &format!("ok {}", req.path))
    }

    #[derive(Debug)]
    struct Reply {
        status: u16,
        head: String,
        body: String,
    }

    impl Reply {
        fn header(&self, name: &str) -> Option<&str> {
            self.head.lines().skip(1).find_map(|l| {
                let (n, v) = l.split_once(':')?;
                n.eq_ignore_ascii_case(name).then(|| v.trim())
            })
        }
    }

    fn read_reply(stream: &mut TcpStream) -> Reply {
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).unwrap();
        let raw = String::from_utf8(raw).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").expect("no end of head");
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("no status");
        Reply {
            status,
            head: head.to_owned(),
            body: body.to_owned(),
        }
    }

    fn connect(addr: SocketAddr) -> TcpStream {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream
    }

    fn exchange(addr: SocketAddr, raw: &[u8]) -> Reply {
        let mut stream = connect(addr);
        stream.write_all(raw).unwrap();
        read_reply(&mut stream)
    }

    fn get(addr: SocketAddr, target: &str, extra: &str) -> Reply {
        exchange(
            addr,
            format!("GET {target} HTTP/1.1\r\nHost: localhost\r\n{extra}\r\n").as_bytes(),
        )
    }

    /// Threads of this process, or only those whose name starts with `prefix`.
    fn threads(prefix: Option<&str>) -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| match prefix {
                None => true,
                Some(p) => std::fs::read_to_string(e.path().join("comm"))
                    .map(|c| c.starts_with(p))
                    .unwrap_or(false),
            })
            .count()
    }

    #[test]
    fn get_with_query_reaches_handler() {
        let (server, stats) = start_with(Limits::default(), None, |req: &Request| {
            Response::text(
                200,
                &format!(
                    "{} {} a={:?} q={:?} x={:?} peer_loopback={}",
                    req.method,
                    req.path,
                    req.param("a"),
                    req.query,
                    req.header("X-Test"),
                    req.peer.ip().is_loopback()
                ),
            )
            .with_header("X-Served-By", "test")
        });
        let addr = server.local_addr();
        let r = get(
            addr,
            "/echo?a=1&b=hello+world&c=%E2%9C%93%2B&a=2&flag&&d=",
            "X-Test: Foo\r\n",
        );
        assert_eq!(r.status, 200, "{r:?}");
        assert!(r.head.starts_with("HTTP/1.1 200 OK\r\n"), "{r:?}");
        assert_eq!(r.header("connection"), Some("close"));
        assert_eq!(r.header("x-served-by"), Some("test"));
        assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
        assert_eq!(r.header("content-length"), Some(&*r.body.len().to_string()));
        let want = "GET /echo a=Some(\"1\") q=[(\"a\", \"1\"), (\"b\", \"hello world\"), \
                    (\"c\", \"\u{2713}+\"), (\"a\", \"2\"), (\"flag\", \"\"), (\"d\", \"\")] \
                    x=Some(\"Foo\") peer_loopback=true\n";
        assert_eq!(r.body, want);

        // HEAD: same headers, no body.
        let r = exchange(addr, b"HEAD /echo?a=1 HTTP/1.1\r\n\r\n");
        assert_eq!(r.status, 200);
        assert!(r.body.is_empty(), "{r:?}");
        let len: usize = r.header("content-length").unwrap().parse().unwrap();
        assert!(len > 0);

        // Absolute form, as sent to proxies.
        let r = get(addr, "http://localhost/abs?a=3", "");
        assert_eq!(r.status, 200);
        assert!(r.body.starts_with("GET /abs a=Some(\"3\")"), "{r:?}");

        assert_eq!(stats.requests.load(Ordering::Relaxed), 3);
        assert_eq!(stats.bad.load(Ordering::Relaxed), 0);
        server.stop();
    }

    #[test]
    fn bad_query_escapes_are_400_naming_the_parameter() {
        let (server, stats) = start_with(Limits::default(), None, ok_handler());
        let addr = server.local_addr();
        for target in [
            "/x?good=1&seconds=%zz",
            "/x?seconds=%FF",
            "/x?seconds=abc%4",
        ] {
            let r = get(addr, target, "");
            assert_eq!(r.status, 400, "{target}: {r:?}");
            assert!(r.body.contains("\"seconds\""), "{target}: {r:?}");
            assert_eq!(r.body.lines().count(), 1);
        }
        assert_eq!(stats.bad.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn token_required_except_healthz() {
        let (server, stats) = start_with(Limits::default(), Some("s3cret"), ok_handler());
        let addr = server.local_addr();

        let r = get(addr, "/metrics", "");
        assert_eq!(r.status, 401, "{r:?}");
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
        assert_eq!(r.body.lines().count(), 1);
        // Same length, wrong bytes; and a different scheme.
        assert_eq!(
            get(addr, "/metrics", "Authorization: Bearer s3creT\r\n").status,
            401
        );
        assert_eq!(
            get(addr, "/metrics", "Authorization: Basic s3cret\r\n").status,
            401
        );
        assert_eq!(stats.unauthorized.load(Ordering::Relaxed), 3);

        let r = get(addr, "/metrics", "Authorization: Bearer s3cret\r\n");
        assert_eq!((r.status, r.body.as_str()), (200, "ok /metrics\n"));
        let r = get(addr, "/healthz", "");
        assert_eq!((r.status, r.body.as_str()), (200, "ok /healthz\n"));
        assert_eq!(stats.unauthorized.load(Ordering::Relaxed), 3);

        let empty = Server::start(
            TcpListener::bind("127.0.0.1:0").unwrap(),
            Arc::new(FnHandler(ok_handler())),
            Limits::default(),
            Some(String::new()),
            Arc::new(Stats::default()),
        );
        assert!(empty.is_err());
    }

    #[test]
    fn methods_and_bodies_refused() {
        let (server, stats) = start_with(Limits::default(), None, ok_handler());
        let addr = server.local_addr();
        let r = exchange(
            addr,
            b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
        );
        assert_eq!(r.status, 405, "{r:?}");
        assert_eq!(r.header("allow"), Some("GET, HEAD"));
        assert_eq!(exchange(addr, b"DELETE / HTTP/1.1\r\n\r\n").status, 405);
        let r = exchange(addr, b"GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello");
        assert_eq!(r.status, 413, "{r:?}");
        let r = exchange(
            addr,
            b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        );
        assert_eq!(r.status, 413, "{r:?}");
        assert_eq!(
            exchange(addr, b"GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n").status,
            200
        );
        assert_eq!(stats.bad.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn oversized_head_is_431() {
        let (server, stats) = start_with(Limits::default(), None, ok_handler());
        let filler = "a".repeat(10_000);
        let r = get(
            server.local_addr(),
            "/metrics",
            &format!("X-Big: {filler}\r\n"),
        );
        assert_eq!(r.status, 431, "{r:?}");
        assert!(r.body.contains("8192"), "{r:?}");
        let many: String = (0..MAX_HEADERS + 1)
            .map(|i| format!("X-{i}: v\r\n"))
            .collect();
        assert_eq!(get(server.local_addr(), "/", &many).status, 431);
        assert_eq!(stats.bad.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn garbage_is_400() {
        let (server, stats) = start_with(Limits::default(), None, ok_handler());
        let addr = server.local_addr();
        // No head terminator: answered at once, not after the read timeout.
        let started = Instant::now();
        let r = exchange(addr, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03");
        assert_eq!(r.status, 400, "{r:?}");
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(r.body.starts_with("malformed request"), "{r:?}");
        assert_eq!(exchange(addr, b"this is not http\r\n\r\n").status, 400);
        assert_eq!(exchange(addr, b"GET metrics HTTP/1.1\r\n\r\n").status, 400);
        assert_eq!(stats.bad.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn slow_head_is_408() {
        let limits = Limits {
            read_timeout: Duration::from_millis(300),
            ..Limits::default()
        };
        let (server, stats) = start_with(limits, None, ok_handler());
        let mut stream = connect(server.local_addr());
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            .unwrap();
        let r = read_reply(&mut stream);
        assert_eq!(r.status, 408, "{r:?}");
        assert_eq!(stats.bad.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn handler_panic_is_500_and_worker_survives() {
        let limits = Limits {
            workers: 1,
            ..Limits::default()
        };
        let (server, _) = start_with(limits, None, |req: &Request| {
            if req.path == "/boom" {
                panic!("test panic (expected)");
            }
            Response::text(200, "fine")
        });
        let addr = server.local_addr();
        assert_eq!(get(addr, "/boom", "").status, 500);
        assert_eq!(get(addr, "/", "").status, 200);
        assert_eq!(get(addr, "/boom", "").status, 500);
        assert_eq!(get(addr, "/", "").status, 200);
    }

    #[test]
    fn storm_gets_200_or_503_with_bounded_threads() {
        let limits = Limits {
            workers: 2,
            queue: 2,
            ..Limits::default()
        };
        let total_before = threads(None);
        let (server, stats) = start_with(limits, None, |_: &Request| {
            thread::sleep(Duration::from_millis(300));
            Response::text(200, "slow ok")
        });
        let addr = server.local_addr();
        let prefix = format!("http{}-", addr.port());
        // A new thread names itself once it runs: wait for that.
        let waited = Instant::now();
        while threads(Some(&prefix)) < 3 && waited.elapsed() < Duration::from_secs(2) {
            thread::sleep(Duration::from_millis(5));
        }
        let ours_idle = threads(Some(&prefix));

        // All clients on this thread, so the only new threads are the server's.
        let mut conns: Vec<TcpStream> = (0..20)
            .map(|_| {
                let mut s = connect(addr);
                s.write_all(b"GET /debug/pprof/profile?seconds=1 HTTP/1.1\r\n\r\n")
                    .unwrap();
                s
            })
            .collect();
        thread::sleep(Duration::from_millis(100));
        let ours_during = threads(Some(&prefix));
        let total_during = threads(None);

        let statuses: Vec<u16> = conns.iter_mut().map(|s| read_reply(s).status).collect();
        let ok = statuses.iter().filter(|&&s| s == 200).count();
        let busy = statuses.iter().filter(|&&s| s == 503).count();
        assert_eq!(ok + busy, 20, "{statuses:?}");
        assert!(busy >= 1, "{statuses:?}");
        assert!(ok >= 2, "{statuses:?}");
        assert_eq!(stats.busy.load(Ordering::Relaxed), busy as u64);
        assert_eq!(stats.requests.load(Ordering::Relaxed), ok as u64);
        // Two workers and the accept thread, however many connections.
        assert_eq!(ours_idle, 3);
        assert_eq!(
            ours_during, 3,
            "process threads {total_before} before, {total_during} during"
        );

        let started = Instant::now();
        server.stop();
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(threads(Some(&prefix)), 0);
    }

    #[test]
    fn stop_is_prompt_when_idle() {
        let (server, _) = start_with(Limits::default(), None, ok_handler());
        let addr = server.local_addr();
        assert_eq!(get(addr, "/", "").status, 200);
        thread::sleep(Duration::from_millis(50));
        let started = Instant::now();
        server.stop();
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        assert!(
            TcpStream::connect(addr).is_err(),
            "still listening after stop"
        );

        // Drop stops too.
        let (server, _) = start_with(Limits::default(), None, ok_handler());
        let prefix = format!("http{}-", server.local_addr().port());
        let started = Instant::now();
        drop(server);
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(threads(Some(&prefix)), 0);
    }

    #[test]
    fn stop_finishes_the_request_in_hand() {
        let (server, _) = start_with(Limits::default(), None, |_: &Request| {
            thread::sleep(Duration::from_millis(300));
            Response::text(200, "done")
        });
        let mut stream = connect(server.local_addr());
        stream.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        thread::sleep(Duration::from_millis(100));
        server.stop();
        let r = read_reply(&mut stream);
        assert_eq!((r.status, r.body.as_str()), (200, "done\n"));
    }

    #[test]
    fn decoding_and_comparison() {
        assert_eq!(percent_decode("a+b%20c%2b").as_deref(), Some("a b c+"));
        assert_eq!(percent_decode("%C3%A9").as_deref(), Some("\u{e9}"));
        assert_eq!(percent_decode(""), Some(String::new()));
        assert_eq!(percent_decode("%"), None);
        assert_eq!(percent_decode("%4"), None);
        assert_eq!(percent_decode("%g0"), None);
        assert_eq!(percent_decode("%C3"), None);
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"abcd"));
        assert_eq!(origin_form("HTTP://h:1/p?q"), "/p?q");
        assert_eq!(origin_form("http://h"), "/");
        assert_eq!(origin_form("/p"), "/p");
        assert_eq!(reason(431), "Request Header Fields Too Large");
    }
}
