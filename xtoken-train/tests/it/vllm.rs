//! Against the real vLLM (PyPI's CPU build, `scripts/vllm-venv.sh`; its Python in
//! `XTOKEN_VLLM_PYTHON`): one tiny random Llama served by vLLM and by `xtoken serve` gives the
//! same teacher entries within vLLM's f32 error, `xtoken serve`'s answers have vLLM's exact
//! shape, and a run trains from each.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use burn::backend::NdArray;
use burn::tensor::DType;
use xtoken_models::config::Architecture;
use xtoken_models::{SaveDtype, Transformer};
use xtoken_train::targets::served::{Format, ServedSettings, ServedTeacher};

use crate::fixture::{columns, fixture, ok, train, Fixture};
use crate::served::serve;

/// vLLM's server, stopped on drop.
struct Vllm {
    child: Child,
    url: String,
}

impl Drop for Vllm {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Starts vLLM on `model` as `tiny` and waits for its health (at most 10 minutes).
fn vllm(model: &Path, cache: &Path) -> Vllm {
    let python = std::env::var("XTOKEN_VLLM_PYTHON").expect(
        "XTOKEN_VLLM_PYTHON: the Python of a virtual environment with vLLM \
         (export XTOKEN_VLLM_PYTHON=\"$(bash scripts/vllm-venv.sh)\")",
    );
    let port = free_port();
    let log = cache.join("vllm.log");
    let child = Command::new(python)
        .args(["-m", "vllm.entrypoints.openai.api_server", "--model"])
        .arg(model)
        .args(["--served-model-name", "tiny", "--dtype", "float32"])
        .args([
            "--max-logprobs",
            "64",
            "--host",
            "127.0.0.1",
            "--enforce-eager",
        ])
        .args(["--port", &port.to_string()])
        .env("VLLM_CPU_KVCACHE_SPACE", "1")
        .env("VLLM_CACHE_ROOT", cache)
        .env("VLLM_NO_USAGE_STATS", "1")
        .env("HF_HUB_OFFLINE", "1")
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(Stdio::from(
            std::fs::File::create(cache.join("vllm.err")).unwrap(),
        ))
        .spawn()
        .expect("start vLLM");
    let mut server = Vllm {
        child,
        url: format!("http://127.0.0.1:{port}/v1"),
    };
    let started = Instant::now();
    let health = format!("http://127.0.0.1:{port}/health");
    loop {
        if ureq::get(&health).call().is_ok() {
            return server;
        }
        let exited = server.child.try_wait().unwrap();
        if exited.is_some() || started.elapsed() > Duration::from_secs(600) {
            let mut err = String::new();
            std::fs::File::open(cache.join("vllm.err"))
                .and_then(|mut f| f.read_to_string(&mut err))
                .ok();
            let tail: String = err
                .chars()
                .rev()
                .take(4000)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            panic!("vLLM did not become healthy ({exited:?}):\n{tail}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A tiny random Llama with vLLM's CPU attention's head size (32), the fixture teacher's
/// tokenizer.
fn model(f: &Fixture) -> std::path::PathBuf {
    let dir = f.dir.0.join("vllm-teacher");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(f.teacher.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    let arch = Architecture::llama(256, 64, 128, 2, 2, 1);
    assert_eq!(arch.head_dim, 32);
    let model = Transformer::<NdArray>::random(&arch, 11, DType::F32, &Default::default()).unwrap();
    model.save(&dir, SaveDtype::F32).unwrap();
    dir
}

fn client(url: &str, width: usize) -> ServedTeacher {
    let settings = ServedSettings {
        name: "tiny".into(),
        server: url.into(),
        model: "tiny".into(),
        requests: 4,
        timeout: Duration::from_secs(120),
        retries: 0,
        format: Format::Json,
    };
    ServedTeacher::connect(settings, 16, width).unwrap().0
}

fn run_config(f: &Fixture, out: &str, url: &str, tokenizer: &Path) -> std::path::PathBuf {
    let text = format!(
        r#"
output_dir = "{out}"
seed = 5
[student]
model = "{student}"
[[teachers]]
name = "served"
server = "{url}"
served_model = "tiny"
tokenizer = "{tokenizer}"
loss = "pkl"
binary_answers = false
[data]
path = "{data}"
packing = "document"
[training]
steps = 2
batch_size = 2
micro_batch = 1
context_length = 96
[loss]
top_k = 16
[checkpoint]
every = 100
"#,
        out = f.dir.0.join(out).display(),
        student = f.student.display(),
        tokenizer = tokenizer.display(),
        data = f.data.display(),
    );
    let path = f.dir.0.join(format!("{out}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
#[cfg_attr(
    not(xtoken_vllm),
    ignore = "needs XTOKEN_VLLM_PYTHON (export XTOKEN_VLLM_PYTHON=\"$(bash scripts/vllm-venv.sh)\")"
)]
fn vllm_and_xtoken_serve_teach_alike() {
    let f = fixture("vllm");
    let dir = model(&f);
    let cache = f.dir.0.join("vllm-cache");
    std::fs::create_dir_all(&cache).unwrap();
    let vllm = vllm(&dir, &cache);
    let ours = serve(&dir, "tiny", &["--device", "cpu"]);

    // The same prompts answered by both: every position's top-16 and the prompt token's own
    // log-probability within vLLM's f32 error; its rank the same.
    let prompts: Vec<Vec<u32>> = crate::fixture::problems(6)
        .iter()
        .map(|t| t.bytes().map(u32::from).collect())
        .collect();
    let (a, b) = (client(&vllm.url, 256), client(&ours.url, 256));
    let (theirs, mine) = (a.answers(&prompts).unwrap(), b.answers(&prompts).unwrap());
    let mut worst = 0f32;
    for (t, m) in theirs.iter().zip(&mine) {
        assert_eq!(t.observed.len(), m.observed.len());
        for p in 0..t.observed.len() {
            worst = worst.max((t.observed[p] - m.observed[p]).abs());
            let (ti, mi) = (&t.ids[p * 16..(p + 1) * 16], &m.ids[p * 16..(p + 1) * 16]);
            for (j, id) in mi.iter().enumerate() {
                // A near tie at the edge may swap the last entries; every shared one agrees.
                if let Some(i) = ti.iter().position(|x| x == id) {
                    worst = worst.max((t.logp[p * 16 + i] - m.logp[p * 16 + j]).abs());
                } else {
                    assert!(
                        j >= 14,
                        "position {p}: token {id} of ours is not in vLLM's top-16"
                    );
                }
            }
        }
    }
    assert!(worst < 1e-4, "the two servers differ by {worst}");

    // Raw answers: the same shape — entry 0 null, the same keys, ranks and texts.
    let request = serde_json::json!({"model": "tiny", "prompt": prompts[0], "max_tokens": 1,
                                     "temperature": 0, "prompt_logprobs": 5});
    let raw = |url: &str| -> serde_json::Value {
        ureq::post(&format!("{url}/completions"))
            .send_json(request.clone())
            .unwrap()
            .into_json()
            .unwrap()
    };
    let (theirs, mine) = (raw(&vllm.url), raw(&ours.url));
    let list = |v: &serde_json::Value| {
        v["choices"][0]["prompt_logprobs"]
            .as_array()
            .unwrap()
            .clone()
    };
    let (tl, ml) = (list(&theirs), list(&mine));
    assert_eq!(tl.len(), ml.len());
    assert!(tl[0].is_null() && ml[0].is_null());
    let mut same_keys = 0;
    for (t, m) in tl.iter().zip(&ml).skip(1) {
        let (t, m) = (t.as_object().unwrap(), m.as_object().unwrap());
        for (key, e) in m {
            let Some(te) = t.get(key) else { continue };
            same_keys += 1;
            assert_eq!(te["rank"], e["rank"], "{key}: {te} vs {e}");
            assert_eq!(
                te["decoded_token"], e["decoded_token"],
                "{key}: {te} vs {e}"
            );
        }
        assert!(t.len() == m.len(), "{t:?} vs {m:?}");
    }
    assert!(same_keys > 5 * (tl.len() - 1) - 3, "{same_keys}");
    assert_eq!(theirs["model"], mine["model"]);
    assert_eq!(theirs["object"], mine["object"]);

    // A run from each trains; their first losses agree within vLLM's error.
    let mut kd = Vec::new();
    for (name, url) in [("from-vllm", &vllm.url), ("from-xtoken", &ours.url)] {
        let config = run_config(&f, name, url, &dir);
        let log = ok(train(&config, &[]));
        assert!(log.contains(&format!("served by {url}")), "{log}");
        kd.push(columns(&f.dir.0.join(name), &["kd"]));
    }
    for (a, b) in kd[0].iter().zip(&kd[1]) {
        assert!(
            (a[0] - b[0]).abs() <= 1e-3 * a[0].abs().max(1.0),
            "{a:?} vs {b:?}"
        );
    }
}
