//! The processes of one run, joined over TCP: rank 0 listens on `MASTER_PORT`, every other rank
//! connects and says who it is and what it will run; rank 0 checks that they agree and answers
//! with the address it sees the rank at. The connections stay open for the whole run as its
//! control channel: barriers, heartbeats, the end (every rank's parameter fingerprint), and
//! failures. A rank that exits, fails, or goes silent for the peer timeout ends every other rank
//! with an error naming it; a training thread stuck in an exchange with it is left behind.
//!
//! The lines on the wire (text, one per message):
//! - to rank 0: `hello RANK WORLD WORKERS PLAN`, `beat`, `ready BARRIER`, `at EXCHANGE`,
//!   `failed MESSAGE`, `done FINGERPRINT`;
//! - from rank 0: `welcome ADDRESS` or `refused MESSAGE`, `beat`, `go BARRIER`,
//!   `share NAME VALUE` (one word each), `abort MESSAGE`, `end ok` or `end MESSAGE`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use super::exchanges::{record, watchdog, ExchangeLog};
use super::placement::Placement;
use super::state::{abort, broadcast, send, Peer, Shared, State};
use crate::error::{Error, Result};

/// How long to wait for the other processes.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// For every rank to join (`XTOKEN_JOIN_TIMEOUT_S`, default 600 s: a cluster may start its
    /// processes minutes apart).
    pub join: Duration,
    /// For a rank that sends nothing, not even its heartbeat (`XTOKEN_PEER_TIMEOUT_S`,
    /// default 60 s). A rank that exits is noticed at once, whatever this is.
    pub peer: Duration,
    /// For the ranks that have not reached an all-reduce the others entered
    /// (`XTOKEN_EXCHANGE_TIMEOUT_S`, default 1800 s: rank 0 may be writing a checkpoint).
    pub exchange: Duration,
}

impl Timeouts {
    /// The timeouts the environment sets, or the defaults.
    pub fn from_env() -> Result<Self> {
        let seconds = |name: &str, default: u64| -> Result<Duration> {
            match std::env::var(name) {
                Err(_) => Ok(Duration::from_secs(default)),
                Ok(v) => v
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s > 0.0)
                    .map(Duration::from_secs_f64)
                    .ok_or_else(|| {
                        Error::Config(format!("{name} = {v:?}: not a number of seconds"))
                    }),
            }
        };
        Ok(Self {
            join: seconds("XTOKEN_JOIN_TIMEOUT_S", 600)?,
            peer: seconds("XTOKEN_PEER_TIMEOUT_S", 60)?,
            exchange: seconds("XTOKEN_EXCHANGE_TIMEOUT_S", 1800)?,
        })
    }
}

/// What every process of a run must agree on: its workers (devices) and a hash of everything
/// that decides the run (the configuration, the options).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Data-parallel workers in this process.
    pub workers: usize,
    /// A hash of the resolved configuration and the run options.
    pub hash: u64,
}

/// This process's place in a joined run, and its control channel to the others.
pub struct Session {
    placement: Placement,
    timeouts: Timeouts,
    /// The host the other processes reach this one at (rank 0: `MASTER_ADDR`; others: the
    /// address rank 0 saw them connect from).
    pub host: String,
    shared: Arc<Shared>,
    link: Link,
}

pub(super) enum Link {
    /// Rank 0: every other rank's connection.
    Leader(Vec<Peer>),
    /// The connection to rank 0.
    Member(Arc<Mutex<TcpStream>>),
}

impl Session {
    /// Joins the run `placement` describes: rank 0 waits for every other rank, the others
    /// connect to it; both within `timeouts.join`.
    pub fn join(placement: &Placement, plan: Plan, timeouts: Timeouts) -> Result<Self> {
        let session = if placement.rank == 0 {
            lead(placement, plan, timeouts)?
        } else {
            member(placement, plan, timeouts)?
        };
        session.watch();
        Ok(session)
    }

    /// This process's placement.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// One log per worker of this process, in which each worker notes the all-reduces it
    /// enters: rank 0 ends the run, naming them, when ranks stay behind an all-reduce the others
    /// entered for longer than the exchange timeout.
    pub fn exchange_logs(&self, workers: usize) -> Vec<ExchangeLog> {
        let report = match &self.link {
            Link::Leader(_) => None,
            Link::Member(stream) => Some(stream.clone()),
        };
        ExchangeLog::for_workers(workers, self.shared.clone(), report)
    }

    /// Waits until every rank has reached the barrier `name`.
    pub fn barrier(&self, name: &str) -> Result<()> {
        match &self.link {
            Link::Leader(peers) => {
                let mut state = self.shared.lock();
                state.ready.entry(name.into()).or_default().insert(0);
                release_if_complete(&mut state, name, self.placement.world, peers);
                drop(state);
                self.shared.changed.notify_all();
            }
            Link::Member(stream) => send(stream, &format!("ready {name}"))?,
        }
        self.wait(|s| s.released.contains(name).then_some(Ok(())))
    }

    /// What rank 0 makes with `make` (one word of text, such as NCCL's unique id), carried to
    /// every rank under `name`: rank 0 sends it, the others wait for it. An error of `make`
    /// ends every rank with it.
    pub fn share(&self, name: &str, make: impl FnOnce() -> Result<String>) -> Result<String> {
        match &self.link {
            Link::Leader(peers) => {
                let value = make().inspect_err(|e| self.fail(&e.report()))?;
                if value.split_whitespace().count() != 1 || name.contains(' ') {
                    return Err(Error::Parallel(format!(
                        "shared value {name:?} must be one word: {value:?}"
                    )));
                }
                broadcast(peers, &format!("share {name} {value}"), None);
                Ok(value)
            }
            Link::Member(_) => self.wait(|s| s.values.get(name).cloned().map(Ok)),
        }
    }

    /// Ends the run on every rank: the others stop with `message` (which names this rank).
    pub fn fail(&self, message: &str) {
        let message = one_line(message);
        match &self.link {
            Link::Leader(peers) => {
                let text = format!("rank 0 failed: {message}");
                broadcast(peers, &format!("abort {text}"), None);
                abort(&self.shared, text);
            }
            Link::Member(stream) => {
                let _ = send(stream, &format!("failed {message}"));
            }
        }
    }

    /// The end of a run: waits until every rank has finished, and fails if their parameters
    /// (their `fingerprint`s) differ.
    pub fn finish(&self, fingerprint: u64) -> Result<()> {
        match &self.link {
            Link::Leader(peers) => {
                let mut state = self.shared.lock();
                state.done.insert(0, fingerprint);
                end_if_complete(&mut state, self.placement.world, peers);
                drop(state);
                self.shared.changed.notify_all();
            }
            Link::Member(stream) => send(stream, &format!("done {fingerprint:x}"))?,
        }
        self.wait(|s| s.ended.clone().map(|e| e.map_err(Error::Parallel)))
    }

    /// Runs `work` on a thread of its own and returns its result, or the error of another rank
    /// that failed first (the thread is then left to the process's end). An error of `work` is
    /// told to the other ranks, unless another rank's failure arrives within 2 s of it.
    pub fn run<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel::<Result<T>>();
        {
            let mut state = self.shared.lock();
            if let Some(message) = &state.aborted {
                return Err(Error::Parallel(message.clone()));
            }
            let stop = tx.clone();
            state.hook = Some(Box::new(move |m| {
                let _ = stop.send(Err(Error::Parallel(m)));
            }));
        }
        std::thread::Builder::new()
            .name("xtoken-run".into())
            .spawn(move || {
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
                    .unwrap_or_else(|_| Err(Error::Run("the training thread panicked".into())));
                let _ = tx.send(result);
            })?;
        let result = rx
            .recv()
            .unwrap_or_else(|_| Err(Error::Run("the training thread vanished".into())));
        self.shared.lock().hook = None;
        let e = match result {
            Ok(value) => return Ok(value),
            Err(e) => e,
        };
        // An exchange with a rank that died fails here a moment before the control channel
        // says which rank it was: that message is the better error.
        if let Some(message) = self.aborted_within(Duration::from_secs(2)) {
            return Err(Error::Parallel(message));
        }
        self.fail(&e.report());
        Err(e)
    }

    /// The abort's message, if one arrives within `grace`.
    fn aborted_within(&self, grace: Duration) -> Option<String> {
        let deadline = Instant::now() + grace;
        let mut state = self.shared.lock();
        while state.aborted.is_none() {
            let left = deadline.checked_duration_since(Instant::now())?;
            state = self
                .shared
                .changed
                .wait_timeout(state, left)
                .map(|(s, _)| s)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        state.aborted.clone()
    }

    fn wait<T>(&self, done: impl Fn(&State) -> Option<Result<T>>) -> Result<T> {
        let mut state = self.shared.lock();
        loop {
            if let Some(message) = &state.aborted {
                return Err(Error::Parallel(message.clone()));
            }
            if let Some(result) = done(&state) {
                return result;
            }
            state = self
                .shared
                .changed
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Starts the threads that read the control channel and send heartbeats.
    fn watch(&self) {
        let peer_timeout = self.timeouts.peer;
        let beat = (peer_timeout / 4).max(Duration::from_millis(200));
        match &self.link {
            Link::Leader(peers) => {
                let streams: Vec<_> = peers.iter().map(|(_, s)| s.clone()).collect();
                heartbeat(self.shared.clone(), streams, beat);
                let (shared, everyone) = (self.shared.clone(), peers.clone());
                watchdog(
                    shared,
                    everyone,
                    self.placement.world,
                    self.timeouts.exchange,
                );
                for (rank, stream) in peers {
                    let (shared, everyone) = (self.shared.clone(), peers.clone());
                    let (rank, world) = (*rank, self.placement.world);
                    spawn_reader(stream.clone(), peer_timeout, move |event| {
                        on_member_event(&shared, &everyone, world, rank, event)
                    });
                }
            }
            Link::Member(stream) => {
                heartbeat(self.shared.clone(), vec![stream.clone()], beat);
                let shared = self.shared.clone();
                let master = format!("{}:{}", self.placement.master, self.placement.port);
                spawn_reader(stream.clone(), peer_timeout, move |event| {
                    on_leader_event(&shared, &master, event)
                });
            }
        }
    }
}

/// Rank 0: listens, takes every other rank's hello, checks that they agree, and welcomes them.
fn lead(placement: &Placement, plan: Plan, timeouts: Timeouts) -> Result<Session> {
    let port = placement.port;
    let listener = TcpListener::bind(("0.0.0.0", port)).map_err(|e| {
        Error::Parallel(format!(
            "rank 0 cannot listen on port {port} (MASTER_PORT): {e}"
        ))
    })?;
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + timeouts.join;
    let mut joined: BTreeMap<usize, (TcpStream, SocketAddr)> = BTreeMap::new();
    while joined.len() + 1 < placement.world {
        match listener.accept() {
            Ok((stream, address)) => {
                let rank = take_hello(&stream, placement, plan).inspect_err(|e| {
                    let _ = (&stream)
                        .write_all(format!("refused {}\n", one_line(&e.to_string())).as_bytes());
                })?;
                if joined.contains_key(&rank) {
                    return Err(Error::Parallel(format!(
                        "two processes joined as rank {rank} (the second from {address})"
                    )));
                }
                joined.insert(rank, (stream, address));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    let missing: Vec<usize> = (1..placement.world)
                        .filter(|r| !joined.contains_key(r))
                        .collect();
                    return Err(Error::Parallel(format!(
                        "rank(s) {missing:?} did not join within {} s (rank 0 listens on port \
                         {port}; XTOKEN_JOIN_TIMEOUT_S sets the wait)",
                        timeouts.join.as_secs_f64()
                    )));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e.into()),
        }
    }
    let mut peers = Vec::new();
    for (rank, (stream, address)) in joined {
        (&stream).write_all(format!("welcome {}\n", address.ip()).as_bytes())?;
        peers.push((rank, Arc::new(Mutex::new(stream))));
    }
    Ok(Session {
        placement: placement.clone(),
        timeouts,
        host: placement.master.clone(),
        shared: Arc::default(),
        link: Link::Leader(peers),
    })
}

/// Reads one joining rank's hello and checks it against rank 0's own.
fn take_hello(stream: &TcpStream, placement: &Placement, plan: Plan) -> Result<usize> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let line = read_first_line(stream)?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let [_, rank, world, workers, hash] = words[..] else {
        return Err(Error::Parallel(format!(
            "a process connected to the rendezvous port {} without saying hello ({:?}): is \
             another program using MASTER_PORT?",
            placement.port,
            line.trim()
        )));
    };
    let number = |w: &str| w.parse::<usize>().unwrap_or(usize::MAX);
    let rank = number(rank);
    if number(world) != placement.world {
        return Err(Error::Parallel(format!(
            "rank {rank} was started for {world} processes, rank 0 for {}",
            placement.world
        )));
    }
    if number(workers) != plan.workers {
        return Err(Error::Parallel(format!(
            "rank {rank} runs {workers} workers (--devices), rank 0 runs {}: every process must \
             run as many",
            plan.workers
        )));
    }
    if u64::from_str_radix(hash, 16).ok() != Some(plan.hash) {
        return Err(Error::Parallel(format!(
            "rank {rank} was started with another configuration or other options (--resume, \
             --stop-after) than rank 0: every process must run the same"
        )));
    }
    if rank == 0 || rank >= placement.world {
        return Err(Error::Parallel(format!(
            "a process joined as rank {rank}: ranks 1 to {} were expected",
            placement.world - 1
        )));
    }
    stream.set_read_timeout(None)?;
    Ok(rank)
}

/// Every other rank: connects to rank 0 (retrying until the join timeout) and says hello.
fn member(placement: &Placement, plan: Plan, timeouts: Timeouts) -> Result<Session> {
    let master = format!("{}:{}", placement.master, placement.port);
    let deadline = Instant::now() + timeouts.join;
    let stream = loop {
        let attempt = master
            .to_socket_addrs()
            .and_then(|mut a| a.next().ok_or_else(|| ErrorKind::NotFound.into()))
            .and_then(|a| TcpStream::connect_timeout(&a, Duration::from_secs(5)));
        match attempt {
            Ok(stream) => break stream,
            Err(e) if Instant::now() > deadline => {
                return Err(Error::Parallel(format!(
                    "rank {}: rank 0 at {master} (MASTER_ADDR:MASTER_PORT) did not answer within \
                     {} s: {e}",
                    placement.rank,
                    timeouts.join.as_secs_f64()
                )))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    let hello = format!(
        "hello {} {} {} {:x}\n",
        placement.rank, placement.world, plan.workers, plan.hash
    );
    (&stream).write_all(hello.as_bytes())?;
    stream.set_read_timeout(Some(timeouts.join))?;
    let line = read_first_line(&stream)?;
    stream.set_read_timeout(None)?;
    let host = match line.trim().split_once(' ') {
        Some(("welcome", host)) => host.to_string(),
        Some(("refused", why)) => {
            return Err(Error::Parallel(format!(
                "rank 0 refused rank {}: {why}",
                placement.rank
            )))
        }
        _ => {
            return Err(Error::Parallel(format!(
                "rank {}: rank 0 at {master} closed the rendezvous without welcoming it",
                placement.rank
            )))
        }
    };
    Ok(Session {
        placement: placement.clone(),
        timeouts,
        host,
        shared: Arc::default(),
        link: Link::Member(Arc::new(Mutex::new(stream))),
    })
}

/// The first line on a connection, read a byte at a time: a buffered reader would also take
/// what the other side sent right behind it (rank 0's first `share` follows its `welcome` at
/// once), and drop it with the buffer, before the connection's own reader thread starts.
fn read_first_line(stream: &TcpStream) -> Result<String> {
    const LONGEST: usize = 4096;
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.len() < LONGEST {
        match (&*stream).read(&mut byte) {
            Ok(0) => break,
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) => line.push(byte[0]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}

/// What a reader thread saw on a control connection.
enum Event {
    Line(String),
    /// The connection closed or failed.
    Closed,
    /// Nothing arrived for the peer timeout.
    Silent(Duration),
}

/// Reads `stream` line by line on a thread, until `on` returns false.
fn spawn_reader(
    stream: Arc<Mutex<TcpStream>>,
    timeout: Duration,
    mut on: impl FnMut(Event) -> bool + Send + 'static,
) {
    let reading = stream
        .lock()
        .ok()
        .and_then(|s| s.try_clone().ok())
        .filter(|s| s.set_read_timeout(Some(timeout)).is_ok());
    let _ = std::thread::Builder::new()
        .name("xtoken-control".into())
        .spawn(move || {
            let Some(reading) = reading else {
                on(Event::Closed);
                return;
            };
            let mut reader = BufReader::new(reading);
            loop {
                let mut line = String::new();
                let event = match reader.read_line(&mut line) {
                    Ok(0) => Event::Closed,
                    Ok(_) => Event::Line(line.trim_end().to_string()),
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                        Event::Silent(timeout)
                    }
                    Err(_) => Event::Closed,
                };
                let last = !matches!(event, Event::Line(_));
                if !on(event) || last {
                    return;
                }
            }
        });
}

/// Sends `beat` on every stream until the run ends or stops.
fn heartbeat(shared: Arc<Shared>, streams: Vec<Arc<Mutex<TcpStream>>>, every: Duration) {
    let _ = std::thread::Builder::new()
        .name("xtoken-heartbeat".into())
        .spawn(move || loop {
            std::thread::sleep(every);
            {
                let state = shared.lock();
                if state.ended.is_some() || state.aborted.is_some() {
                    return;
                }
            }
            for stream in &streams {
                let _ = send(stream, "beat");
            }
        });
}

/// Rank 0's handling of what a member sent; false ends its reader.
fn on_member_event(
    shared: &Shared,
    peers: &[Peer],
    world: usize,
    rank: usize,
    event: Event,
) -> bool {
    let lost = |why: String| {
        {
            let state = shared.lock();
            if state.done.contains_key(&rank) || state.aborted.is_some() {
                return;
            }
        }
        let text = format!("rank {rank} {why}");
        broadcast(peers, &format!("abort {text}"), Some(rank));
        abort(shared, text);
    };
    match event {
        Event::Closed => lost("exited or lost its connection to rank 0".into()),
        Event::Silent(t) => lost(format!("sent nothing for {} s", t.as_secs_f64())),
        Event::Line(line) => {
            let (word, rest) = line.split_once(' ').unwrap_or((&line, ""));
            match word {
                "ready" => {
                    let mut state = shared.lock();
                    state.ready.entry(rest.into()).or_default().insert(rank);
                    release_if_complete(&mut state, rest, world, peers);
                    drop(state);
                    shared.changed.notify_all();
                }
                "failed" => lost(format!("failed: {rest}")),
                "at" => record(&mut shared.lock(), rank, rest.parse().unwrap_or(0)),
                "done" => {
                    let mut state = shared.lock();
                    state
                        .done
                        .insert(rank, u64::from_str_radix(rest, 16).unwrap_or(0));
                    end_if_complete(&mut state, world, peers);
                    drop(state);
                    shared.changed.notify_all();
                }
                _ => {}
            }
        }
    }
    true
}

/// A member's handling of what rank 0 sent; false ends its reader.
fn on_leader_event(shared: &Shared, master: &str, event: Event) -> bool {
    let ended = || shared.lock().ended.is_some();
    match event {
        Event::Closed if !ended() => abort(
            shared,
            format!("rank 0 ({master}) exited or lost its connection"),
        ),
        Event::Silent(t) if !ended() => abort(
            shared,
            format!("rank 0 ({master}) sent nothing for {} s", t.as_secs_f64()),
        ),
        Event::Closed | Event::Silent(_) => return false,
        Event::Line(line) => {
            let (word, rest) = line.split_once(' ').unwrap_or((&line, ""));
            let mut state = shared.lock();
            match word {
                "go" => {
                    state.released.insert(rest.into());
                }
                "share" => {
                    if let Some((name, value)) = rest.split_once(' ') {
                        state.values.insert(name.into(), value.into());
                    }
                }
                "end" if rest == "ok" => state.ended = Some(Ok(())),
                "end" => state.ended = Some(Err(rest.into())),
                "abort" => {
                    drop(state);
                    abort(shared, rest.into());
                    return false;
                }
                _ => {}
            }
            drop(state);
            shared.changed.notify_all();
        }
    }
    true
}

/// Rank 0: releases the barrier `name` when every rank has reached it.
fn release_if_complete(state: &mut State, name: &str, world: usize, peers: &[Peer]) {
    if state.ready.get(name).is_some_and(|r| r.len() == world) {
        state.ready.remove(name);
        state.released.insert(name.into());
        broadcast(peers, &format!("go {name}"), None);
    }
}

/// Rank 0: ends the run when every rank is done, comparing their fingerprints.
fn end_if_complete(state: &mut State, world: usize, peers: &[Peer]) {
    if state.done.len() < world || state.ended.is_some() {
        return;
    }
    let first = state.done.get(&0).copied();
    let ended = if state.done.values().all(|f| Some(*f) == first) {
        Ok(())
    } else {
        let each: Vec<String> = state
            .done
            .iter()
            .map(|(r, f)| format!("rank {r}: {f:016x}"))
            .collect();
        Err(format!(
            "the processes' parameters diverged (fingerprints {})",
            each.join(", ")
        ))
    };
    let line = match &ended {
        Ok(()) => "end ok".to_string(),
        Err(why) => format!("end {why}"),
    };
    state.ended = Some(ended);
    broadcast(peers, &line, None);
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::{Placement, Plan, Session, Timeouts};
    use std::time::{Duration, Instant};

    /// Rank `rank` of a run of two processes on this machine, rank 0 listening on `port`.
    fn of_two(rank: usize, port: u16) -> Placement {
        Placement {
            rank,
            world: 2,
            local_rank: rank,
            master: "127.0.0.1".into(),
            port,
            launcher: "torchrun",
        }
    }

    /// Join and peer timeouts long enough for a loaded machine, and the exchange timeout given.
    fn with_exchange(exchange: Duration) -> Timeouts {
        Timeouts {
            join: Duration::from_secs(20),
            peer: Duration::from_secs(20),
            exchange,
        }
    }

    /// Rank 0 may send its first `share` in the same segment as its `welcome`: a member reads
    /// the value all the same (a buffered read of the welcome once dropped it, and the member
    /// waited for it for ever).
    #[test]
    fn a_value_sent_right_behind_the_welcome_reaches_the_member() {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (finished, keep_open) = std::sync::mpsc::channel::<()>();
        let leader = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut hello = String::new();
            BufReader::new(&stream).read_line(&mut hello).unwrap();
            (&stream)
                .write_all(b"welcome 127.0.0.1\nshare nccl-id 0123abcd\n")
                .unwrap();
            let _ = keep_open.recv_timeout(Duration::from_secs(10));
            hello
        });
        let plan = Plan {
            workers: 1,
            hash: 7,
        };
        let timeouts = with_exchange(Duration::from_secs(20));
        let member = Session::join(&of_two(1, port), plan, timeouts).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(member.share("nccl-id", || unreachable!("rank 1 makes nothing")));
        });
        let value = rx.recv_timeout(Duration::from_secs(4));
        assert_eq!(value.expect("the value never arrived").unwrap(), "0123abcd");
        finished.send(()).unwrap();
        assert_eq!(leader.join().unwrap(), "hello 1 2 1 7\n");
    }

    /// Two sessions in one process: rank 0 enters a second all-reduce that rank 1 never does.
    #[test]
    fn a_rank_behind_an_all_reduce_is_named_after_the_exchange_timeout() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let placement = move |rank| of_two(rank, port);
        let timeouts = with_exchange(Duration::from_millis(400));
        let plan = Plan {
            workers: 1,
            hash: 9,
        };
        let member = std::thread::spawn(move || Session::join(&placement(1), plan, timeouts));
        let leader = Session::join(&placement(0), plan, timeouts).unwrap();
        let member = member.join().unwrap().unwrap();
        let (ahead, behind) = (leader.exchange_logs(1), member.exchange_logs(1));
        let start = Instant::now();
        ahead[0].entered();
        behind[0].entered();
        ahead[0].entered();
        // Each waits at a barrier of its own, which only the abort ends.
        let waiting = std::thread::spawn(move || member.barrier("b").unwrap_err().to_string());
        let at_leader = leader.barrier("a").unwrap_err().to_string();
        let at_member = waiting.join().unwrap();
        assert!(start.elapsed() >= Duration::from_millis(400));
        for message in [at_leader, at_member] {
            assert!(
                message.starts_with("rank(s) [1] did not reach all-reduce 2, which rank 0 entered"),
                "{message}"
            );
        }
    }
}
