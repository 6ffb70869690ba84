//! Served teachers (`teachers[].server`, `xtoken serve`): a run taught by `xtoken serve` trains
//! exactly as the in-process teacher does at f32, its answers have vLLM's shape, `--check` asks
//! the server, and a server that fails mid-run (down, slow, 500, garbage, another model) ends
//! the run by name after its last checkpoint, resumable, with no step trained on a missing
//! answer.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::fixture::{fixture, metrics_without_timings, ok, train, xtoken, Fixture};

/// A running `xtoken serve`, stopped on drop.
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT/v1`.
    pub url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

/// Starts `xtoken serve` on `model` at f32 on the CPU, on a free port, as `name`.
pub fn serve(model: &Path, name: &str, extra: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_xtoken"))
        .args(["serve", "--model", model.to_str().unwrap(), "--port", "0"])
        .args(["--served-model-name", name, "--dtype", "f32"])
        .args(extra)
        .args(match extra.contains(&"--max-logprobs") {
            true => &[][..],
            false => &["--max-logprobs", "64"][..],
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start xtoken serve");
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let url = line
        .trim()
        .strip_prefix("serving on ")
        .unwrap_or_else(|| panic!("xtoken serve said {line:?}"))
        .to_string();
    Server { child, url }
}

/// A one-teacher run of `loss` on the fixture, one document per row (as the stored tests).
fn run_config(f: &Fixture, out: &str, teacher: &str, extra: &str) -> PathBuf {
    let text = format!(
        r#"
output_dir = "{out}"
seed = 5
[student]
model = "{student}"
[[teachers]]
name = "digits"
{teacher}
[data]
path = "{data}"
packing = "document"
[training]
steps = 4
batch_size = 2
micro_batch = 1
context_length = 96
warmup = 0.3
[loss]
top_k = 16
{extra}
[checkpoint]
every = 1
keep = 10
"#,
        out = f.dir.0.join(out).display(),
        student = f.student.display(),
        data = f.data.display(),
    );
    let path = f.dir.0.join(format!("{out}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

fn served_teacher(url: &str, f: &Fixture, loss: &str, extra: &str) -> String {
    format!(
        "server = \"{url}\"\nserved_model = \"tiny\"\ntokenizer = \"{}\"\nloss = \"{loss}\"\n{extra}",
        f.teacher.display()
    )
}

/// Per loss and answer format: the run taught by `xtoken serve` ends with the in-process
/// teacher's metrics and weights, bit for bit (adaptive weighting's entropy is exact in the
/// binary answer only, so it is compared there).
#[test]
fn a_run_taught_by_xtoken_serve_ends_as_the_in_process_teachers() {
    let f = fixture("served-exact");
    let server = serve(&f.teacher, "tiny", &["--device", "cpu"]);
    for (loss, loss_extra, answers) in [
        ("pkl", "", "binary_answers = true"),
        ("pkl", "", "binary_answers = false"),
        ("hkl", "", "binary_answers = false"),
        (
            "pkl",
            "weighting = \"neg_entropy\"",
            "binary_answers = true",
        ),
    ] {
        let online_teacher = format!(
            "model = \"{}\"\nloss = \"{loss}\"\ndtype = \"f32\"",
            f.teacher.display()
        );
        let online = run_config(&f, "online", &online_teacher, loss_extra);
        ok(train(&online, &[]));
        let teacher = served_teacher(&server.url, &f, loss, answers);
        let served = run_config(&f, "served", &teacher, loss_extra);
        let log = ok(train(&served, &[]));
        assert!(log.contains("served by"), "{log}");
        let (a, b) = (f.dir.0.join("online"), f.dir.0.join("served"));
        assert_eq!(
            metrics_without_timings(&a),
            metrics_without_timings(&b),
            "{loss} {loss_extra} {answers}: the metrics differ"
        );
        assert!(
            std::fs::read(a.join("student/model.safetensors")).unwrap()
                == std::fs::read(b.join("student/model.safetensors")).unwrap(),
            "{loss} {loss_extra} {answers}: the trained students differ"
        );
        for run in [&a, &b] {
            std::fs::remove_dir_all(run).unwrap();
        }
    }
}

/// A completion request's raw answer.
fn complete(url: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let answer = ureq::post(&format!("{url}/completions")).send_json(body);
    let response = match answer {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{e}"),
    };
    let status = response.status();
    (status, response.into_json().unwrap())
}

/// `xtoken serve` answers in vLLM's shape (entry 0 null, ids as decimal keys, the prompt
/// token's own entry with its rank), refuses what it cannot serve with a 400 (or 404 for a
/// model it does not serve) that says why, and lists its model with its bounds.
#[test]
fn xtoken_serve_answers_in_vllms_shape_and_refuses_bad_requests() {
    let f = fixture("served-shape");
    let server = serve(
        &f.teacher,
        "tiny",
        &["--max-logprobs", "5", "--max-body-bytes", "100000"],
    );
    let models: serde_json::Value = ureq::get(&format!("{}/models", server.url))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(models["data"][0]["id"], "tiny");
    assert_eq!(models["data"][0]["max_logprobs"], 5);
    let prompt: Vec<u32> = "Ann has 12".bytes().map(u32::from).collect();
    let (status, answer) = complete(
        &server.url,
        serde_json::json!({"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0,
                           "prompt_logprobs": 3}),
    );
    assert_eq!(status, 200, "{answer}");
    let list = answer["choices"][0]["prompt_logprobs"].as_array().unwrap();
    assert_eq!(list.len(), prompt.len());
    assert!(list[0].is_null());
    for (at, entries) in list.iter().enumerate().skip(1) {
        let entries = entries.as_object().unwrap();
        let own = entries
            .get(&prompt[at].to_string())
            .unwrap_or_else(|| panic!("position {at} lacks the prompt token's entry"));
        let rank = own["rank"].as_u64().unwrap();
        assert_eq!(entries.len(), if rank <= 3 { 3 } else { 4 }, "{entries:?}");
        let mut ranks: Vec<u64> = entries
            .values()
            .map(|e| e["rank"].as_u64().unwrap())
            .collect();
        ranks.sort_unstable();
        assert_eq!(&ranks[..3], &[1, 2, 3]);
        for (key, e) in entries {
            let id: u32 = key.parse().unwrap();
            assert!(id < 256 && e["logprob"].as_f64().unwrap() <= 0.0);
            assert!(e["decoded_token"].is_string());
        }
    }
    assert_eq!(answer["usage"]["prompt_tokens"], prompt.len());
    for (body, status, says) in [
        (
            serde_json::json!({"model": "other", "prompt": [1, 2]}),
            404,
            "does not exist",
        ),
        (
            serde_json::json!({"model": "tiny", "prompt": [1, 999]}),
            400,
            "prompt[1] = 999",
        ),
        (
            serde_json::json!({"model": "tiny", "prompt": []}),
            400,
            "empty",
        ),
        (
            serde_json::json!({"model": "tiny", "prompt": "text"}),
            400,
            "list of token ids",
        ),
        (
            serde_json::json!({"model": "tiny", "prompt": [1, 2], "prompt_logprobs": 6}),
            400,
            "greater than max allowed: 5",
        ),
        (
            serde_json::json!({"model": "tiny", "prompt": [1], "max_tokens": 0}),
            400,
            "max_tokens",
        ),
        (
            serde_json::json!({"prompt": [1]}),
            400,
            "missing field `model`",
        ),
    ] {
        let (got, answer) = complete(&server.url, body.clone());
        assert_eq!(got, status, "{body}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{body}: {message}");
    }
    let garbage = ureq::post(&format!("{}/completions", server.url)).send_string("{not json");
    assert!(matches!(garbage, Err(ureq::Error::Status(400, _))));
    // A body past --max-body-bytes is refused.
    let address = server
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/v1");
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let body = " ".repeat(100_500);
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut status = String::new();
    BufReader::new(&stream).read_line(&mut status).unwrap();
    assert!(status.starts_with("HTTP/1.1 413"), "{status}");
    // Still serving after all of that.
    let (status, _) = complete(
        &server.url,
        serde_json::json!({"model": "tiny", "prompt": [1, 2]}),
    );
    assert_eq!(status, 200);
}

/// `--check` asks the server and prints what it serves; a model the server does not list, a
/// tokenizer that is not the served model's, a top-K past the server's and a temperature other
/// than 1 are each refused by name.
#[test]
fn the_check_asks_the_server_and_refuses_what_does_not_fit() {
    let f = fixture("served-check");
    let server = serve(&f.teacher, "tiny", &["--max-logprobs", "20"]);
    let good = run_config(&f, "check", &served_teacher(&server.url, &f, "pkl", ""), "");
    let out = xtoken(&["train", "--config", good.to_str().unwrap(), "--check"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains(&format!("served by {}", server.url)),
        "{said}"
    );
    assert!(
        said.contains("model tiny, top-16 per position, binary answers"),
        "{said}"
    );
    let cases = [
        (
            served_teacher(&server.url, &f, "pkl", "").replace("\"tiny\"", "\"other\""),
            "",
            "not served_model = \"other\"",
        ),
        (
            served_teacher(&server.url, &f, "pkl", "").replace(
                &f.teacher.display().to_string(),
                &f.student.display().to_string(),
            ),
            "",
            "not a token id of this model",
        ),
        (
            served_teacher(&server.url, &f, "pkl", ""),
            "top_k = 32",
            "gives at most 20 log-probabilities",
        ),
        (
            served_teacher(&server.url, &f, "pkl", ""),
            "temperature = 2.0",
            "log-probabilities are at temperature 1",
        ),
        (
            served_teacher("http://127.0.0.1:9/v1", &f, "pkl", "retries = 0"),
            "",
            "http://127.0.0.1:9/v1/models did not answer in 1 tries",
        ),
    ];
    for (teacher, loss, says) in cases {
        let config = run_config(&f, "refused", &teacher, loss);
        let text = std::fs::read_to_string(&config)
            .unwrap()
            .replace("[loss]\ntop_k = 16\ntop_k = 32", "[loss]\ntop_k = 32");
        std::fs::write(&config, text).unwrap();
        for extra in [&[][..], &["--check"][..]] {
            let mut args = vec!["train", "--config", config.to_str().unwrap()];
            args.extend_from_slice(extra);
            let out = xtoken(&args);
            let all = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(!out.status.success(), "{says}: {all}");
            assert!(all.contains(says), "{says}: {all}");
            assert!(!f.dir.0.join("refused/metrics.csv").exists(), "{all}");
        }
    }
}

/// How the fault proxy answers once its good answers are spent.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Connections refused: the server is gone.
    Down,
    /// Answers later than the client waits.
    Slow,
    /// HTTP 500.
    Error,
    /// 200 with what is not an answer.
    Garbage,
    /// A well-formed answer for another model.
    OtherModel,
}

/// A proxy in front of `upstream` that forwards `good` completion requests (and every model
/// list), then fails each as `fault` says until healed (the flag returned; `Down` stays down).
/// Answers go as JSON.
fn fault_proxy(upstream: String, good: usize, fault: Fault) -> (String, Arc<AtomicBool>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let healed = Arc::new(AtomicBool::new(false));
    let heal = healed.clone();
    let served = Arc::new(AtomicUsize::new(0));
    std::thread::spawn(move || loop {
        let Ok((stream, _)) = listener.accept() else {
            return;
        };
        let (upstream, count, healed) = (upstream.clone(), served.clone(), healed.clone());
        std::thread::spawn(move || {
            let fault = (!healed.load(Ordering::Relaxed)).then_some(fault);
            proxy_one(stream, &upstream, &count, good, fault)
        });
        if matches!(fault, Fault::Down) && served.load(Ordering::Relaxed) >= good {
            // Gone: the listener closes, later connections are refused.
            std::thread::sleep(Duration::from_millis(200));
            return;
        }
    });
    (url, heal)
}

/// Reads one request off `stream` and answers it.
fn proxy_one(
    mut stream: TcpStream,
    upstream: &str,
    served: &AtomicUsize,
    good: usize,
    fault: Option<Fault>,
) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut head = String::new();
    let mut length = 0;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
        if line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).ok();
    let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
    let base = upstream.trim_end_matches("/v1");
    let forward = || -> (u16, String) {
        let url = format!("{base}{path}");
        let answer = match head.starts_with("GET") {
            true => ureq::get(&url).call(),
            false => ureq::post(&url)
                .set("Content-Type", "application/json")
                .send_bytes(&body),
        };
        match answer {
            Ok(r) => (r.status(), r.into_string().unwrap()),
            Err(ureq::Error::Status(s, r)) => (s, r.into_string().unwrap()),
            Err(e) => (502, e.to_string()),
        }
    };
    let completion = path.ends_with("/completions");
    let n = if completion {
        served.fetch_add(1, Ordering::Relaxed)
    } else {
        0
    };
    let (status, text) = match fault.filter(|_| completion && n >= good) {
        None => forward(),
        Some(fault) => match fault {
            Fault::Down => return,
            Fault::Slow => {
                std::thread::sleep(Duration::from_secs(3));
                forward()
            }
            Fault::Error => (500, "{\"error\": {\"message\": \"engine died\"}}".into()),
            Fault::Garbage => (200, "<html>a proxy's error page</html>".into()),
            Fault::OtherModel => {
                let (s, t) = forward();
                (
                    s,
                    t.replacen("\"model\":\"tiny\"", "\"model\":\"other\"", 1),
                )
            }
        },
    };
    let response = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
    stream.write_all(response.as_bytes()).ok();
}

/// Per fault: the run ends with an error naming the server and its last answer, after the
/// checkpoint of the last step whose answers all came (fewer steps than asked in its metrics,
/// every one of them trained as the in-process teacher trains it); `--resume` against a healthy
/// server finishes the run.
#[test]
fn a_failing_server_ends_the_run_by_name_and_it_resumes() {
    let f = fixture("served-faults");
    let server = serve(&f.teacher, "tiny", &[]);
    let online = run_config(
        &f,
        "online",
        &format!(
            "model = \"{}\"\nloss = \"pkl\"\ndtype = \"f32\"",
            f.teacher.display()
        ),
        "",
    );
    ok(train(&online, &[]));
    let steps_of = |dir: &Path| metrics_without_timings(dir);
    let online_steps = steps_of(&f.dir.0.join("online"));
    // The probe of the tokenizer, then two rows per step, one request each: 5 good answers
    // are the probe and steps 1 and 2.
    for (fault, says) in [
        (Fault::Down, "did not answer in 2 tries"),
        (Fault::Slow, "timed out"),
        (
            Fault::Error,
            "HTTP 500: {\"error\": {\"message\": \"engine died\"}}",
        ),
        (Fault::Garbage, "answered what cannot be used"),
        (Fault::OtherModel, "answered for model \"other\""),
    ] {
        let (url, heal) = fault_proxy(server.url.clone(), 5, fault);
        let teacher = served_teacher(
            &url,
            &f,
            "pkl",
            "retries = 1\ntimeout_s = 1.0\nbinary_answers = false",
        );
        let config = run_config(&f, "faulty", &teacher, "");
        let out = train(&config, &[]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{fault:?}: {err}");
        assert!(
            err.contains(&url),
            "{fault:?}: the server is not named: {err}"
        );
        assert!(err.contains(says), "{fault:?}: {err}");
        let run = f.dir.0.join("faulty");
        let trained = steps_of(&run);
        // The header and steps 1 and 2.
        assert_eq!(trained, online_steps[..3].to_vec(), "{fault:?}: {err}");
        if matches!(fault, Fault::Error) {
            // The server answers again: the run continues from step 2.
            heal.store(true, Ordering::Relaxed);
            ok(train(&config, &["--resume"]));
            assert_eq!(steps_of(&run), online_steps, "{fault:?}: resumed");
        }
        std::fs::remove_dir_all(&run).unwrap();
    }
}

/// Served, stored and in-process teachers in one run: two teachers (one of the student's own
/// tokenizer, under KL) end bit for bit as the same run with both in-process, whichever way each
/// is given (one document per row, within the context, as stored targets need).
#[test]
fn served_stored_and_in_process_teachers_mix_in_one_run() {
    let f = fixture("served-mix");
    let server = serve(&f.teacher, "tiny", &[]);
    let per_document = |out: &str| {
        let path = crate::fixture::config(&f, out, "");
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("[data]\n", "[data]\npacking = \"document\"\n")
            .replace("context_length = 24", "context_length = 96")
            .replace("model = \"", "dtype = \"f32\"\nmodel = \"")
            .replacen("dtype = \"f32\"\nmodel = \"", "model = \"", 1);
        std::fs::write(&path, text).unwrap();
        path
    };
    let online = per_document("mix-online");
    ok(train(&online, &[]));
    let store = f.dir.0.join("mix-store");
    ok(xtoken(&[
        "teach",
        "--config",
        online.to_str().unwrap(),
        "--out",
        store.to_str().unwrap(),
    ]));
    let mixed = per_document("mix-mixed");
    let text = std::fs::read_to_string(&mixed)
        .unwrap()
        .replace(
            &format!("model = \"{}\"", f.teacher.display()),
            &format!(
                "server = \"{}\"\nserved_model = \"tiny\"\ntokenizer = \"{}\"",
                server.url,
                f.teacher.display()
            ),
        )
        .replace(
            &format!("model = \"{}\"", f.twin.display()),
            &format!("targets = \"{}\"", store.join("same").display()),
        );
    std::fs::write(&mixed, text).unwrap();
    let log = ok(train(&mixed, &[]));
    assert!(
        log.contains("served by") && log.contains("stored targets"),
        "{log}"
    );
    let (a, b) = (f.dir.0.join("mix-online"), f.dir.0.join("mix-mixed"));
    assert_eq!(metrics_without_timings(&a), metrics_without_timings(&b));
    assert!(
        std::fs::read(a.join("student/model.safetensors")).unwrap()
            == std::fs::read(b.join("student/model.safetensors")).unwrap(),
        "the trained students differ"
    );
}

/// `xtoken teach` fills a store from a served teacher: runs from it train exactly as runs from
/// the store the in-process teacher wrote.
#[test]
fn a_store_filled_from_a_served_teacher_trains_as_the_in_process_ones() {
    let f = fixture("served-teach");
    let server = serve(&f.teacher, "tiny", &[]);
    let teach = |teacher: &str, out: &str| -> PathBuf {
        let config = run_config(&f, &format!("teach-{out}"), teacher, "");
        let text = std::fs::read_to_string(&config).unwrap() + "[teach]\ntop_k = 16\nwindow = 40\n";
        std::fs::write(&config, text).unwrap();
        let store = f.dir.0.join(out);
        let log = ok(xtoken(&[
            "teach",
            "--config",
            config.to_str().unwrap(),
            "--out",
            store.to_str().unwrap(),
        ]));
        assert!(log.contains("teacher digits"), "{log}");
        store.join("digits")
    };
    let in_process = teach(
        &format!(
            "model = \"{}\"\nloss = \"pkl\"\ndtype = \"f32\"",
            f.teacher.display()
        ),
        "store-model",
    );
    let served = teach(&served_teacher(&server.url, &f, "pkl", ""), "store-served");
    let mut metrics = Vec::new();
    for (store, out) in [(&in_process, "from-model"), (&served, "from-served")] {
        let teacher = format!("targets = \"{}\"\nloss = \"pkl\"", store.display());
        let config = run_config(&f, out, &teacher, "");
        ok(train(&config, &[]));
        metrics.push(metrics_without_timings(&f.dir.0.join(out)));
    }
    assert_eq!(metrics[0], metrics[1]);
}
