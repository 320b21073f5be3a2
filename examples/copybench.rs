//! Benchmark driver for the tree copier and the write-back (`bench/writeback.sh`).
//!
//! ```text
//! copybench seed SRC DST             copy_tree SRC into the empty directory DST
//! copybench sync SRC DST [BASE [STATE NAME]]
//!                                    sync_tree SRC onto DST, merging against the baseline
//!                                    file BASE (none if missing; rewritten after), as
//!                                    `tmpfsctl sync` does; with STATE and NAME, asking the
//!                                    change tracker `track` runs for which directories
//!                                    changed
//! copybench track SRC STATE NAME     run a change tracker on the tmpfs SRC, as the agent
//!                                    does for the mount NAME with state directory STATE,
//!                                    until killed
//! copybench gen DIR [FILES] [SEED] [SIZE]
//!                                    write a test tree: 90% 1–8 KiB files, 10% 64 KiB–1 MiB
//!                                    (log-uniform), or all of SIZE bytes; 100 files a
//!                                    directory, 10 directories a group; default 100000 files
//! copybench mutate DIR PERMILLE SEED [LIST]
//!                                    rewrite PERMILLE/1000 of the files below DIR with
//!                                    new contents of another size; with LIST, write
//!                                    their paths relative to DIR there, NUL-terminated
//! ```
//!
//! `seed` and `sync` print the elapsed seconds on the first line of stdout, then the
//! statistics as JSON.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use tmpfsctl::copy::{copy_tree, sync_tree, Baseline};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).map(String::as_str);
    let result = match (arg(0), arg(1), arg(2)) {
        (Some("seed"), Some(src), Some(dst)) => {
            timed(|| copy_tree(Path::new(src), Path::new(dst), None).map(|s| format!("{s:?}")))
        }
        (Some("track"), Some(src), Some(state)) => {
            let state = tmpfsctl::state::State::new(Path::new(state));
            let name = arg(3).expect("usage: copybench track SRC STATE NAME");
            let root = fs::File::open(src).expect("open SRC");
            let _running = tmpfsctl::dirty::Running::spawn(name, root, &state).expect("change tracker");
            loop {
                std::thread::park();
            }
        }
        (Some("sync"), Some(src), Some(dst)) => {
            let base_file = arg(3).map(PathBuf::from);
            let tracker = arg(4)
                .zip(arg(5))
                .map(|(s, n)| (tmpfsctl::state::State::new(Path::new(s)), n));
            timed(|| {
                let err = |e: anyhow::Error| std::io::Error::other(format!("{e:#}"));
                let mut base = match &base_file {
                    Some(f) => Baseline::load(f).map_err(|e| err(e.into()))?.unwrap_or_default(),
                    None => Baseline::none(),
                };
                // What an interrupted pass established, as `tmpfsctl sync` reads it.
                if let Some(f) = &base_file {
                    tmpfsctl::copy::Journal::replay(&f.with_extension("journal"), &mut base)?;
                }
                // As `tmpfsctl sync` does: a journal beside the baseline.
                let journal = match &base_file {
                    Some(f) => Some(tmpfsctl::copy::Journal::open(
                        &f.with_extension("journal"),
                        &base,
                    )?),
                    None => None,
                };
                let mut ask = || {
                    let (state, name) = tracker.as_ref()?;
                    tmpfsctl::dirty::ask(state, name, Path::new(src), base.taken?).ok()
                };
                let barriers = || {
                    let (state, name) = tracker.as_ref()?;
                    tmpfsctl::dirty::barriers(state, name)
                };
                let synced = sync_tree(
                    Path::new(src),
                    Path::new(dst),
                    tmpfsctl::copy::Merge {
                        base: &base,
                        journal: journal.as_ref(),
                        deletions: None,
                        dirty: Some(&mut ask),
                        barriers: Some(&barriers),
                        copied: None,
                        touched: None,
                    },
                    None,
                )
                .map_err(|e| err(e.into()))?;
                if let Some(f) = base_file.as_ref().filter(|_| !synced.kept) {
                    synced.baseline.save(f).map_err(|e| err(e.into()))?;
                    std::fs::remove_file(f.with_extension("journal"))?;
                }
                Ok::<_, std::io::Error>(serde_json::to_string(&synced.stats).expect("stats serialise"))
            })
        }
        (Some("gen"), Some(dir), _) => {
            let files = arg(2).map_or(100_000, |n| n.parse().expect("FILES is a number"));
            let seed = arg(3).map_or(1, |n| n.parse().expect("SEED is a number"));
            let size = arg(4).map(|n| n.parse().expect("SIZE is a number"));
            generate(Path::new(dir), files, seed, size);
            Ok(())
        }
        (Some("mutate"), Some(dir), Some(permille)) => {
            let permille = permille.parse().expect("PERMILLE is a number");
            let seed = arg(3).map_or(1, |n| n.parse().expect("SEED is a number"));
            mutate(Path::new(dir), permille, seed, arg(4).map(Path::new));
            Ok(())
        }
        _ => {
            eprintln!(
                "usage: copybench seed|sync SRC DST [BASE [STATE NAME]] | track SRC STATE NAME | gen DIR [FILES] [SEED] [SIZE] | mutate DIR PERMILLE SEED [LIST]"
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("copybench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn timed<E: std::error::Error>(run: impl FnOnce() -> Result<String, E>) -> Result<(), String> {
    let start = Instant::now();
    let stats = run().map_err(|e| {
        let mut msg = e.to_string();
        let mut source = e.source();
        while let Some(s) = source {
            msg.push_str(&format!(": {s}"));
            source = s.source();
        }
        msg
    })?;
    // A reader that stops early (`| head -1`) is no error.
    let _ = writeln!(std::io::stdout(), "{:.6}\n{stats}", start.elapsed().as_secs_f64());
    Ok(())
}

/// xorshift64*: fast, deterministic, good enough for sizes and file contents.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn fill(&mut self, buf: &mut Vec<u8>, len: usize) {
        buf.clear();
        while buf.len() < len {
            buf.extend_from_slice(&self.next().to_le_bytes());
        }
        buf.truncate(len);
    }

    /// 90%: 1–8 KiB; 10%: 64 KiB–1 MiB, log-uniform.
    fn size(&mut self) -> usize {
        if self.below(10) < 9 {
            1024 + self.below(7 * 1024 + 1) as usize
        } else {
            let exp = 16.0 + (self.below(1_000_000) as f64 / 1_000_000.0) * 4.0;
            exp.exp2() as usize
        }
    }
}

fn file_path(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("g{:03}/d{:02}/f{:06}", i / 1000, i / 100 % 10, i))
}

fn generate(dir: &Path, files: usize, seed: u64, size: Option<usize>) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut buf = Vec::new();
    let mut total = 0u64;
    for i in 0..files {
        let path = file_path(dir, i);
        if i % 100 == 0 {
            fs::create_dir_all(path.parent().expect("has a parent")).expect("mkdir");
        }
        let len = size.unwrap_or_else(|| rng.size());
        rng.fill(&mut buf, len);
        fs::File::create(&path)
            .and_then(|mut f| f.write_all(&buf))
            .expect("write");
        total += len as u64;
    }
    eprintln!(
        "generated {files} files, {:.2} GiB",
        total as f64 / (1u64 << 30) as f64
    );
}

fn mutate(dir: &Path, permille: u64, seed: u64, list: Option<&Path>) {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in fs::read_dir(&d).expect("read_dir") {
            let entry = entry.expect("entry");
            if entry.file_type().expect("type").is_dir() {
                pending.push(entry.path());
            } else {
                files.push(entry.path());
            }
        }
    }
    files.sort();
    let mut rng = Rng(seed.wrapping_mul(0xD1B5_4A32_D192_ED03) | 1);
    let mut buf = Vec::new();
    let (mut changed, mut bytes) = (0, 0);
    let mut names = Vec::new();
    for path in &files {
        if rng.below(1000) < permille {
            let old = fs::metadata(path).expect("stat").len() as usize;
            let mut len = rng.size();
            if len == old {
                len += 1;
            }
            rng.fill(&mut buf, len);
            fs::write(path, &buf).expect("rewrite");
            let name = path.strip_prefix(dir).expect("found below DIR");
            names.extend_from_slice(name.as_os_str().as_encoded_bytes());
            names.push(0);
            changed += 1;
            bytes += len;
        }
    }
    if let Some(list) = list {
        fs::write(list, &names).expect("write LIST");
    }
    eprintln!(
        "rewrote {changed} of {} files, {:.1} MiB",
        files.len(),
        bytes as f64 / (1 << 20) as f64
    );
}
