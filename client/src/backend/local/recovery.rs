//! Reclaiming staging files a killed writer left (named staging only):
//! only those nobody holds locked and nobody touched for the grace.

use super::*;

impl Inner {
    /// Removes staging files that are provably abandoned (blocking).
    pub(super) fn reclaim(&self) -> Result<u64> {
        let entries = match fs::read_dir(&self.staging) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(source) => {
                return Err(self.err(LocalError::UnableToList {
                    path: self.staging.clone(),
                    source,
                }));
            }
        };
        let now = SystemTime::now();
        let mut reclaimed = 0;
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(file) = OpenOptions::new().read(true).open(&path) else {
                continue;
            };
            match file.try_lock() {
                Ok(()) => {}
                // A live writer holds it.
                Err(TryLockError::WouldBlock) => continue,
                Err(TryLockError::Error(_)) => continue,
            }
            let idle = file
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|m| now.duration_since(m).ok())
                .unwrap_or(Duration::ZERO);
            if idle >= self.opts.staging_grace && fs::remove_file(&path).is_ok() {
                tracing::info!(path = %path.display(), ?idle, "reclaimed abandoned staging file");
                reclaimed += 1;
            }
        }
        Ok(reclaimed)
    }
}
