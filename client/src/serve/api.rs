//! The routes, their access checks and their errors.
//!
//! (One file: the whole HTTP surface, each route beside the checks it
//! makes; that is why it is long.)

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Path, Request, State as Extract};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use tokio::io::AsyncRead;

use super::range::{Wanted, wanted};
use super::{Grant, HeldPins, Tokens};
use crate::{Error, ErrorKind, Key, Store, outboard};

pub(super) struct State {
    pub(super) store: Store,
    pub(super) tokens: Tokens,
    pub(super) pins: HeldPins,
    pub(super) pin_hold: Duration,
    pub(super) max_held_pins: usize,
    pub(super) max_body: u64,
    pub(super) idle: Duration,
    /// The slowest average body rate past `idle`, bytes a second.
    pub(super) min_rate: u64,
}

type Shared = Arc<State>;

/// An error as the API answers it: a status and a stable code, with a
/// message for people. The codes are an interface: never renamed.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    /// Seconds to wait before retrying (`Retry-After`), when known.
    retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    /// The stable code, e.g. `"hash_mismatch"`.
    pub fn code(&self) -> &'static str {
        self.code
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> ApiError {
        let (status, code) = match (&e, e.kind()) {
            (Error::NotFound { .. }, _) => (StatusCode::NOT_FOUND, "not_found"),
            (Error::HashMismatch { .. }, _) => (StatusCode::UNPROCESSABLE_ENTITY, "hash_mismatch"),
            (Error::InvalidKey(_), _) => (StatusCode::BAD_REQUEST, "bad_key"),
            (Error::InvalidRange { .. }, _) => {
                (StatusCode::RANGE_NOT_SATISFIABLE, "range_not_satisfiable")
            }
            (Error::TooLarge { .. }, _) => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
            (Error::Input { source, .. }, _) => match source.kind() {
                std::io::ErrorKind::FileTooLarge => {
                    (StatusCode::PAYLOAD_TOO_LARGE, "body_too_large")
                }
                std::io::ErrorKind::TimedOut => (StatusCode::REQUEST_TIMEOUT, "body_timeout"),
                _ => (StatusCode::BAD_REQUEST, "bad_body"),
            },
            (Error::ReadOnly { .. }, _) => (StatusCode::FORBIDDEN, "read_only"),
            (_, ErrorKind::Corrupt) => (StatusCode::INTERNAL_SERVER_ERROR, "corrupt"),
            (_, ErrorKind::Lost) => (StatusCode::INTERNAL_SERVER_ERROR, "lost"),
            (_, ErrorKind::Unavailable | ErrorKind::Conflict | ErrorKind::Closed) => {
                (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
            }
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        if status.is_server_error() {
            // The detail (paths, database text) goes to the log only.
            tracing::warn!(error = %e, code, "request failed");
            return ApiError::new(
                status,
                code,
                "the server could not answer; its log has the detail",
            );
        }
        ApiError::new(status, code, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error": {"code": self.code, "message": self.message}});
        let mut r = (self.status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

type ApiResult<T = Response> = std::result::Result<T, ApiError>;

pub(super) fn router(state: Shared) -> Router {
    Router::new()
        .route("/blobs", post(post_blob).get(list_blobs))
        .route("/blobs/{key}", get(get_blob).put(put_blob))
        // An outboard is 1/256 of its blob: up to 256 MiB (a 64 GiB blob).
        .route(
            "/blobs/{key}/outboard",
            get(get_outboard)
                .put(put_outboard)
                .layer(axum::extract::DefaultBodyLimit::max(256 << 20)),
        )
        .route("/blobs/{key}/bao", get(get_bao))
        .route("/pins/{id}", delete(delete_pin))
        .fallback(|| async {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "no_route",
                "no such route: see `alkblobs serve --help`",
            )
        })
        .method_not_allowed_fallback(|method: Method| async move {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                format!("{method} is not served on this route: see `alkblobs serve --help`"),
            )
        })
        .layer(axum::middleware::from_fn(refuse_ambiguous))
        .layer(axum::middleware::from_fn(access_log))
        .with_state(state)
}

/// Refuses what HTTP/1.1 leaves ambiguous before any handler sees it: two
/// `Host` headers (RFC 9112, 3.2: 400), and a transfer coding other than
/// `chunked` (the body would be stored still encoded: 501, RFC 9112, 6.1).
async fn refuse_ambiguous(req: Request, next: Next) -> Response {
    if req.headers().get_all(header::HOST).iter().count() > 1 {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "a request has one Host header",
        )
        .into_response();
    }
    // Exactly `chunked`, once (empty list elements ignored, RFC 9110,
    // 5.6.1): hyper decodes one chunked layer, so `chunked, chunked` would
    // store the body still chunk-encoded.
    let tes = req.headers().get_all(header::TRANSFER_ENCODING);
    if tes.iter().next().is_some() {
        let codings: Vec<String> = tes
            .iter()
            .flat_map(|v| v.to_str().unwrap_or("?").split(','))
            .map(|c| c.trim().to_ascii_lowercase())
            .filter(|c| !c.is_empty())
            .collect();
        if codings != ["chunked"] {
            return ApiError::new(
                StatusCode::NOT_IMPLEMENTED,
                "unsupported_transfer_coding",
                format!("transfer coding {:?} is not supported: send the body chunked (once) or with a Content-Length", codings.join(", ")),
            )
            .into_response();
        }
    }
    next.run(req).await
}

/// One line per request through `tracing` (target `alkblobs::access`).
async fn access_log(req: Request, next: Next) -> Response {
    let start = Instant::now();
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.to_string())
        .unwrap_or_default();
    let r = next.run(req).await;
    tracing::info!(target: "alkblobs::access", %peer, %method, %path,
        status = r.status().as_u16(), micros = start.elapsed().as_micros() as u64);
    r
}

/// Who may do `need`: a bearer token's grant, or with no tokens
/// configured, a loopback client.
fn authorize(s: &State, headers: &HeaderMap, peer: SocketAddr, need: Grant) -> ApiResult<()> {
    if s.tokens.is_empty() {
        // A reverse proxy on this host makes every client look like
        // loopback: a forwarded request needs a token.
        let forwarded = ["forwarded", "x-forwarded-for", "via"]
            .iter()
            .any(|h| headers.contains_key(*h));
        if peer.ip().is_loopback() && !forwarded {
            return Ok(());
        }
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "loopback_only",
            "this server has no tokens (--token-file) and serves loopback clients only, not forwarded requests",
        ));
    }
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        // (The scheme is case-insensitive: RFC 9110, 11.1.)
        .and_then(|v| {
            let (scheme, token) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then_some(token)
        })
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "a bearer token is required",
            )
        })?;
    match s.tokens.grant(token.trim()) {
        None => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "unknown token",
        )),
        Some(g) if g < need => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "this token grants reads only",
        )),
        Some(_) => Ok(()),
    }
}

fn parse_key(s: &str) -> ApiResult<Key> {
    s.parse::<Key>().map_err(|e| Error::from(e).into())
}

fn etag(key: &Key) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{key}\"")).expect("hex is a valid header value")
}

/// Whether an `If-None-Match` / `If-Match` list names this entity.
fn matches(list: &str, key: &Key) -> bool {
    let tag = format!("\"{key}\"");
    list.split(',')
        .map(str::trim)
        .any(|t| t == "*" || t == tag || t.strip_prefix("W/") == Some(tag.as_str()))
}

fn header_str(h: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// A blob's answers are immutable either way; shared caches may keep them
/// only when nobody needs a token to read them.
fn cache_control(s: &State) -> HeaderValue {
    HeaderValue::from_static(if s.tokens.is_empty() {
        "public, max-age=31536000, immutable"
    } else {
        "private, max-age=31536000, immutable"
    })
}

async fn get_blob(
    Extract(s): Extract<Shared>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(key): Path<String>,
    method: Method,
    headers: HeaderMap,
) -> ApiResult {
    authorize(&s, &headers, peer, Grant::Read)?;
    let key = parse_key(&key)?;
    let meta = s.store.stat(&key).await?.ok_or(Error::NotFound { key })?;
    let size = meta.size;
    let mut out = HeaderMap::new();
    out.insert(header::ETAG, etag(&key));
    out.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    out.insert(header::CACHE_CONTROL, cache_control(&s));
    if let Some(m) = header_str(&headers, header::IF_MATCH)
        && !matches(m, &key)
    {
        return Ok((StatusCode::PRECONDITION_FAILED, out).into_response());
    }
    if let Some(m) = header_str(&headers, header::IF_NONE_MATCH)
        && matches(m, &key)
    {
        // The 200's length (a HEAD's 304 would otherwise say 0: a 304
        // carries no length unless it is the 200's, RFC 9110, 8.6).
        out.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
        return Ok((StatusCode::NOT_MODIFIED, out).into_response());
    }
    // If-Range with another validator: the whole blob.
    let range = match header_str(&headers, header::IF_RANGE) {
        Some(v) if v.trim() != format!("\"{key}\"") => None,
        _ => header_str(&headers, header::RANGE),
    };
    let (status, offset, len) = match wanted(range, size) {
        Wanted::Whole => (StatusCode::OK, 0, size),
        Wanted::Part(o, l) => {
            let v = format!("bytes {o}-{}/{size}", o + l - 1);
            out.insert(
                header::CONTENT_RANGE,
                HeaderValue::from_str(&v).expect("ascii"),
            );
            (StatusCode::PARTIAL_CONTENT, o, l)
        }
        Wanted::Unsatisfiable => {
            let v = format!("bytes */{size}");
            out.insert(
                header::CONTENT_RANGE,
                HeaderValue::from_str(&v).expect("ascii"),
            );
            let e = ApiError::new(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "range_not_satisfiable",
                format!("blob {key} has {size} bytes"),
            );
            return Ok((out, e).into_response());
        }
    };
    out.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    out.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    if method == Method::HEAD {
        return Ok((status, out).into_response());
    }
    // Every byte sent was checked against the key first (through the
    // outboard): damage cuts the response short rather than sending it.
    let reader = s
        .store
        .open_range_verified(&key, offset, len)
        .await?
        .ok_or(Error::NotFound { key })?;
    let body = Body::from_stream(tokio_util::io::ReaderStream::with_capacity(
        reader,
        256 << 10,
    ));
    Ok((status, out, body).into_response())
}

/// `GET /blobs/{key}/bao?range=START-END`: the range (END inclusive;
/// `START-` and `-N` too; the whole blob without `range`) in BLAKE3's tree
/// encoding, which a client verifies as it reads ([`crate::bao`]). The
/// blob's size and the range encoded are in headers (`Alkblobs-Size`,
/// `Alkblobs-Range: bytes START-END/SIZE`): the decoder needs them.
async fn get_bao(
    Extract(s): Extract<Shared>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(key): Path<String>,
    axum::extract::Query(q): axum::extract::Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> ApiResult {
    authorize(&s, &headers, peer, Grant::Read)?;
    let key = parse_key(&key)?;
    let meta = s.store.stat(&key).await?.ok_or(Error::NotFound { key })?;
    let size = meta.size;
    let range = match q.get("range") {
        None => 0..size,
        Some(r) => match wanted(Some(&format!("bytes={r}")), size) {
            Wanted::Part(o, l) => o..o + l,
            Wanted::Unsatisfiable => {
                return Err(ApiError::new(
                    StatusCode::RANGE_NOT_SATISFIABLE,
                    "range_not_satisfiable",
                    format!("blob {key} has {size} bytes"),
                ));
            }
            Wanted::Whole => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "bad_range",
                    "range must be START-END (END inclusive), START- or -N",
                ));
            }
        },
    };
    let enc = s
        .store
        .bao_encode_entry(&meta, range)
        .await?
        .ok_or(Error::NotFound { key })?;
    let mut out = HeaderMap::new();
    out.insert(header::ETAG, etag(&key));
    out.insert(header::CACHE_CONTROL, cache_control(&s));
    out.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(crate::bao::MEDIA_TYPE),
    );
    out.insert("alkblobs-size", HeaderValue::from(size));
    let r = if enc.range.is_empty() {
        format!("bytes */{size}")
    } else {
        format!("bytes {}-{}/{size}", enc.range.start, enc.range.end - 1)
    };
    out.insert("alkblobs-range", HeaderValue::from_str(&r).expect("ascii"));
    Ok((StatusCode::OK, out, Body::from_stream(enc.body)).into_response())
}

async fn get_outboard(
    Extract(s): Extract<Shared>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> ApiResult {
    authorize(&s, &headers, peer, Grant::Read)?;
    let key = parse_key(&key)?;
    let no_outboard = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "no_outboard",
            format!(
                "blob {key} has no stored outboard (absent, in the kv tier, or stored before outboards)"
            ),
        )
    };
    let large = s.store.large().ok_or_else(no_outboard)?;
    let size = large.size(&key).await?.ok_or_else(no_outboard)?;
    let len = outboard::outboard_len(size);
    let (status, offset, n, range) = match wanted(header_str(&headers, header::RANGE), len) {
        Wanted::Whole => (StatusCode::OK, 0, len, None),
        Wanted::Part(o, l) => (
            StatusCode::PARTIAL_CONTENT,
            o,
            l,
            Some(format!("bytes {o}-{}/{len}", o + l - 1)),
        ),
        Wanted::Unsatisfiable => {
            return Err(ApiError::new(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "range_not_satisfiable",
                format!("the outboard of {key} has {len} bytes"),
            ));
        }
    };
    // A window at a time (an outboard is up to 1/256 of its blob; a
    // window is that of 16 MiB of it): the first read before answering, so
    // a missing outboard is a 404.
    const WINDOW: u64 = 64 << 10;
    let first = if n == 0 {
        Bytes::new()
    } else {
        large
            .read_outboard(&key, offset, n.min(WINDOW))
            .await?
            .ok_or_else(no_outboard)?
    };
    let large = large.clone();
    let end = offset + n;
    let rest = futures::stream::try_unfold(offset + first.len() as u64, move |at| {
        let large = large.clone();
        async move {
            if at >= end {
                return Ok(None);
            }
            match large.read_outboard(&key, at, (end - at).min(WINDOW)).await {
                Ok(Some(b)) if !b.is_empty() => Ok(Some((b.clone(), at + b.len() as u64))),
                Ok(_) => Err(std::io::Error::other(format!(
                    "the outboard of {key} ended early"
                ))),
                Err(e) => Err(std::io::Error::other(e)),
            }
        }
    });
    let body = Body::from_stream(futures::stream::once(async { Ok(first) }).chain(rest));
    let mut out = HeaderMap::new();
    out.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
    if let Some(r) = range {
        out.insert(
            header::CONTENT_RANGE,
            HeaderValue::from_str(&r).expect("ascii"),
        );
    }
    out.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    Ok((status, out, body).into_response())
}

/// A request body as a reader: at most `max` bytes (more is
/// `FileTooLarge`), each chunk within `idle` of the last, and on average
/// at least `min_rate` bytes a second once it has run for `idle` (else
/// `TimedOut`).
fn body_reader(
    body: Body,
    max: u64,
    idle: Duration,
    min_rate: u64,
) -> impl AsyncRead + Unpin + Send {
    let mut seen = 0u64;
    let stream = IdleCut {
        inner: Box::pin(body.into_data_stream().map_err(std::io::Error::other)),
        idle,
        timer: Box::pin(tokio::time::sleep(idle)),
        waiting_since: None,
        waited: Duration::ZERO,
        min_rate,
        got: 0,
    }
    .map(move |r| {
        let chunk = r?;
        seen += chunk.len() as u64;
        if seen > max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                format!("the body is over the server's limit of {max} bytes"),
            ));
        }
        Ok(chunk)
    });
    tokio_util::io::StreamReader::new(stream)
}

/// A stream that fails with `TimedOut` when its source sends nothing for
/// `idle`, or less than `min_rate` bytes a second on average once it has
/// been waited on for `idle` (a trickle that would hold its request slot
/// for ever). Only the time a read waits on the client counts: the
/// server's own pauses between reads (a pool connection, a slow tier) are
/// not the client's.
struct IdleCut {
    inner: Pin<Box<dyn Stream<Item = std::io::Result<Bytes>> + Send>>,
    idle: Duration,
    timer: Pin<Box<tokio::time::Sleep>>,
    /// Since when the current read waits on the client.
    waiting_since: Option<tokio::time::Instant>,
    /// How long reads have waited on the client in all.
    waited: Duration,
    min_rate: u64,
    got: u64,
}

impl Stream for IdleCut {
    type Item = std::io::Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let now = tokio::time::Instant::now();
        if let Poll::Ready(item) = self.inner.as_mut().poll_next(cx) {
            if let Some(since) = self.waiting_since.take() {
                self.waited += now - since;
            }
            if let Some(Ok(chunk)) = &item {
                self.got += chunk.len() as u64;
                let waited = self.waited;
                if waited > self.idle
                    && (self.got as f64) < self.min_rate as f64 * waited.as_secs_f64()
                {
                    return Poll::Ready(Some(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "the client sent the body at under {} bytes a second",
                            self.min_rate
                        ),
                    ))));
                }
            }
            return Poll::Ready(item);
        }
        if self.waiting_since.is_none() {
            self.waiting_since = Some(now);
            let idle = self.idle;
            self.timer.as_mut().reset(now + idle);
        }
        match self.timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client sent nothing for too long",
            )))),
            Poll::Pending => Poll::Pending,
        }
    }
}

use std::future::Future;

/// What a put checks before it reads its body: a declared length over the
/// limit (413), or no room to hold another pin for a client (503).
fn may_put(s: &State, headers: &HeaderMap) -> ApiResult<()> {
    if s.pins.full(Instant::now(), s.max_held_pins) {
        let mut r = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "pins_full",
            format!(
                "the server holds {} pins for clients (--max-held-pins): release yours (DELETE /pins/ID) or retry later",
                s.max_held_pins
            ),
        );
        r.retry_after = Some(60);
        return Err(r);
    }
    let declared = header_str(headers, header::CONTENT_LENGTH).and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(n) if n > s.max_body => Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!(
                "a body of {n} bytes is over the server's limit of {} bytes",
                s.max_body
            ),
        )),
        _ => Ok(()),
    }
}

/// A stored put's answer: the key and the pin held for the client.
fn put_answer(s: &State, put: crate::Put) -> Response {
    let id = s.pins.hold(put.pin, Instant::now() + s.pin_hold);
    let expires_at = std::time::SystemTime::now() + s.pin_hold;
    let status = match put.outcome {
        crate::PutOutcome::Created => StatusCode::CREATED,
        crate::PutOutcome::Existed => StatusCode::OK,
    };
    let body = serde_json::json!({
        "key": put.key,
        "size": put.size,
        "tier": put.tier,
        "outcome": put.outcome,
        "pin": {
            "id": id,
            "expires_at": humantime::format_rfc3339_seconds(expires_at).to_string(),
            "release": format!("/pins/{id}"),
        },
    });
    let mut r = (status, axum::Json(body)).into_response();
    r.headers_mut().insert(header::ETAG, etag(&put.key));
    r
}

async fn put_blob(
    Extract(s): Extract<Shared>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    authorize(&s, &headers, peer, Grant::Write)?;
    let key = parse_key(&key)?;
    may_put(&s, &headers)?;
    let put = s
        .store
        .put_reader_verified(&key, body_reader(body, s.max_body, s.idle, s.min_rate))
        .await?;
    Ok(put_answer(&s, put))
}

async fn post_blob(
    Extract(s): Extract<Shared>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    authorize(&s, &headers, peer, Grant::Write)?;
    may_put(&s, &headers)?;
    let put = s
        .store
        .put_reader(body_reader(body, s.max_body, s.idle, s.min_rate))
        .await?;
    Ok(put_answer(&s, put))
}

/// `GET /blobs?after=KEY&limit=N`: keys in order, after `after`, at most
/// `limit` (default and most 1000), as a JSON array.
async fn list_blobs(
    Extract(s): Extract<Shared>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    axum::extract::Query(q): axum::extract::Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> ApiResult {
    authorize(&s, &headers, peer, Grant::Read)?;
    let after = match q.get("after") {
        Some(a) => Some(parse_key(a)?),
        None => None,
    };
    let limit = match q.get("limit").map(|l| l.parse::<usize>()) {
        None => 1000,
        Some(Ok(n)) if n <= 1000 => n,
        Some(_) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_limit",
                "limit is a number from 0 to 1000",
            ));
        }
    };
    // The union listing is ordered: skip to `after` (a cursor over the
    // stream; a page costs the keys before it), then take a page.
    let keys: Vec<Key> = s
        .store
        .list()
        .try_skip_while(|k| futures::future::ready(Ok(after.is_some_and(|a| *k <= a))))
        .take(limit)
        .try_collect()
        .await?;
    Ok(axum::Json(keys).into_response())
}

/// `PUT /blobs/{key}/outboard`: stores a present large blob's outboard
/// (a storage node's repair from a client that computed it); its length
/// must be the blob's outboard's (422), its content is checked by every
/// reader.
async fn put_outboard(
    Extract(s): Extract<Shared>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    // Authorized before a byte of the body is read.
    authorize(&s, &headers, peer, Grant::Write)?;
    let key = parse_key(&key)?;
    let absent = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no large blob {key}"),
        )
    };
    let large = s.store.large().ok_or_else(absent)?;
    let size = large.size(&key).await?.ok_or_else(absent)?;
    let want = outboard::outboard_len(size);
    // Read through the idle cut-off, at most the outboard's own length.
    let mut body_bytes = Vec::new();
    {
        use tokio::io::AsyncReadExt;
        body_reader(body, want, s.idle, s.min_rate)
            .read_to_end(&mut body_bytes)
            .await
            .map_err(|source| Error::Input {
                what: "the request body".into(),
                source,
            })?;
    }
    // Checked against the key before it is stored: a wrong outboard would
    // send every ranged read of the blob down the whole-blob path.
    let checked = {
        let b = std::mem::take(&mut body_bytes);
        tokio::task::spawn_blocking(move || (outboard::validate(&key, size, &b), b))
            .await
            .map_err(|e| Error::engine("blake3", format!("a checking task failed: {e}")))?
    };
    if !checked.0 {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "bad_outboard",
            format!(
                "not the outboard of blob {key} ({size} bytes, whose outboard has {want}): its pairs do not merge to the key"
            ),
        ));
    }
    if large.put_outboard(&key, Bytes::from(checked.1)).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(absent())
    }
}

async fn delete_pin(
    Extract(s): Extract<Shared>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult {
    authorize(&s, &headers, peer, Grant::Write)?;
    if s.pins.release(&id) {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "no_such_pin",
            "no pin with that id is held (released already, or its hold ended)",
        ))
    }
}
