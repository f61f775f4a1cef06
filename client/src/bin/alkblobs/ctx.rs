//! What every command shares: the data directory, how to open the store
//! there, and whether to draw progress.

use std::path::PathBuf;
use std::time::Duration;

use alkblobs::{DirOptions, OpenMode, Store};
use indicatif::{ProgressBar, ProgressStyle};

use crate::exit::{Exit, Fail, Res};

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

    /// Opens an existing store for writing (`gc`, `roots rm`): a command
    /// that only changes what is there never creates a store.
    pub async fn open_write(&self) -> Res<Store> {
        self.require_store()?;
        self.create().await
    }

    /// Opens an existing store read-only, taking no lock.
    pub async fn open_read(&self) -> Res<Store> {
        self.require_store()?;
        Ok(Store::open_dir_with(&self.dir, DirOptions::new().read_only()).await?)
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
