//! Ranks that stay behind: every worker notes the all-reduces it enters ([`ExchangeLog`]), each
//! process tells rank 0 the count of its slowest worker, and rank 0 ends the run, naming the
//! ranks, when some have not entered an all-reduce that another rank entered longer ago than
//! the exchange timeout. A rank stuck in its own work (a hung device, a deadlock) is alive for
//! the heartbeats, so only this notices it.

use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::state::{abort, broadcast, send, Peer, Shared, State};

/// Where one worker of this process notes the all-reduces it enters.
#[derive(Clone)]
pub struct ExchangeLog {
    process: Arc<Process>,
    worker: usize,
}

/// What the workers of one process share: their counts, and the count last told to rank 0.
struct Process {
    counts: Vec<AtomicU64>,
    told: Mutex<u64>,
    shared: Arc<Shared>,
    /// The connection to rank 0 (none on rank 0 itself).
    report: Option<Arc<Mutex<TcpStream>>>,
}

impl std::fmt::Debug for ExchangeLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ExchangeLog(worker {})", self.worker)
    }
}

impl ExchangeLog {
    pub(super) fn for_workers(
        workers: usize,
        shared: Arc<Shared>,
        report: Option<Arc<Mutex<TcpStream>>>,
    ) -> Vec<Self> {
        let process = Arc::new(Process {
            counts: (0..workers).map(|_| AtomicU64::new(0)).collect(),
            told: Mutex::new(0),
            shared,
            report,
        });
        (0..workers)
            .map(|worker| Self {
                process: process.clone(),
                worker,
            })
            .collect()
    }

    /// Why the run stopped, once this process knows (another rank failed or fell behind).
    pub fn stopped(&self) -> Option<String> {
        self.process.shared.lock().aborted.clone()
    }

    /// Notes that this worker enters its next all-reduce.
    pub fn entered(&self) {
        let p = &self.process;
        p.counts[self.worker].fetch_add(1, Ordering::Relaxed);
        let slowest = p
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .min()
            .unwrap_or(0);
        let mut told = p.told.lock().unwrap_or_else(|e| e.into_inner());
        if slowest <= *told {
            return;
        }
        *told = slowest;
        match &p.report {
            Some(stream) => {
                let _ = send(stream, &format!("at {slowest}"));
            }
            None => record(&mut p.shared.lock(), 0, slowest),
        }
    }
}

/// Rank 0: notes that `rank` entered all-reduce number `count`.
pub(super) fn record(state: &mut State, rank: usize, count: u64) {
    state.at.insert(rank, count);
    state.reached.entry(count).or_insert((Instant::now(), rank));
    let lowest = state.at.values().copied().min().unwrap_or(0);
    state.reached.retain(|&k, _| k + 1 >= lowest);
}

/// Rank 0: checks every second for ranks behind an all-reduce entered over `timeout` ago.
pub(super) fn watchdog(shared: Arc<Shared>, peers: Vec<Peer>, world: usize, timeout: Duration) {
    let every = (timeout / 10).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let _ = std::thread::Builder::new()
        .name("xtoken-exchanges".into())
        .spawn(move || loop {
            std::thread::sleep(every);
            let stalled = {
                let state = shared.lock();
                if state.ended.is_some() || state.aborted.is_some() {
                    return;
                }
                stalled(&state, world, timeout)
            };
            if let Some(message) = stalled {
                broadcast(&peers, &format!("abort {message}"), None);
                abort(&shared, message);
                return;
            }
        });
}

/// The message naming the ranks behind the furthest all-reduce, once it is over `timeout` old.
fn stalled(state: &State, world: usize, timeout: Duration) -> Option<String> {
    let furthest = state.at.values().copied().max()?;
    let (since, first) = *state.reached.get(&furthest)?;
    if since.elapsed() <= timeout {
        return None;
    }
    let behind: Vec<usize> = (0..world)
        .filter(|r| state.at.get(r).copied().unwrap_or(0) < furthest)
        .collect();
    (!behind.is_empty()).then(|| {
        format!(
            "rank(s) {behind:?} did not reach all-reduce {furthest}, which rank {first} entered \
             {:.0} s ago (XTOKEN_EXCHANGE_TIMEOUT_S = {} s): stuck or far slower than the others",
            since.elapsed().as_secs_f64(),
            timeout.as_secs_f64()
        )
    })
}
