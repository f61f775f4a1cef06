//! REQ-4: one node, big files — streamed in, hashed while written, never
//! held in memory whole; read back in ranges.
//!
//! ```sh
//! cargo run --release -p alkblobs --example large_heavy -- /tmp/alkblobs-example /path/to/big.file
//! ```

use alkblobs::{DirOptions, Store};
use tokio::io::AsyncReadExt;

#[tokio::main]
async fn main() -> alkblobs::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .unwrap_or_else(|| "/tmp/alkblobs-example".into());
    let file = match args.next() {
        Some(f) => std::path::PathBuf::from(f),
        None => {
            // Make a 64 MiB file to import.
            let p = std::env::temp_dir().join("alkblobs-example-64mib.bin");
            let v: Vec<u8> = (0..64u32 << 20).map(|i| (i % 251) as u8).collect();
            std::fs::write(&p, v).map_err(|e| alkblobs::Error::Config(e.to_string()))?;
            p
        }
    };
    let store = Store::open_dir_with(&dir, DirOptions::new()).await?;
    let put = store.put_file(&file).await?; // streamed, hashed while written, fsynced, renamed
    println!("{} ({:?}, {} bytes)", put.key, put.tier, put.size);
    let head = store.get_range(&put.key, 0, 16).await?.expect("just put");
    println!("first bytes: {:02x?}", &head[..]);
    let mut reader = store.open_read(&put.key).await?.expect("just put");
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = reader
            .read(&mut buf)
            .await
            .map_err(|e| alkblobs::Error::Config(e.to_string()))?;
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    println!("streamed back {total} bytes");
    drop(put.pin);
    store.close().await
}
