//! `serve`: the store over HTTP until SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use alkblobs::serve::{ServeOptions, Tokens};

use crate::ctx::Ctx;
use crate::exit::{Exit, Fail, Res};

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Address to listen on, e.g. 127.0.0.1:8080 or [::]:443.
    #[arg(long, default_value = "127.0.0.1:7860")]
    listen: SocketAddr,
    /// Create the store if the data directory holds none (a new storage
    /// node's first start). Without it, serving a directory with no store
    /// fails (exit 3), as every command but `put` and `roots add` does: a
    /// mistyped --data-dir would otherwise serve an empty store and take
    /// writes into it.
    #[arg(long)]
    create: bool,
    /// Bearer tokens, one `TOKEN read|write` per line. Without it the
    /// server serves reads and writes to loopback clients only.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// TLS certificate chain (PEM); with --tls-key.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// TLS private key (PEM); with --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The largest upload, in bytes (413 beyond).
    #[arg(long, default_value_t = 64 << 30)]
    max_body: u64,
    /// Requests served at once, by the whole server; more wait their turn.
    #[arg(long, default_value_t = 64)]
    max_concurrency: usize,
    /// Connections open at once; past it the server accepts no more until
    /// one closes (keep it under the descriptor limit, `ulimit -n`).
    #[arg(long, default_value_t = 512)]
    max_connections: usize,
    /// Connections open at once from one client address; further ones are
    /// closed as they come (behind a reverse proxy, every client is the
    /// proxy: set it to --max-connections there).
    #[arg(long, default_value_t = 64)]
    max_connections_per_client: usize,
    /// The slowest average rate, in bytes a second, at which a client must
    /// read a response once the server has waited on it for the idle
    /// cut-off (0: none); a slower reader is cut off.
    #[arg(long, default_value_t = 4096)]
    min_download_rate: u64,
    /// The slowest average upload rate, in bytes a second, once an upload
    /// has run for the idle cut-off (0: none); a slower one ends with 408.
    #[arg(long, default_value_t = 4096)]
    min_upload_rate: u64,
    /// How long a put's pin is held for its client when it does not release
    /// it (e.g. 10m).
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pin_hold: Duration,
    /// Pins held for clients at once; a put beyond is refused (503
    /// pins_full) until clients release theirs or holds end.
    #[arg(long, default_value_t = 100_000)]
    max_held_pins: usize,
    /// A connection that waits this long on its client is cut off: a TLS
    /// handshake, a request's headers, a silence in a body, or a response
    /// the client does not read.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    idle_timeout: Duration,
    /// How long requests in flight may finish after SIGTERM.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    shutdown_grace: Duration,
}

pub async fn serve(ctx: &Ctx, a: &ServeArgs) -> Res {
    let tokens = match &a.token_file {
        Some(f) => Tokens::load(f)?,
        None => Tokens::none(),
    };
    let store = if a.create {
        ctx.create().await?
    } else {
        ctx.open_write().await?
    };
    let mut opts = ServeOptions::new(a.listen)
        .tokens(tokens.clone())
        .max_body(a.max_body)
        .max_concurrency(a.max_concurrency)
        .max_connections(a.max_connections)
        .max_connections_per_client(a.max_connections_per_client)
        .min_download_rate(a.min_download_rate)
        .min_upload_rate(a.min_upload_rate)
        .pin_hold(a.pin_hold)
        .max_held_pins(a.max_held_pins)
        .idle_timeout(a.idle_timeout);
    if let (Some(c), Some(k)) = (&a.tls_cert, &a.tls_key) {
        opts = opts.tls(c, k);
    }
    let scheme = if opts.tls.is_some() { "https" } else { "http" };
    let server = alkblobs::serve::start(store, opts).await?;
    // The address on stdout (the port chosen for :0), for scripts.
    println!("{scheme}://{}", server.addr());
    if tokens.is_empty() {
        eprintln!("alkblobs: no --token-file: serving reads and writes to loopback clients only");
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| Fail::new(Exit::Failure, format!("cannot watch SIGTERM: {e}")))?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    eprintln!("alkblobs: shutting down (requests in flight may finish)");
    server.shutdown(a.shutdown_grace).await?;
    Ok(())
}
