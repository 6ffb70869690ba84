//! What the connections of a session share: rank 0's view of the barriers, the end and the
//! all-reduces entered, under one lock with a condition variable for the waiters, and the lines
//! sent to the other ranks.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::Write;
use std::net::TcpStream;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use crate::error::Result;

/// Another rank and rank 0's connection to it.
pub(super) type Peer = (usize, Arc<Mutex<TcpStream>>);

#[derive(Default)]
pub(super) struct Shared {
    pub(super) state: Mutex<State>,
    pub(super) changed: Condvar,
}

pub(super) type Hook = Box<dyn FnOnce(String) + Send>;

#[derive(Default)]
pub(super) struct State {
    /// Barriers every rank has reached.
    pub(super) released: HashSet<String>,
    /// Rank 0: the ranks at each barrier.
    pub(super) ready: HashMap<String, BTreeSet<usize>>,
    /// Rank 0: each rank's parameter fingerprint at the end.
    pub(super) done: BTreeMap<usize, u64>,
    /// The end, as rank 0 judged it.
    pub(super) ended: Option<Result<(), String>>,
    /// Why the run stopped, naming the rank at fault.
    pub(super) aborted: Option<String>,
    /// Called once with the abort's message (ends a waiting [`Session::run`]).
    pub(super) hook: Option<Hook>,
    /// Rank 0: the all-reduces each rank has entered (its slowest worker's count).
    pub(super) at: BTreeMap<usize, u64>,
    /// Rank 0: when, and by which rank, each all-reduce was first entered.
    pub(super) reached: BTreeMap<u64, (Instant, usize)>,
    /// What rank 0 shared with every rank ([`super::Session::share`]), by name.
    pub(super) values: HashMap<String, String>,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Stops the run with `message`: wakes every waiter and the running [`Session::run`].
pub(super) fn abort(shared: &Shared, message: String) {
    let hook = {
        let mut state = shared.lock();
        if state.aborted.is_some() {
            return;
        }
        state.aborted = Some(message.clone());
        state.hook.take()
    };
    shared.changed.notify_all();
    if let Some(hook) = hook {
        hook(message);
    }
}

pub(super) fn broadcast(peers: &[Peer], line: &str, except: Option<usize>) {
    for (_, stream) in peers.iter().filter(|(r, _)| Some(*r) != except) {
        let _ = send(stream, line);
    }
}

pub(super) fn send(stream: &Mutex<TcpStream>, line: &str) -> Result<()> {
    let mut stream = stream.lock().unwrap_or_else(|e| e.into_inner());
    stream.write_all(format!("{line}\n").as_bytes())?;
    Ok(())
}
