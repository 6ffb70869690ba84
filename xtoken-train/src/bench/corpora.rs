//! Local text of several kinds for the benchmarks: prose, code, numbers, CJK and emoji, found
//! on the machine or generated (seeded) where none is.

use std::path::{Path, PathBuf};

use xtoken_train::data::rng::SplitMix64;

/// One kind of text.
pub struct Corpus {
    pub kind: &'static str,
    pub source: String,
    pub text: String,
}

/// Every kind; `None` where no source exists on this machine.
pub fn all(limit: usize) -> Vec<Option<Corpus>> {
    vec![
        prose(limit),
        code(limit),
        numbers(limit),
        cjk(limit),
        emoji(limit),
    ]
}

/// Cuts `text` into documents of about `bytes` bytes, at line ends where possible.
pub fn split(text: &str, bytes: usize) -> Vec<&str> {
    let mut docs = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let mut end = bytes.min(rest.len());
        while !rest.is_char_boundary(end) {
            end += 1;
        }
        if end < rest.len() {
            if let Some(nl) = rest[..end].rfind('\n').filter(|&nl| nl > end / 2) {
                end = nl + 1;
            }
        }
        docs.push(&rest[..end]);
        rest = &rest[end..];
    }
    docs
}

fn files(dirs: &[PathBuf], accept: impl Fn(&Path) -> bool) -> Vec<PathBuf> {
    dirs.iter()
        .flat_map(entries)
        .filter(|p| p.is_file() && accept(p))
        .collect()
}

fn gather(kind: &'static str, source: &str, paths: &[PathBuf], limit: usize) -> Option<Corpus> {
    let mut text = String::new();
    for p in paths {
        if text.len() >= limit {
            break;
        }
        if let Ok(t) = std::fs::read_to_string(p) {
            text.push_str(&t);
            text.push('\n');
        }
    }
    (!text.is_empty()).then(|| Corpus {
        kind,
        source: source.into(),
        text: truncate(text, limit),
    })
}

fn truncate(mut text: String, limit: usize) -> String {
    if text.len() > limit {
        let mut end = limit;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// The entries of `dir`, sorted (none if it cannot be read).
fn entries(dir: impl AsRef<Path>) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    found.sort();
    found
}

fn python_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = entries("/usr/lib")
        .into_iter()
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("python3."))
        })
        .collect();
    if let Ok(home) = std::env::var("HOME") {
        for version in entries(format!("{home}/.pyenv/versions")) {
            dirs.extend(entries(version.join("lib")));
        }
    }
    dirs
}

/// `sub` (`doc`, `tutor`) of every installed vim runtime.
fn vim_dirs(sub: &str) -> Vec<PathBuf> {
    entries("/usr/share/vim")
        .into_iter()
        .map(|d| d.join(sub))
        .collect()
}

fn prose(limit: usize) -> Option<Corpus> {
    let mut paths = files(&["/usr/share/common-licenses".into()], |_| true);
    paths.extend(files(&vim_dirs("doc"), |p| {
        p.extension().is_some_and(|e| e == "txt")
    }));
    gather("prose", "licenses, vim help", &paths, limit)
}

fn code(limit: usize) -> Option<Corpus> {
    let paths = files(&python_dirs(), |p| p.extension().is_some_and(|e| e == "py"));
    gather("code", "Python stdlib", &paths, limit)
}

fn cjk(limit: usize) -> Option<Corpus> {
    let dirs: Vec<PathBuf> = python_dirs()
        .iter()
        .map(|d| d.join("test/cjkencodings"))
        .collect();
    let mut paths = files(&dirs, |p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.ends_with("-utf8.txt"))
    });
    // Several Python versions ship the same files: keep one copy of each.
    let mut seen = std::collections::HashSet::new();
    paths.retain(|p| seen.insert(p.file_name().map(|n| n.to_owned())));
    let mut found = files(&vim_dirs("tutor"), |p| {
        p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
            ["tutor.ja.", "tutor.ko.", "tutor.zh"]
                .iter()
                .any(|l| n.starts_with(l))
                && n.ends_with(".utf-8")
        })
    });
    found.extend(paths);
    gather(
        "cjk",
        "vim tutors ja/ko/zh, CPython cjkencodings",
        &found,
        limit,
    )
}

/// Tables, decimals, dates, money and arithmetic, generated.
fn numbers(limit: usize) -> Option<Corpus> {
    let mut rng = SplitMix64(1);
    let mut text = String::new();
    while text.len() < limit {
        let line = match rng.below(6) {
            0 => format!(
                "{}-{:02}-{:02}, {}.{:05}, {}\n",
                1900 + rng.below(130),
                1 + rng.below(12),
                1 + rng.below(28),
                rng.below(1000),
                rng.below(100_000),
                rng.below(10_000_000)
            ),
            1 => format!(
                "{} + {} = {}\n",
                rng.below(10_000),
                rng.below(10_000),
                rng.below(20_000)
            ),
            2 => format!(
                "${},{:03}.{:02}\n",
                rng.below(1000),
                rng.below(1000),
                rng.below(100)
            ),
            3 => format!(
                "{:.6e} {:.3} {}%\n",
                rng.next_u64() as f64 / 1e15,
                rng.next_u64() as f64 / 1e17,
                rng.below(100)
            ),
            4 => format!(
                "| {} | {} | {} |\n",
                rng.below(100),
                rng.below(100_000),
                rng.below(1_000_000_000)
            ),
            _ => format!("0x{:08X} {}\n", rng.next_u64() as u32, rng.below(256)),
        };
        text.push_str(&line);
    }
    Some(Corpus {
        kind: "numbers",
        source: "generated (seeded)".into(),
        text: truncate(text, limit),
    })
}

/// English words with emoji: single code points, skin tones, ZWJ families and flags.
fn emoji(limit: usize) -> Option<Corpus> {
    const WORDS: &[&str] = &[
        "the", "party", "was", "great", "see", "you", "soon", "love", "this", "so", "much",
        "happy", "birthday", "lol", "omg", "thanks", "team", "launch", "today", "coffee",
    ];
    const EMOJI: &[&str] = &[
        "😀",
        "😂",
        "🥲",
        "😍",
        "🤔",
        "🔥",
        "✨",
        "🎉",
        "👍",
        "👍🏽",
        "👋🏿",
        "❤️",
        "💯",
        "🚀",
        "🙏",
        "👨‍👩‍👧‍👦",
        "🧑‍💻",
        "🏳️‍🌈",
        "🇯🇵",
        "🇫🇷",
        "☕",
        "🍕",
        "🐍",
        "🦀",
    ];
    let mut rng = SplitMix64(2);
    let mut text = String::new();
    while text.len() < limit {
        for _ in 0..(3 + rng.below(8)) {
            text.push_str(WORDS[rng.below(WORDS.len() as u64) as usize]);
            text.push(' ');
        }
        for _ in 0..(1 + rng.below(3)) {
            text.push_str(EMOJI[rng.below(EMOJI.len() as u64) as usize]);
        }
        text.push(if rng.below(4) == 0 { '\n' } else { ' ' });
    }
    Some(Corpus {
        kind: "emoji",
        source: "generated (seeded)".into(),
        text: truncate(text, limit),
    })
}
