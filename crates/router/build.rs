//! Writes the token counter's vocabulary: `o200k_base` as `bpe-openai` ships it, less the two
//! automata that only its appendable and prependable encoders use, gzip-compressed.
//!
//! `bpe-openai` embeds one 32 MiB MessagePack dictionary per vocabulary and, when loaded,
//! keeps three double-array Aho-Corasick automata: the leftmost-longest one that counting
//! (the backtracking encoder) walks, and two overlapping ones (forward and reverse, 15 MiB
//! together) for encoders the router never calls. Loading it cost about 35 MiB of heap plus
//! 35 MiB of file-backed pages of the binary. This script keeps every structure counting
//! reads, puts a 256-token automaton in the two unused slots, checks that counts are
//! unchanged on a sample, and compresses the result (about 8 MiB), so loading touches 8 MiB
//! of the binary and keeps about 17 MiB of heap.
//!
//! The layout it edits is `BytePairEncoding`'s serde field order (MessagePack array of ten
//! fields, the overlapping automata at 6 and 7). A `bpe` release that changes it fails this
//! script (wrong shape or different counts), never the router at run time.

use std::io::Write;
use std::path::PathBuf;

use bpe_openai::byte_pair_encoding::BytePairEncoding;

const FIELDS: usize = 10;
const OVERLAPPING: [usize; 2] = [6, 7];
const LONGEST: usize = 5;

const SAMPLE: &str = "The quick brown fox jumps over the lazy dog's back, doesn't it? \
    fn main() { println!(\"{}\", 42_000 + 7); }\n\n\tIndented\r\nlines  with   spaces \
    Größenordnung, naïve café, 東京都は日本の首都です。 Привет, мир! مرحبا بالعالم 🎉🚀 \
    https://example.com/path?query=value&x=1 <|endoftext|> 1234567890 3.14159";

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    let tokenizer = bpe_openai::o200k_base();
    let full = rmp_serde::to_vec(&tokenizer.bpe).unwrap_or_else(|e| fail(&e));
    let mut fields = as_array(&full, "o200k_base");
    let bytes_only = |f: &[rmpv::Value], i: usize| matches!(f.get(i), Some(rmpv::Value::Binary(_)));
    if fields.len() != FIELDS
        || !bytes_only(&fields, LONGEST)
        || !OVERLAPPING.iter().all(|&i| bytes_only(&fields, i))
    {
        fail(
            &"BytePairEncoding's serialized layout changed (expected 10 fields, automata as bytes at 5, 6, 7)",
        );
    }

    // Every byte is a token of a byte-level BPE, so a 256-token dictionary is the smallest
    // valid one; its automata stand in for the unused ones.
    let tiny = BytePairEncoding::from_dictionary((0u8..=255).map(|b| vec![b]), None);
    let tiny = rmp_serde::to_vec(&tiny).unwrap_or_else(|e| fail(&e));
    let tiny = as_array(&tiny, "the 256-token dictionary");
    for i in OVERLAPPING {
        if let (Some(slot), Some(small)) = (fields.get_mut(i), tiny.get(i)) {
            *slot = small.clone();
        }
    }
    let mut trimmed = Vec::new();
    rmpv::encode::write_value(&mut trimmed, &rmpv::Value::Array(fields))
        .unwrap_or_else(|e| fail(&e));

    let counter: BytePairEncoding = rmp_serde::from_slice(&trimmed).unwrap_or_else(|e| fail(&e));
    for piece in tokenizer.split(SAMPLE) {
        let (want, got) = (
            tokenizer.bpe.count(piece.as_bytes()),
            counter.count(piece.as_bytes()),
        );
        if want != got {
            fail(&format!(
                "trimmed vocabulary counts {piece:?} as {got} tokens, the full one as {want}"
            ));
        }
    }

    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_else(|e| fail(&e)));
    let file =
        std::fs::File::create(out.join("o200k_count.msgpack.gz")).unwrap_or_else(|e| fail(&e));
    let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::default());
    gz.write_all(&trimmed).unwrap_or_else(|e| fail(&e));
    gz.finish().unwrap_or_else(|e| fail(&e));
}

fn as_array(bytes: &[u8], what: &str) -> Vec<rmpv::Value> {
    match rmpv::decode::read_value(&mut &bytes[..]) {
        Ok(rmpv::Value::Array(fields)) => fields,
        Ok(_) => fail(&format!("{what} is not serialized as a MessagePack array")),
        Err(e) => fail(&e),
    }
}

fn fail(e: &dyn std::fmt::Display) -> ! {
    // A build script reports failure by exiting non-zero; its stderr is shown.
    eprintln!("switchyard-router build.rs: {e}");
    std::process::exit(1)
}
