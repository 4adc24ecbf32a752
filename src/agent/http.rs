//! The agent's HTTP front: `/metrics`, `/healthz`,
//! `/debug/pprof/profile?seconds=N` and `/debug/pprof/recent`, served by
//! hyper on a tokio runtime of its own thread.
//!
//! What a careless or hostile client could hold is bounded by hyper and
//! tokio, not by threads: every connection is a task, so slow ones cost
//! memory, not the cheap endpoints' answers. Each request head must arrive
//! within `header_timeout` of the connection's start (or of the previous
//! response), a client that takes no bytes of a response for
//! `write_timeout` is dropped, connections are capped (over the cap: 503),
//! and profile requests, which hold the BPF thread's attention, are capped
//! separately (over the cap: 429). A request whose client goes away is
//! dropped by hyper, and with it the profile's reply channel: the BPF
//! thread sees that and forgets the request.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::TrySendError;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_LENGTH, TRANSFER_ENCODING};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{oneshot, watch, Semaphore};

use super::config::HttpConfig;
use super::{ProfileRequest, Selection, Shared};
use crate::render::exposition::{self, Format};

type Body = Full<Bytes>;

/// Counters for the agent's own metrics.
#[derive(Debug, Default)]
pub struct Stats {
    /// Requests answered, any status.
    pub requests: AtomicU64,
    /// Connections refused with 503: `max_connections` open already.
    pub refused_connections: AtomicU64,
    /// Profile requests refused with 429: `max_profiles` in progress.
    pub refused_profiles: AtomicU64,
    /// Malformed or refused requests: 400, 405, 413.
    pub bad: AtomicU64,
    /// Requests refused with 401 (missing or wrong bearer token).
    pub unauthorized: AtomicU64,
    /// Profile requests whose client went away before the answer.
    pub cancelled: AtomicU64,
    /// Profile requests holding a slot now (a gauge).
    pub profiles_in_progress: AtomicU64,
}

/// Counts a profile request in progress for as long as it holds its slot,
/// however its task ends (answered, or dropped with its client).
struct InProgress<'a>(&'a AtomicU64);

impl<'a> InProgress<'a> {
    fn new(n: &'a AtomicU64) -> Self {
        n.fetch_add(1, Ordering::Relaxed);
        Self(n)
    }
}

impl Drop for InProgress<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What every request's task shares.
struct Ctx {
    shared: Arc<Shared>,
    token: Option<String>,
    profiles: Arc<Semaphore>,
}

/// A running server; stopped by `stop()` or on drop.
pub struct Server {
    addr: SocketAddr,
    stop: watch::Sender<Option<Duration>>,
    /// Gives the listening socket back when the server stops.
    thread: Option<JoinHandle<Option<std::net::TcpListener>>>,
}

impl Server {
    /// Serves on `listener` until stopped.
    pub fn start(
        listener: std::net::TcpListener,
        cfg: &HttpConfig,
        token: Option<String>,
        shared: Arc<Shared>,
    ) -> std::io::Result<Server> {
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        // Two workers: one busy encoding a large /metrics does not hold
        // up /healthz.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("bpfscope-http")
            .enable_io()
            .enable_time()
            .build()?;
        let (stop, stopped) = watch::channel(None);
        let ctx = Arc::new(Ctx {
            shared,
            token,
            profiles: Arc::new(Semaphore::new(cfg.max_profiles)),
        });
        let cfg = cfg.clone();
        let thread = std::thread::Builder::new()
            .name("bpfscope-accept".into())
            .spawn(move || {
                let listener = rt.block_on(async move {
                    match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => serve(l, cfg, ctx, stopped).await,
                        Err(e) => {
                            eprintln!("bpfscope: HTTP server: {e}");
                            None
                        }
                    }
                });
                // Tasks still running (a response to a client that does not
                // read) are cut off here.
                rt.shutdown_timeout(Duration::from_millis(100));
                listener
            })?;
        Ok(Server {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting; requests in progress get `grace` to finish. The
    /// listening socket comes back, for a server that replaces this one
    /// on the same address (the address is never free in between).
    pub fn stop(mut self, grace: Duration) -> Option<std::net::TcpListener> {
        self.shutdown(grace)
    }

    fn shutdown(&mut self, grace: Duration) -> Option<std::net::TcpListener> {
        let _ = self.stop.send(Some(grace));
        self.thread.take().and_then(|t| t.join().ok().flatten())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.shutdown(Duration::ZERO);
    }
}

async fn serve(
    listener: tokio::net::TcpListener,
    cfg: HttpConfig,
    ctx: Arc<Ctx>,
    mut stopped: watch::Receiver<Option<Duration>>,
) -> Option<std::net::TcpListener> {
    let conns = Arc::new(Semaphore::new(cfg.max_connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(cfg.header_timeout)
        .keep_alive(true)
        // The smallest hyper allows: request heads here are a line and a
        // few headers; longer ones are answered 431.
        .max_buf_size(8192)
        .max_headers(64);
    let grace = loop {
        tokio::select! {
            changed = stopped.changed() => {
                break match changed {
                    Ok(()) => (*stopped.borrow()).unwrap_or_default(),
                    Err(_) => Duration::ZERO,
                };
            }
            accepted = listener.accept() => {
                let (stream, _peer) = match accepted {
                    Ok(a) => a,
                    Err(_) => {
                        // Out of descriptors or memory: back off instead of spinning.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(permit) = conns.clone().try_acquire_owned() else {
                    ctx.shared.http.refused_connections.fetch_add(1, Ordering::Relaxed);
                    tokio::spawn(refuse(stream, cfg.max_connections));
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let mut io = tokio_io_timeout::TimeoutStream::new(stream);
                io.set_write_timeout(Some(cfg.write_timeout));
                let io = TokioIo::new(Box::pin(io));
                let c = ctx.clone();
                let svc = hyper::service::service_fn(move |req| handle(req, c.clone()));
                let conn = graceful.watch(http.serve_connection(io, svc));
                tokio::spawn(async move {
                    let _ = conn.await;
                    drop(permit);
                });
            }
        }
    };
    let listener = listener.into_std().ok();
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(grace) => {}
    }
    listener
}

/// Answers a connection over the cap at once, without reading a request.
async fn refuse(mut stream: tokio::net::TcpStream, max: usize) {
    let body = format!("server busy: {max} connections are open; retry in a second\n");
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Retry-After: 1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let write = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await?;
        // What the client still sends is read, so that closing does not
        // turn into a reset that destroys the answer in flight.
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<(), std::io::Error>(())
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), write).await;
}

fn text(status: StatusCode, msg: &str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(format!("{msg}\n"))));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn with(mut r: Response<Body>, name: &'static str, value: &str) -> Response<Body> {
    if let Ok(v) = HeaderValue::from_str(value) {
        r.headers_mut().insert(name, v);
    }
    r
}

/// An error `go tool pprof` prints (it shows the body of text/plain
/// answers that carry X-Go-Pprof).
fn pprof_error(status: StatusCode, msg: &str) -> Response<Body> {
    with(text(status, msg), "x-go-pprof", "1")
}

fn pprof_body(body: Arc<Vec<u8>>) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from_owner(ArcBytes(body))));
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    r.headers_mut().insert(
        hyper::header::CONTENT_DISPOSITION,
        HeaderValue::from_static("attachment; filename=\"profile\""),
    );
    r.headers_mut().insert(
        hyper::header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

/// A profile shared by every request it answers, sent without a copy.
struct ArcBytes(Arc<Vec<u8>>);

impl AsRef<[u8]> for ArcBytes {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

async fn handle(req: Request<Incoming>, ctx: Arc<Ctx>) -> Result<Response<Body>, Infallible> {
    let stats = &ctx.shared.http;
    stats.requests.fetch_add(1, Ordering::Relaxed);
    let r = route(&req, &ctx).await;
    match r.status() {
        StatusCode::BAD_REQUEST
        | StatusCode::METHOD_NOT_ALLOWED
        | StatusCode::PAYLOAD_TOO_LARGE => {
            stats.bad.fetch_add(1, Ordering::Relaxed);
        }
        StatusCode::UNAUTHORIZED => {
            stats.unauthorized.fetch_add(1, Ordering::Relaxed);
        }
        _ => {}
    }
    Ok(r)
}

async fn route(req: &Request<Incoming>, ctx: &Ctx) -> Response<Body> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return with(
            text(
                StatusCode::METHOD_NOT_ALLOWED,
                &format!("{} is not served here: use GET", req.method()),
            ),
            "allow",
            "GET, HEAD",
        );
    }
    // No path takes a body: one sent is refused (and the connection closed,
    // so its bytes are never read as a request).
    let has_body = req.headers().contains_key(TRANSFER_ENCODING)
        || req
            .headers()
            .get(CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0");
    if has_body {
        return with(
            text(StatusCode::PAYLOAD_TOO_LARGE, "requests here have no body"),
            "connection",
            "close",
        );
    }
    let path = req.uri().path();
    let query: Vec<(String, String)> =
        form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
    if path != "/healthz" && !authorized(req, ctx.token.as_deref()) {
        return with(
            text(
                StatusCode::UNAUTHORIZED,
                "give the agent's token as Authorization: Bearer TOKEN",
            ),
            "www-authenticate",
            "Bearer",
        );
    }
    match path {
        "/healthz" => text(StatusCode::OK, "ok"),
        // Parameters are ignored: a scraper's `params:` must not break it.
        "/metrics" => metrics(req, ctx),
        "/debug/pprof/profile" => profile(&query, ctx).await,
        "/debug/pprof/recent" => recent(&query, ctx),
        "/" => text(
            StatusCode::OK,
            "bpfscope agent: /metrics /debug/pprof/profile?seconds=N /debug/pprof/recent /healthz",
        ),
        p => text(
            StatusCode::NOT_FOUND,
            &format!("no such path {p}; try /metrics or /debug/pprof/profile"),
        ),
    }
}

/// With a token, everything but `/healthz` (for liveness probes that hold
/// no secrets) needs `Authorization: Bearer <token>`.
fn authorized(req: &Request<Incoming>, token: Option<&str>) -> bool {
    let Some(token) = token else {
        return true;
    };
    let Some(given) = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    ct_eq(given.trim().as_bytes(), token.as_bytes())
}

/// Compares without stopping at the first difference, so response timing
/// does not reveal how much of a guessed token was right (only its length).
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn metrics(req: &Request<Incoming>, ctx: &Ctx) -> Response<Body> {
    let format = Format::from_accept(req.headers().get(ACCEPT).and_then(|v| v.to_str().ok()));
    let fams = ctx.shared.families_now();
    match exposition::render(fams, format) {
        Ok(t) => {
            let mut r = Response::new(Full::new(Bytes::from(t)));
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                HeaderValue::from_static(format.content_type()),
            );
            r
        }
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, &format!("{e:#}")),
    }
}

fn param<'a>(q: &'a [(String, String)], name: &str) -> Option<&'a str> {
    q.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

async fn profile(q: &[(String, String)], ctx: &Ctx) -> Response<Body> {
    const KNOWN: [&str; 4] = ["seconds", "pid", "comm", "cgroup"];
    if let Some((k, _)) = q.iter().find(|(k, _)| !KNOWN.contains(&k.as_str())) {
        return pprof_error(
            StatusCode::BAD_REQUEST,
            &format!(
                "unknown parameter '{k}'; this path takes {}",
                KNOWN.join(", ")
            ),
        );
    }
    let shared = &ctx.shared;
    if !shared.profiling() {
        return pprof_error(
            StatusCode::NOT_FOUND,
            "profiling is off: set profile hz above 0",
        );
    }
    let max = shared.max_seconds();
    let seconds = match param(q, "seconds") {
        None => 30.min(max),
        Some(s) => match s.parse::<u64>() {
            Ok(n) if (1..=max).contains(&n) => n,
            _ => {
                return pprof_error(
                    StatusCode::BAD_REQUEST,
                    &format!("seconds={s}: give a whole number from 1 to {max}"),
                )
            }
        },
    };
    let pid = match param(q, "pid").map(str::parse::<u32>) {
        None => None,
        Some(Ok(p)) if p > 0 => Some(p),
        Some(_) => {
            return pprof_error(
                StatusCode::BAD_REQUEST,
                "pid: give a process id (a positive number)",
            )
        }
    };
    let comm = param(q, "comm").map(str::to_string);
    if comm.as_ref().is_some_and(|c| c.is_empty() || c.len() > 15) {
        return pprof_error(
            StatusCode::BAD_REQUEST,
            "comm: give a process or thread name of 1 to 15 bytes",
        );
    }
    let cgroup = param(q, "cgroup").map(str::to_string);
    if cgroup.as_ref().is_some_and(|c| !c.starts_with('/')) {
        return pprof_error(
            StatusCode::BAD_REQUEST,
            "cgroup: give a cgroup path starting with /, e.g. /system.slice",
        );
    }
    // Held until the answer is sent or the client goes away.
    let Ok(_permit) = ctx.profiles.clone().try_acquire_owned() else {
        shared.http.refused_profiles.fetch_add(1, Ordering::Relaxed);
        return with(
            pprof_error(
                StatusCode::TOO_MANY_REQUESTS,
                "too many profiles in progress; retry when one has finished",
            ),
            "retry-after",
            &seconds.to_string(),
        );
    };
    let _counted = InProgress::new(&shared.http.profiles_in_progress);
    let (tx, rx) = oneshot::channel();
    let r = ProfileRequest {
        seconds,
        arrived_ns: crate::profile::continuous::now_ns(),
        sel: Selection { pid, comm, cgroup },
        reply: tx,
    };
    let why = match shared.hand_over(r) {
        Ok(()) => None,
        Err(TrySendError::Full(_)) => Some("too many profiles in progress; retry later"),
        Err(TrySendError::Disconnected(_)) => Some("the agent is stopping"),
    };
    if let Some(why) = why {
        return with(
            pprof_error(StatusCode::SERVICE_UNAVAILABLE, why),
            "retry-after",
            "1",
        );
    }
    match tokio::time::timeout(Duration::from_secs(seconds + 30), rx).await {
        Ok(Ok(Ok(body))) => pprof_body(body),
        Ok(Ok(Err(e))) => pprof_error(StatusCode::INTERNAL_SERVER_ERROR, &e),
        Ok(Err(_)) => with(
            pprof_error(StatusCode::SERVICE_UNAVAILABLE, "the agent is stopping"),
            "retry-after",
            "1",
        ),
        Err(_) => pprof_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the profile was not ready in time",
        ),
    }
}

fn recent(q: &[(String, String)], ctx: &Ctx) -> Response<Body> {
    if let Some((k, _)) = q.first() {
        return pprof_error(
            StatusCode::BAD_REQUEST,
            &format!(
                "{k}: /debug/pprof/recent is the whole host's last window and takes no \
                 parameters; for one process, ask /debug/pprof/profile?seconds=N&pid=PID"
            ),
        );
    }
    match ctx.shared.recent() {
        Some(b) => pprof_body(b),
        None => pprof_error(
            StatusCode::NOT_FOUND,
            &format!(
                "no window has finished yet (windows are {} s); try again then",
                ctx.shared.window_s()
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_comparison() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
    }
}
