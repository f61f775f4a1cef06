//! `roots add/rm/ls`: persistent roots, the keys every sweep treats as live.

use alkblobs::Key;
use clap::Subcommand;

use crate::ctx::Ctx;
use crate::exit::{Res, key_arg};
use crate::output::{list, print_json};

#[derive(Subcommand)]
pub enum RootsCmd {
    /// Add roots (the keys need not exist yet); creates the store if need be.
    Add {
        /// Keys.
        #[arg(required = true, value_parser = key_arg)]
        keys: Vec<Key>,
    },
    /// Remove roots.
    Rm {
        /// Keys.
        #[arg(required = true, value_parser = key_arg)]
        keys: Vec<Key>,
    },
    /// List roots.
    Ls,
}

pub async fn roots(ctx: &Ctx, action: &RootsCmd) -> Res {
    let (n, verb) = match action {
        RootsCmd::Add { keys } => (ctx.create().await?.add_roots(keys).await?, "added"),
        RootsCmd::Rm { keys } => (ctx.open_write().await?.remove_roots(keys).await?, "removed"),
        RootsCmd::Ls => {
            let store = ctx.open_read().await?;
            return list(ctx.json, store.roots(), |out, k| writeln!(out, "{k}")).await;
        }
    };
    if ctx.json {
        print_json(&serde_json::json!({ verb: n }))
    } else {
        println!("{verb} {n} root(s)");
        Ok(())
    }
}
