//! Writes the token counter's vocabulary: every `o200k_base` token's bytes in rank order,
//! gzip-compressed, taken from the copy that `bpe-openai` ships.
//!
//! The router counts tokens with tiktoken's rank-ordered byte-pair merge over a table of
//! keyed fingerprints (`src/estimate.rs`, "Tokenizer"), which needs only the tokens in rank
//! order. Before, it loaded `bpe-openai`'s own dictionary, whose automata and pair tables took
//! about 17 MiB of heap even trimmed. Format: for each rank from 0, one byte of length
//! (every `o200k_base` token is shorter than 256 bytes; checked here) and the token's bytes.
//! 1.04 MB compressed (1,041,560 bytes for `bpe-openai` 0.3.2).
//!
//! A `bpe-openai` release whose vocabulary has gaps or longer tokens fails this script, never
//! the router at run time. That the router's merge counts like `bpe-openai` is checked by the
//! router's property tests.

use std::io::Write;
use std::path::PathBuf;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    let bpe = &bpe_openai::o200k_base().bpe;
    let n = bpe.num_tokens();
    if n < 199_000 {
        fail(&format!(
            "o200k_base has {n} tokens, expected about 200,000"
        ));
    }
    let mut raw = Vec::with_capacity(n * 8);
    for id in 0..n {
        let id = u32::try_from(id).unwrap_or_else(|e| fail(&e));
        let bytes = bpe.token_bytes(id);
        let len = u8::try_from(bytes.len())
            .unwrap_or_else(|_| fail(&format!("token {id} is {} bytes long", bytes.len())));
        if len == 0 {
            fail(&format!("token {id} is empty"));
        }
        raw.push(len);
        raw.extend_from_slice(bytes);
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_else(|e| fail(&e)));
    let file = std::fs::File::create(out.join("o200k_ranks.bin.gz")).unwrap_or_else(|e| fail(&e));
    let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::best());
    gz.write_all(&raw).unwrap_or_else(|e| fail(&e));
    gz.finish().unwrap_or_else(|e| fail(&e));
}

fn fail(e: &dyn std::fmt::Display) -> ! {
    // A build script reports failure by exiting non-zero; its stderr is shown.
    eprintln!("switchyard-router build.rs: {e}");
    std::process::exit(1)
}
