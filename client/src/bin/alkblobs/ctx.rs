//! What every command shares: the data directory, how to open the store
//! there, and whether to draw progress.

use std::path::PathBuf;
use std::time::Duration;

use alkblobs::backend::mem::MemBackend;
use alkblobs::{DirOptions, OpenMode, Store};
use indicatif::{ProgressBar, ProgressStyle};

use crate::exit::Res;

/// The global options, resolved.
pub struct Ctx {
    /// The data directory.
    pub dir: PathBuf,
    /// Print JSON instead of text.
    pub json: bool,
    /// Wait for the instance lock instead of failing.
    pub wait: bool,
    /// Draw progress bars (stderr is a terminal and `--quiet` was not given).
    pub progress: bool,
}

impl Ctx {
    /// Opens the store for writing, creating it if the directory holds none
    /// (`put`, `roots add`).
    pub async fn create(&self) -> Res<Store> {
        let mode = if self.wait {
            OpenMode::WriteWait
        } else {
            OpenMode::Write
        };
        Ok(Store::open_dir_with(&self.dir, DirOptions::new().mode(mode)).await?)
    }

    /// Opens the store for writing (`gc`, `roots rm`).
    pub async fn open_write(&self) -> Res<Store> {
        self.create().await
    }

    /// Read commands take no lock; a data directory with no store yet reads
    /// as an empty store.
    pub async fn open_read(&self) -> Res<Store> {
        let (sqlite, _) = Store::dir_paths(&self.dir);
        if !sqlite.exists() {
            return Ok(Store::builder()
                .kv(MemBackend::new())
                .large(MemBackend::new())
                .build()?);
        }
        Ok(Store::open_dir_with(&self.dir, DirOptions::new().read_only()).await?)
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
