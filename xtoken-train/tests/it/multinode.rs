//! Training across processes on localhost, as torchrun starts them (feature `collective`): the
//! processes join over TCP, exchange through xtoken-collective's between-node all-reduce
//! (burn-collective 0.21's, fixed), and must end where one worker on the combined batch ends; a
//! process that dies ends the others with an error naming it.
#![cfg(feature = "collective")]

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::fixture::*;
use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use xtoken_models::Transformer;
use xtoken_train::cluster::parallel::ExchangeSettings;
use xtoken_train::cluster::{free_port_pair, join_as_node, run_workers, Placement, Plan, Timeouts};
use xtoken_train::config::ExchangeKind;

/// torchrun's variables for `rank` of `world` processes on this machine, and short timeouts
/// (unless the command sets its own).
fn torchrun_env(command: &mut Command, rank: usize, world: usize, port: u16) {
    command
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string());
    for (name, seconds) in [
        ("XTOKEN_PEER_TIMEOUT_S", "20"),
        ("XTOKEN_JOIN_TIMEOUT_S", "60"),
    ] {
        if !command.get_envs().any(|(k, _)| k == name) {
            command.env(name, seconds);
        }
    }
}

/// Processes started together, each logging to a file of its own.
struct Processes {
    children: Vec<Child>,
    logs: Vec<PathBuf>,
}

impl Processes {
    /// Starts `world` processes of `command(rank)`, logging under `dir`.
    fn start(dir: &Path, tag: &str, world: usize, command: impl Fn(usize) -> Command) -> Self {
        let port = free_port_pair().unwrap();
        let (mut children, mut logs) = (Vec::new(), Vec::new());
        for rank in 0..world {
            let log = dir.join(format!("{tag}-rank{rank}.log"));
            let mut c = command(rank);
            torchrun_env(&mut c, rank, world, port);
            let file = std::fs::File::create(&log).unwrap();
            c.stdout(file.try_clone().unwrap()).stderr(file);
            children.push(c.spawn().unwrap());
            logs.push(log);
        }
        Self { children, logs }
    }

    fn log(&self, rank: usize) -> String {
        std::fs::read_to_string(&self.logs[rank]).unwrap_or_default()
    }

    fn all_logs(&self) -> String {
        (0..self.logs.len())
            .map(|r| format!("--- rank {r}:\n{}", self.log(r)))
            .collect()
    }

    /// Waits for every process (killing them all past `limit`) and returns whether each
    /// succeeded.
    fn wait(mut self, limit: Duration) -> (Vec<bool>, Vec<String>) {
        let deadline = Instant::now() + limit;
        let mut status = vec![None; self.children.len()];
        while status.iter().any(Option::is_none) {
            for (child, s) in self.children.iter_mut().zip(&mut status) {
                if s.is_none() {
                    *s = child.try_wait().unwrap().map(|e| e.success());
                }
            }
            if Instant::now() > deadline {
                for child in &mut self.children {
                    child.kill().ok();
                }
                panic!(
                    "the processes did not end within {limit:?}:\n{}",
                    self.all_logs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let logs = (0..self.logs.len()).map(|r| self.log(r)).collect();
        (status.into_iter().map(Option::unwrap).collect(), logs)
    }
}

fn xtoken_train(config: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_xtoken"));
    c.args(["train", "--config", config.to_str().unwrap()])
        .args(extra);
    c
}

/// Runs `world` processes of `xtoken train` and asserts that every one succeeds.
fn train_across(
    f: &Fixture,
    tag: &str,
    config: &Path,
    world: usize,
    extra: &[&str],
) -> Vec<String> {
    let run = Processes::start(&f.dir.0, tag, world, |_| xtoken_train(config, extra));
    let (ok, logs) = run.wait(Duration::from_secs(300));
    assert!(
        ok.iter().all(|&o| o),
        "{tag}: {ok:?}\n{}",
        logs.join("\n---\n")
    );
    logs
}

fn parameters(dir: &Path) -> Vec<f32> {
    struct Collect(Vec<f32>);
    impl<B: Backend> ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let values = param.val().into_data().convert::<f32>();
            self.0.extend(values.to_vec::<f32>().unwrap());
        }
    }
    let model = Transformer::<NdArray>::load(dir, &Default::default()).unwrap();
    let mut collect = Collect(Vec::new());
    model.visit(&mut collect);
    collect.0
}

/// The run's configuration with `micro_batch` rows per micro-batch and 4 steps.
fn setup(f: &Fixture, name: &str, micro_batch: usize) -> PathBuf {
    let path = config(f, name, "save_dtype = \"f32\"");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("micro_batch = 2", &format!("micro_batch = {micro_batch}"))
        .replace("steps = 6", "steps = 4")
        .replace("warmup = 0.2", "warmup = 0.2\nlr = 1e-3");
    std::fs::write(&path, text).unwrap();
    path
}

/// One worker over four micro-batches of one row, two processes of one worker (two
/// micro-batches each), and two processes of two workers (one each) take the same rows, so
/// they must end with the same parameters; so must a two-process run stopped at step 3 and
/// resumed by both processes. Only the order of the gradient sums differs.
#[test]
fn processes_and_workers_end_where_one_worker_on_the_combined_batch_ends() {
    let f = fixture("multinode");
    xtoken_train(&setup(&f, "one", 1), &[])
        .output()
        .map(ok)
        .unwrap();
    let logs = train_across(&f, "two", &setup(&f, "two", 1), 2, &[]);
    assert!(
        logs[0].contains("2 processes × 1 workers ended with identical"),
        "{}",
        logs[0]
    );
    assert!(logs[1].contains("rank 1 of 2 (torchrun)"), "{}", logs[1]);
    train_across(&f, "four", &setup(&f, "four", 1), 2, &["--devices", "0,1"]);
    let resumed = setup(&f, "resumed", 1);
    train_across(&f, "stopped", &resumed, 2, &["--stop-after", "3"]);
    train_across(&f, "resumed", &resumed, 2, &["--resume"]);

    let one = parameters(&f.dir.0.join("one/student"));
    let moved = xtoken_testkit::max_abs_diff("trained vs initial", &one, &parameters(&f.student));
    assert!(moved > 1e-4, "the weights moved: {moved}");
    for run in ["two", "four", "resumed"] {
        let other = parameters(&f.dir.0.join(run).join("student"));
        let worst = xtoken_testkit::max_abs_diff(run, &one, &other);
        assert!(worst <= 1e-5, "{run}: largest difference {worst}");
    }
    // Only rank 0 writes: one metrics row per step, one student.
    let rows = std::fs::read_to_string(f.dir.0.join("two/metrics.csv")).unwrap();
    assert_eq!(rows.lines().count(), 1 + 4, "{rows}");
}

/// On-policy distillation across processes: with λ = 0.5, two processes of one worker (a
/// micro-batch of one row each) write the sequences one worker writes two at a time (each
/// sequence's sampling is seeded by its place in the global batch, not by its worker or its
/// neighbours), and end with its parameters.
#[test]
fn on_policy_processes_end_where_one_worker_ends() {
    let f = fixture("multinode-on-policy");
    let on_policy = |name: &str, micro_batch: usize| {
        let path = setup(&f, name, micro_batch);
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("[on_policy]\nfraction = 0.5\nprompt_tokens = 8\nmax_new_tokens = 12\n");
        std::fs::write(&path, text).unwrap();
        path
    };
    xtoken_train(&on_policy("one", 2), &[])
        .output()
        .map(ok)
        .unwrap();
    train_across(&f, "two", &on_policy("two", 1), 2, &[]);
    let one = parameters(&f.dir.0.join("one/student"));
    let moved = xtoken_testkit::max_abs_diff("trained vs initial", &one, &parameters(&f.student));
    assert!(moved > 1e-4, "the weights moved: {moved}");
    let two = parameters(&f.dir.0.join("two/student"));
    // One worker pads and batches two rows where each process has one: gradients agree to
    // float noise only, and AdamW's first steps move a weight with a near-zero gradient by
    // about ±lr whatever its size (1.0e-5 seen at lr = 1e-3; the data-parallel test's note).
    let worst = xtoken_testkit::max_abs_diff("one vs two processes", &one, &two);
    assert!(worst <= 1e-4, "largest difference {worst}");
    // The same sequences were written: the same share and the same tokens per sequence at
    // every step, and the same losses to float noise.
    let names = ["on_policy_share", "generated_tokens", "loss"];
    let (a, b) = (
        columns(&f.dir.0.join("one"), &names),
        columns(&f.dir.0.join("two"), &names),
    );
    assert_eq!(a.len(), 4);
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x[..2], y[..2], "{a:?} vs {b:?}");
        assert!(
            (x[2] - y[2]).abs() <= 1e-5 * x[2].abs().max(1.0),
            "{a:?} vs {b:?}"
        );
    }
    assert!(a.iter().any(|x| x[0] > 0.0 && x[0] < 1.0), "{a:?}");
}

/// Starts `world` processes on a long run (with `env` set) and returns once rank 0 has logged
/// two steps.
fn long_run(f: &Fixture, tag: &str, world: usize, env: &[(&str, &str)]) -> Processes {
    let path = setup(f, tag, 1);
    let text = std::fs::read_to_string(&path).unwrap();
    let text = text.replace("batch_size = 4", &format!("batch_size = {}", 2 * world));
    std::fs::write(&path, text.replace("steps = 4", "steps = 100000")).unwrap();
    let mut run = Processes::start(&f.dir.0, tag, world, |_| {
        let mut c = xtoken_train(&path, &[]);
        c.envs(env.iter().copied());
        c
    });
    let metrics = f.dir.0.join(tag).join("metrics.csv");
    let deadline = Instant::now() + Duration::from_secs(120);
    while std::fs::read_to_string(&metrics).map_or(0, |m| m.lines().count()) < 3 {
        let exited = run
            .children
            .iter_mut()
            .any(|c| c.try_wait().unwrap().is_some());
        assert!(
            !exited && Instant::now() < deadline,
            "no training:\n{}",
            run.all_logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    run
}

/// Kills rank `victim` of a long run and returns every process's log once all have ended (each
/// must fail, within seconds).
fn kill_mid_run(f: &Fixture, tag: &str, world: usize, victim: usize) -> Vec<String> {
    let mut run = long_run(f, tag, world, &[]);
    run.children[victim].kill().unwrap();
    let killed_at = Instant::now();
    let (ok, logs) = run.wait(Duration::from_secs(60));
    assert_eq!(ok, vec![false; world], "{}", logs.join("\n---\n"));
    assert!(killed_at.elapsed() < Duration::from_secs(20));
    logs
}

/// A process killed mid-run ends every other process at once, with an error naming its rank,
/// instead of leaving them waiting in an all-reduce: rank 1 of three, then rank 0 of two.
#[test]
fn a_killed_process_ends_the_others_with_an_error_naming_it() {
    let f = fixture("multinode-kill");
    let logs = kill_mid_run(&f, "kill-rank1", 3, 1);
    for rank in [0, 2] {
        let log = &logs[rank];
        assert!(
            log.contains("rank 1 exited or lost its connection"),
            "rank {rank}:\n{log}"
        );
        assert!(!log.contains("panicked"), "rank {rank}:\n{log}");
    }
    let logs = kill_mid_run(&f, "kill-rank0", 2, 0);
    let log = &logs[1];
    assert!(log.contains("error: rank 0 (127.0.0.1:"), "{log}");
    assert!(log.contains(") exited or lost its connection"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

/// A process that stops answering (SIGSTOP: alive, silent) ends the others after the peer
/// timeout, with an error naming it.
#[test]
fn a_silent_process_ends_the_others_after_the_peer_timeout() {
    let f = fixture("multinode-silent");
    let mut run = long_run(&f, "silent", 2, &[("XTOKEN_PEER_TIMEOUT_S", "2")]);
    let pid = run.children[1].id().to_string();
    let stopped = Command::new("kill").args(["-STOP", &pid]).status().unwrap();
    assert!(stopped.success());
    let stopped_at = Instant::now();
    while run.children[0].try_wait().unwrap().is_none() {
        assert!(
            stopped_at.elapsed() < Duration::from_secs(60),
            "{}",
            run.all_logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The 2 s run from the last heartbeat, which may have left up to 0.5 s before the stop.
    assert!(stopped_at.elapsed() >= Duration::from_millis(1400));
    run.children[1].kill().unwrap();
    let (ok, logs) = run.wait(Duration::from_secs(30));
    assert_eq!(ok, [false, false]);
    assert!(
        logs[0].contains("error: rank 1 sent nothing for 2 s"),
        "{}",
        logs[0]
    );
}

/// Processes that would not train alike are refused when they join, naming what differs; a
/// rank whose rank 0 never comes gives up after the join timeout, naming the address.
#[test]
fn processes_that_cannot_train_together_are_refused_by_name() {
    let f = fixture("multinode-refused");
    let path = setup(&f, "refused", 1);
    let run = Processes::start(&f.dir.0, "refused", 2, |rank| {
        let extra: &[&str] = if rank == 0 {
            &[]
        } else {
            &["--stop-after", "2"]
        };
        xtoken_train(&path, extra)
    });
    let (ok, logs) = run.wait(Duration::from_secs(120));
    assert_eq!(ok, [false, false]);
    assert!(
        logs[0].contains("rank 1 was started with another configuration"),
        "{}",
        logs[0]
    );
    assert!(logs[1].contains("rank 0 refused rank 1"), "{}", logs[1]);

    let mut alone = xtoken_train(&path, &[]);
    torchrun_env(&mut alone, 1, 2, free_port_pair().unwrap());
    let out = alone.env("XTOKEN_JOIN_TIMEOUT_S", "1").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("rank 0 at 127.0.0.1:") && err.contains("did not answer within 1 s"),
        "{err}"
    );
}

/// Runs the ignored test `name` of this module in `world` processes with torchrun's variables;
/// each must pass. Returns its path and each process's log.
fn children(name: &str, world: usize) -> (String, Vec<String>) {
    let dir = std::env::temp_dir().join(format!("xtoken-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let child = xtoken_testkit::process::test_path(module_path!(), name);
    let run = Processes::start(&dir, name, world, |_| {
        let mut c = Command::new(std::env::current_exe().unwrap());
        c.args([child.as_str(), "--exact", "--ignored", "--nocapture"]);
        c
    });
    let (ok, logs) = run.wait(Duration::from_secs(120));
    std::fs::remove_dir_all(&dir).ok();
    assert!(ok.iter().all(|&ok| ok), "{}", logs.join("\n---\n"));
    (child, logs)
}

/// Runs in each child process of the test below (ignored when run directly).
#[test]
#[ignore = "a child process of `exchanges_of_every_size_repeat_across_processes`"]
fn exchange_child() {
    let placement = Placement::from_env().unwrap().expect("torchrun variables");
    let plan = Plan {
        workers: 1,
        hash: 7,
    };
    let timeouts = Timeouts::from_env().unwrap();
    let (session, nodes) = join_as_node(&placement, plan, timeouts, ExchangeKind::Ring).unwrap();
    let devices = vec![Default::default()];
    let settings = ExchangeSettings::default();
    run_workers::<Autodiff<NdArray>, _, _>(devices, Some(&nodes), settings, |worker, device| {
        for round in 0..30usize {
            let size = 1 + (round * 7) % 40;
            let values: Vec<f64> = (0..size)
                .map(|i| ((worker.rank + 1) * (i + round)) as f64)
                .collect();
            let sums = worker.sum_values::<Autodiff<NdArray>>(values, &device)?;
            let expected: Vec<f64> = (0..size).map(|i| (3 * (i + round)) as f64).collect();
            assert_eq!(sums, expected, "round {round}");
        }
        Ok(())
    })
    .unwrap();
    session.finish(0).unwrap();
}

/// Thirty all-reduces of changing sizes between two processes, each checked. burn-collective
/// 0.21 as published reused its transfer ids and barrier state, so its second between-node
/// all-reduce hung (tracel-ai/burn#4549); xtoken-collective gives each its own.
#[test]
fn exchanges_of_every_size_repeat_across_processes() {
    let (child, logs) = children("exchange_child", 2);
    for log in &logs {
        assert!(log.contains(&format!("test {child} ... ok")), "{log}");
    }
}

/// `xtoken bench exchange` starts its processes, checks their sums and prints one row per size.
#[test]
fn the_exchange_benchmark_measures_between_processes() {
    let out = Command::new(env!("CARGO_BIN_EXE_xtoken"))
        .args([
            "bench",
            "exchange",
            "--values",
            "1000,4000",
            "--rounds",
            "1",
        ])
        .output()
        .unwrap();
    let (table, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{err}");
    let rows = ["| 1000 | 0 |", "| 4000 | 0 |"];
    for row in rows {
        assert_eq!(
            table.lines().filter(|l| l.starts_with(row)).count(),
            1,
            "{table}"
        );
    }
}

/// NCCL's library, as the tests find it: `XTOKEN_NCCL` (CI: the wheel `nvidia-nccl-cu12` that
/// `scripts/nccl-library.sh` installs), else where NCCL's users keep it.
#[cfg(feature = "cuda-sources")]
fn nccl_found() -> (PathBuf, String) {
    xtoken_kernels::nccl::found().unwrap_or_else(|e| {
        panic!("{e}\n(for the tests: XTOKEN_NCCL=\"$(bash scripts/nccl-library.sh)\")")
    })
}

/// Runs in each child process of the test below (ignored when run directly): joins the
/// session and prints the NCCL id rank 0 made, as the session carried it here.
#[cfg(feature = "cuda-sources")]
#[test]
#[ignore = "a child process of `the_nccl_id_rank_0_makes_reaches_every_process_byte_for_byte`"]
fn nccl_id_child() {
    use xtoken_train::cluster::{share_nccl_id, Session};
    let placement = Placement::from_env().unwrap().expect("torchrun variables");
    let plan = Plan {
        workers: 1,
        hash: 11,
    };
    let session = Session::join(&placement, plan, Timeouts::from_env().unwrap()).unwrap();
    let id = share_nccl_id(&session).unwrap();
    println!("nccl id: {}", id.to_hex());
    session.finish(0).unwrap();
}

/// Rank 0 loads libnccl (no GPU needed), makes a unique id, and the session carries it to two
/// other processes: all three print the same 128 bytes.
#[cfg(feature = "cuda-sources")]
#[test]
fn the_nccl_id_rank_0_makes_reaches_every_process_byte_for_byte() {
    nccl_found();
    let (_, logs) = children("nccl_id_child", 3);
    let ids: Vec<&str> = logs
        .iter()
        .map(|log| {
            let line = log.lines().find_map(|l| l.strip_prefix("nccl id: "));
            line.unwrap_or_else(|| panic!("no id printed:\n{log}"))
        })
        .collect();
    assert_eq!(ids[0].len(), 256, "{}", ids[0]);
    assert!(ids[0].chars().any(|c| c != '0'), "an id of zeros");
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
}

/// Creating a communicator on a machine without a GPU is an error naming the device and NCCL's
/// own words, at once: no panic, no hang. (With a driver, a communicator of one is created.)
#[cfg(feature = "cuda-sources")]
#[test]
fn a_communicator_without_a_device_is_an_error_naming_it() {
    use xtoken_kernels::nccl::{Communicator, UniqueId};
    nccl_found();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let id = UniqueId::new().unwrap();
        let made = Communicator::init(0, 0, 1, &id).map(|c| c.name().to_string());
        let _ = tx.send(made.map_err(|e| e.to_string()));
    });
    let made = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("creating the communicator hangs");
    match xtoken_kernels::device::missing_cuda_driver() {
        None => assert_eq!(made.unwrap(), "cuda:0 (rank 0 of 1)"),
        Some(_) => {
            let e = made.expect_err("no GPU here");
            assert!(e.contains("cuda:0 (rank 0 of 1)"), "{e}");
            assert!(e.contains("ncclCommInitRank"), "{e}");
            assert!(e.contains("CUDA driver"), "{e}");
        }
    }
}
