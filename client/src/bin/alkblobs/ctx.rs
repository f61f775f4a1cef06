//! What every command shares: where the store is (a data directory, or a
//! pool in PostgreSQL), how to open it, and whether to draw progress.

use std::path::PathBuf;
use std::time::Duration;

use alkblobs::backend::s3::S3Options;
use alkblobs::store::fleet::{FleetLarge, FleetOptions};
use alkblobs::store::postgres::{PgLarge, PostgresOptions};
use alkblobs::{DirOptions, OpenMode, Store};
use indicatif::{ProgressBar, ProgressStyle};

use crate::exit::{Exit, Fail, Res};

/// A pool in a PostgreSQL database (`--postgres URL --pool NAME`).
pub struct PgTarget {
    /// The database.
    pub url: String,
    /// The pool.
    pub pool: String,
    /// The large tier (`--large`), or the pool's own.
    pub large: PgLarge,
    /// `--fleet`: one of many instances sharing the pool.
    pub fleet: bool,
    /// `--shared-media`: the operator's assertion for `--large local=DIR`.
    pub shared_media: bool,
}

/// The global options, resolved.
pub struct Ctx {
    /// The data directory.
    pub dir: PathBuf,
    /// An embedded store's large tier on S3 (`--large s3://…`).
    pub s3: Option<S3Options>,
    /// A PostgreSQL pool instead of the data directory.
    pub pg: Option<PgTarget>,
    /// Print JSON instead of text.
    pub json: bool,
    /// Wait for the instance lock instead of failing.
    pub wait: bool,
    /// Draw progress bars (stderr is a terminal and `--quiet` was not given).
    pub progress: bool,
    /// The stores this command opened, closed when it ends.
    pub opened: std::sync::Mutex<Vec<Store>>,
}

impl Ctx {
    /// Opens the store for writing, creating it if the directory holds none
    /// (`put`, `roots add`).
    pub async fn create(&self) -> Res<Store> {
        if let Some(pg) = &self.pg {
            return self.keep(self.open_pg(pg).await?);
        }
        let mode = if self.wait {
            OpenMode::WriteWait
        } else {
            OpenMode::Write
        };
        self.keep(Store::open_dir_with(&self.dir, self.dir_options().mode(mode)).await?)
    }

    /// Opens an existing store for writing (`gc`, `roots rm`): a command
    /// that only changes what is there never creates a store.
    pub async fn open_write(&self) -> Res<Store> {
        if self.pg.is_none() {
            self.require_store()?;
        }
        self.create().await
    }

    /// A single-instance pool in PostgreSQL (a missing pool is exit 3: no
    /// store; the pools themselves are made with `alkblobs pool create`).
    async fn open_pg(&self, pg: &PgTarget) -> Res<Store> {
        if matches!(&pg.large, PgLarge::Local(d) if d.as_os_str().is_empty()) {
            return Err(Fail::new(
                Exit::BadInput,
                "--large local needs the directory: --large local=DIR",
            ));
        }
        if pg.fleet {
            let rule = |what: &str| {
                Fail::new(
                    Exit::BadInput,
                    format!(
                        "{what}: the fleet-validity rule needs the large tier declared: --large pg-lo, --large none (kv-only), --large routed=URL (kv-only, large content through a storage node's alkblobs serve), --large s3://BUCKET/PREFIX (the pool's S3 location) or --large local=DIR --shared-media (DIR is the same fleet-shared media on every node)"
                    ),
                )
            };
            let large = match &pg.large {
                PgLarge::PgLo => FleetLarge::PgLo,
                PgLarge::None => FleetLarge::KvOnly,
                PgLarge::Local(dir) if pg.shared_media => FleetLarge::SharedLocal(dir.clone()),
                PgLarge::Local(_) => {
                    return Err(rule("--fleet --large local=DIR without --shared-media"));
                }
                PgLarge::S3(o) => FleetLarge::S3(o.clone()),
                PgLarge::Routed(o) => FleetLarge::Routed(o.clone()),
                _ => return Err(rule("--fleet without --large")),
            };
            return Ok(Store::open_fleet(FleetOptions::new(&pg.url, &pg.pool, large)).await?);
        }
        if pg.shared_media {
            return Err(Fail::new(
                Exit::BadInput,
                "--shared-media is a fleet declaration: it needs --fleet",
            ));
        }
        Ok(
            Store::open_postgres(PostgresOptions::new(&pg.url, &pg.pool).large(pg.large.clone()))
                .await?,
        )
    }

    /// Opens an existing store read-only, taking no lock.
    pub async fn open_read(&self) -> Res<Store> {
        if let Some(pg) = &self.pg {
            return self.keep(self.open_pg(pg).await?);
        }
        self.require_store()?;
        self.keep(Store::open_dir_with(&self.dir, self.dir_options().read_only()).await?)
    }

    /// Keeps `store` to close when the command ends — unless it is a fleet
    /// store, whose pins outlive the command for the pool's TTL (closing
    /// would release them at once).
    fn keep(&self, store: Store) -> Res<Store> {
        if self.pg.as_ref().is_some_and(|pg| pg.fleet) {
            return Ok(store);
        }
        self.opened
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(store.clone());
        Ok(store)
    }

    /// Closes every store the command opened.
    pub async fn close(&self) {
        let stores: Vec<Store> =
            std::mem::take(&mut *self.opened.lock().unwrap_or_else(|p| p.into_inner()));
        for s in stores {
            if let Err(e) = s.close().await {
                tracing::warn!("closing the store: {e}");
            }
        }
    }

    fn dir_options(&self) -> DirOptions {
        match &self.s3 {
            Some(o) => DirOptions::new().large_s3(o.clone()),
            None => DirOptions::new(),
        }
    }

    /// A store exists iff its sqlite index does. Reading a mistyped
    /// `--data-dir` as an empty store would make `verify` and `ls` succeed
    /// on nothing.
    fn require_store(&self) -> Res {
        if Store::dir_paths(&self.dir).0.exists() {
            return Ok(());
        }
        Err(Fail::new(
            Exit::NotFound,
            format!(
                "no store at {} (check --data-dir / ALKBLOBS_DATA_DIR; `alkblobs put` creates one)",
                self.dir.display()
            ),
        ))
    }

    /// A progress bar on stderr, hidden unless progress is wanted.
    pub fn bar(&self, len: Option<u64>, template: &str) -> ProgressBar {
        if !self.progress {
            return ProgressBar::hidden();
        }
        let pb = match len {
            Some(n) => ProgressBar::new(n),
            None => ProgressBar::new_spinner(),
        };
        pb.set_style(
            ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        pb.enable_steady_tick(Duration::from_millis(120));
        pb
    }
}
